"""A run directory: what a run leaves behind and what it resumes from.

    config.yaml          the resolved config the run was started with
    metrics.jsonl        one JSON line per step and per evaluation (atgrpo.contract.run)
    state.json           last completed step and pool versions, the last checkpoint and every
                         checkpoint still on disk
    checkpoints/step-N/  one folder per trainable pool (HF / PEFT format plus trainer state)
    samples/, eval-samples/  step-000001.jsonl, ...: each step's samples, one JSON line each
                         (run.save_samples / run.save_eval_samples; docs/environments.md)

state.json is replaced atomically after each step, so a crash leaves either the old or the new.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from atgrpo.config import RunConfig, dump_config
from atgrpo.contract.rollout import Sample


@dataclass
class Checkpoint:
    step: int
    paths: dict[str, str]  # pool -> checkpoint folder
    versions: dict[str, int]  # pool -> version saved there
    success: float | None = None  # eval success rate at this step, when it was evaluated
    nbytes: dict[str, int] = field(default_factory=dict)  # pool -> about its size (deadlines)


@dataclass
class Progress:
    run: str
    completed_step: int = 0
    versions: dict[str, int] = field(default_factory=dict)  # pool versions after completed_step
    checkpoint: Checkpoint | None = None  # the last: what a resume loads
    checkpoints: list[Checkpoint] = field(default_factory=list)  # every one on disk, oldest first


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    def checkpoint_dir(self, step: int) -> Path:
        return self.path / "checkpoints" / f"step-{step:06d}"

    def write_config(self, cfg: RunConfig) -> None:
        """The run's config without its services: addresses. They belong to the deployment that ran
        it (for a local run, ports of processes long gone), and `atgrpo eval RUN_DIR/config.yaml`
        must start fresh services rather than wait on dead ones."""
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / "config.yaml", dump_config(cfg, services=False))

    def read_progress(self) -> Progress | None:
        path = self.path / "state.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        ckpt = data.pop("checkpoint", None)
        last = Checkpoint(**ckpt) if ckpt else None
        on_disk = [Checkpoint(**c) for c in data.pop("checkpoints")]
        return Progress(**data, checkpoint=last, checkpoints=on_disk)

    def write_progress(self, p: Progress) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / "state.json", json.dumps(asdict(p), indent=2))

    def append_event(self, event: dict[str, Any]) -> None:
        # An evaluation run against services already running writes here first: nothing made it.
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_samples(
        self,
        step: int,
        samples: Sequence[Sample],
        rewards: Sequence[float],
        advantages: Sequence[float | None],
        pool_of: Mapping[str, str],
        folder: str = "samples",
    ) -> Path:
        """Every sample of a step with its reward, advantage and pool, for inspection and tests
        (`folder` eval-samples: an evaluation's, with no advantage)."""
        out = self.path / folder / f"step-{step:06d}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for s, r, a in zip(samples, rewards, advantages, strict=True):
            lines.append(
                json.dumps(
                    {
                        "task_id": s.task_id,
                        "episode": s.episode,
                        "agent": s.agent,
                        "turn": s.turn,
                        "branch": s.branch,
                        "pool": pool_of[s.agent],
                        "policy": {
                            "pool": s.policy.pool,
                            "adapter": s.policy.adapter,
                            "version": s.policy.version,
                        },
                        "team_reward": s.team_reward,
                        "local_reward": s.local_reward,
                        "reward": r,
                        "advantage": a,
                        "selected": s.selected,
                        "done": s.done,
                        "success": s.success,
                        "prompt_text": s.prompt_text,
                        "prompt_ids": s.prompt_ids,
                        "response_ids": s.response_ids,
                        "response_text": s.response_text,
                        "logprobs": s.logprobs,
                        "info": s.info,
                    }
                )
            )
        _atomic_write(out, "".join(line + "\n" for line in lines))
        return out

    def read_events(self) -> list[dict[str, Any]]:
        return read_metrics(self.metrics)

    def truncate_events(self, after_step: int) -> list[dict[str, Any]]:
        """Drop the events of steps after `after_step` (a resumed run redoes them); return the rest.

        Each step is then recorded exactly once, however often the run was interrupted."""
        keep = [e for e in self.read_events() if e["step"] <= after_step]
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.metrics, "".join(json.dumps(e) + "\n" for e in keep))
        return keep


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Events from a metrics.jsonl; a torn last line (a crash mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
