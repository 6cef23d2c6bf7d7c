"""The learning benches' warm start (issue 56): for a task SmolLM2 starts at 0 on, the base model
fine-tuned on its env's own demonstrations, once, and every variant of the task trains from it,
so the comparison stays fair. What a user runs by hand:

    atgrpo model demos --config run.yaml --episodes 200 --out demos.jsonl --sandbox local
    atgrpo model teach --base SmolLM2 --demos demos.jsonl --epochs 1 --bf16 --out warm

Here the same through the library: a sandbox service of its own, the train split's episodes (the
evaluation's tasks are another split), the episodes that succeed kept. The model, the
demonstrations and what it took go to WORK/warm-TASK/ and are reused by the next cell."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

EPOCHS, LR = 1, 1e-5


def warm_model(config: dict[str, Any], base: str, out: Path, episodes: int) -> dict[str, Any]:
    """Fine-tune `base` on demonstrations of `config`'s env (its options, its team) into
    out/model, once; what it took (out/warm_start.json), with "model" its folder."""
    record = out / "warm_start.json"
    if record.exists():
        return json.loads(record.read_text())
    from atgrpo.models.sft import sft
    from atgrpo.sdk import demos

    env = config["env"]
    rows, played = _play(env["name"], env["options"], episodes)
    if not rows:
        raise RuntimeError(f"no {env['name']} episode of {episodes} succeeded: no warm start")
    demos.write(rows, out / "demos.jsonl")
    # bf16 autocast, as the pools train: this CPU's bf16 matmuls are ~2.5x its float32 ones
    stats = sft(base, out / "model", rows, epochs=EPOCHS, lr=LR, bf16=True)
    done = {
        "model": str(out / "model"),
        "base": base,
        "demos": asdict(played),
        "sft": asdict(stats),
        "epochs": EPOCHS,
        "lr": LR,
    }
    record.write_text(json.dumps(done, indent=1) + "\n")
    return done


def _play(name: str, options: dict[str, Any], episodes: int):
    from atgrpo.cli.teach import sandbox_at
    from atgrpo.sdk import demos
    from atgrpo.sdk.host import EnvHost
    from atgrpo.sdk.registry import Registry
    from sandbox_svc.client import SandboxClient

    async def played(address: str):
        async with SandboxClient(address) as client:
            host = EnvHost(Registry(), sandbox=client)
            return await demos.play(host, name, options, episodes)

    with sandbox_at("local") as address:
        return asyncio.run(played(address))
