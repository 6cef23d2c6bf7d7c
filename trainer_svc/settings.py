"""The trainer service's settings: which pool it owns, its micro-batch budget, its layout over
ranks and how long its ranks wait for each other."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from atgrpo.rpc.main import SettingsError
from trainer_svc.distributed import DEFAULT_COLLECTIVE_TIMEOUT_S, TIMEOUT_ENV, check_timeout
from trainer_svc.sharding import SHARDINGS, resolve
from trainer_svc.update_context import DEFAULT_MICRO_BATCH_TOKENS


@dataclass(frozen=True)
class TrainerSettings:
    pool: str = ""
    # the default; a run's Setup may set its own budget
    micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS
    sharding: str = "auto"
    # a pool over several ranks: how long a rank waits for the others inside an operation
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S

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
            help="layout over torchrun ranks: fsdp shards a full fine-tuning model over all ranks, "
            "hsdp within each node and replicated across nodes, ddp replicates it; auto = hsdp "
            "for full fine-tuning past one node, else fsdp; ddp for LoRA pools (one rank: none)",
        )
        ap.add_argument(
            "--collective-timeout-s",
            type=float,
            default=os.environ.get(TIMEOUT_ENV, str(DEFAULT_COLLECTIVE_TIMEOUT_S)),
            help="torchrun ranks: how long one waits for the others inside a pool operation (a "
            "training collective, rank 0 reading the model or writing a checkpoint) before the "
            f"pool fails and restarts from its last checkpoint (default "
            f"{DEFAULT_COLLECTIVE_TIMEOUT_S:.0f}; docs/deploy.md, 'When a trainer rank fails')",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainerSettings:
        if args.micro_batch_tokens < 1:
            raise SettingsError(
                f"--micro-batch-tokens {args.micro_batch_tokens}: give the tokens of one "
                f"forward/backward (>= the longest sample; {DEFAULT_MICRO_BATCH_TOKENS} by default)"
            )
        try:
            timeout_s = check_timeout(args.collective_timeout_s)
        except ValueError as err:
            raise SettingsError(str(err)) from None
        try:  # a forced hsdp on nodes of unequal sizes: refused before any rank joins
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
            resolve(args.sharding, world_size, lora=False)
        except ValueError as err:
            raise SettingsError(str(err)) from None
        return cls(args.pool, args.micro_batch_tokens, args.sharding, timeout_s)
