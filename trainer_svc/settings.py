"""The trainer service's settings: which pool it owns, its micro-batch budget, its layout over
ranks."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from atgrpo.rpc.main import SettingsError
from trainer_svc.sharding import SHARDINGS
from trainer_svc.update_context import DEFAULT_MICRO_BATCH_TOKENS


@dataclass(frozen=True)
class TrainerSettings:
    pool: str = ""
    # the default; a run's Setup may set its own budget
    micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS
    sharding: str = "auto"

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--pool", default="", help="the model pool this trainer owns")
        ap.add_argument(
            "--micro-batch-tokens",
            type=int,
            default=DEFAULT_MICRO_BATCH_TOKENS,
            help="token budget of one forward/backward micro-batch",
        )
        ap.add_argument(
            "--sharding",
            choices=SHARDINGS,
            default=os.environ.get("ATGRPO_TRAINER_SHARDING", "auto"),
            help="layout over torchrun ranks: fsdp shards a full fine-tuning model, ddp replicates "
            "it; auto = fsdp for full fine-tuning, ddp for LoRA pools (one rank: no sharding)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainerSettings:
        if args.micro_batch_tokens < 1:
            raise SettingsError(
                f"--micro-batch-tokens {args.micro_batch_tokens}: give the tokens of one "
                f"forward/backward (>= the longest sample; {DEFAULT_MICRO_BATCH_TOKENS} by default)"
            )
        return cls(args.pool, args.micro_batch_tokens, args.sharding)
