"""What `atgrpo train` shows and leaves: a progress bar, one line per step and evaluation,
TensorBoard scalars and a PNG of the reward and success curves (`atgrpo plot` redraws it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from atgrpo.config import RunConfig
from atgrpo.contract.run import FINAL_STATES, STEP_TIMING
from atgrpo.rundir import RunDir, read_metrics

PLOT_FILE = "curves.png"


def step_line(e: dict[str, Any], total: int, timing: bool = False) -> str:
    """`timing` (`atgrpo train --timing`): the step's time breakdown appended (timing_line)."""
    agents = "  ".join(f"{a} {m['reward_mean']:+.3f}" for a, m in e["agents"].items())
    pools = "  ".join(
        f"{p} v{int(m['version'])} loss {m['loss']:+.4f} kl {m['approx_kl']:.4f}"
        for p, m in e["pools"].items()
    )
    secs = (
        e.get("rollout_seconds", 0.0)
        + e.get("train_seconds", 0.0)
        + e.get("weight_sync_seconds", 0.0)
    )
    # A prompt cut to max_prompt_tokens lost its beginning: the agent acted on part of what it saw.
    cut = "  ".join(
        f"{a} {m['prompt_truncated_fraction']:.0%}"
        for a, m in e["agents"].items()
        if m.get("prompt_truncated_fraction")
    )
    line = (
        f"step {e['step']:>4}/{total}  success {e['success_rate']:.2f}  reward "
        f"{e['reward_mean']:+.3f} "
        f"| {agents} | {pools} | {secs:.1f}s" + (f" | prompts cut: {cut}" if cut else "")
    )
    breakdown = timing_line(e) if timing else ""
    return f"{line} | {breakdown}" if breakdown else line


def _s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds < 1 else f"{seconds:.1f}"


def _mm(e: dict[str, Any], key: str) -> str:
    """The share of the measured matmul rate, when one was measured."""
    if key not in e:
        return ""
    share = e[key]
    return f"{share:.0%} mm" if share >= 0.1 else f"{share:.1%} mm"


def timing_line(e: dict[str, Any]) -> str:
    """A step's time compactly: generation (prefill, decode, share of the matmul rate), env and
    waiting, then the update (forward, backward, optimizer, share of the matmul rate) and the weight
    push, e.g. `gen 12.3s (prefill 1.2 decode 11.1, 58% mm) env 0.8s wait 0.3s | update fwd 10.1
    bwd 18.2 opt 0.4 (61% mm) push 1.1s`. "" for a step recorded without a breakdown."""
    if "time_prefill_s" not in e:
        return ""
    prefill, decode = e["time_prefill_s"], e["time_decode_s"]
    mm = _mm(e, "gen_mfu")
    gen = (
        f"gen {_s(prefill + decode)}s (prefill {_s(prefill)} decode "
        f"{_s(decode)}{', ' + mm if mm else ''}) env {_s(e['time_env_s'])}s wait "
        f"{_s(e['time_wait_s'])}s"
    )
    mm = _mm(e, "update_mfu")
    update = (
        f"update fwd {_s(e.get('time_forward_s', 0.0))} bwd {_s(e.get('time_backward_s', 0.0))} "
        f"opt {_s(e.get('time_optimizer_s', 0.0))}{' (' + mm + ')' if mm else ''} "
        f"push {_s(e.get('weight_sync_seconds', 0.0))}s"
    )
    return f"{gen} | {update}"


def eval_line(e: dict[str, Any]) -> str:
    # An eval agent's reward_mean is its return: the sum over the episode's turns, where a step
    # line's is the mean per sample; the label says which.
    agents = "  ".join(f"{a} {m['reward_mean']:+.3f}" for a, m in e["agents"].items())
    failed = f" ({e['failed_episodes']} more ended in an error)" if e.get("failed_episodes") else ""
    return (
        f"eval @ step {e['step']:>4}  success {e['success_rate']:.3f} over {e['episodes']} "
        f"episodes{failed} | return per episode: {agents}"
    )


def rollback_line(e: dict[str, Any]) -> str:
    to = (
        "the starting weights: no checkpoint yet"
        if e["checkpoint"] == "start"
        else f"checkpoint {e['checkpoint']}"
    )
    return (
        f"rolled back from step {e['from_step']} to step {e['to_step']} ({to}): "
        f"{e['reason']}; steps {e['to_step'] + 1}-{e['from_step']} are trained again"
    )


def tensorboard_scalars(e: dict[str, Any]) -> dict[str, float]:
    """TensorBoard tag -> value for one event (train/..., eval/..., per agent and per pool)."""
    prefix = e["kind"] if e["kind"] == "eval" else "train"
    out = {f"{prefix}/success_rate": e["success_rate"]}
    if "reward_mean" in e:
        out[f"{prefix}/reward_mean"] = e["reward_mean"]
    for a, m in e["agents"].items():
        out.update({f"{prefix}/agent/{a}/{k}": float(v) for k, v in m.items()})
    for p, m in e.get("pools", {}).items():
        out.update({f"pool/{p}/{k}": float(v) for k, v in m.items() if isinstance(v, int | float)})
        for group in ("memory", "mismatch"):
            out.update({f"pool/{p}/{group}/{k}": float(v) for k, v in m.get(group, {}).items()})
    for k in ("rollout_seconds", "train_seconds", "weight_sync_seconds"):
        if k in e:
            out[f"time/{k}"] = e[k]
    # The step's breakdown: seconds under time/ (time/prefill_s ...), tokens and rates under perf/.
    for k in STEP_TIMING:
        if k in e:
            out[f"time/{k.removeprefix('time_')}" if k.startswith("time_") else f"perf/{k}"] = (
                float(e[k])
            )
    return out


def plot(events: list[dict[str, Any]], out: Path) -> Path:
    """Success (sampled during training, greedy at evaluation) and each agent's reward, per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e for e in events if e["kind"] == "step"]
    evals = [e for e in events if e["kind"] == "eval"]
    fig, (ax_s, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
    ax_s.plot(
        [e["step"] for e in steps],
        [e["success_rate"] for e in steps],
        label="train (tree: best of K per turn)",
        alpha=0.6,
    )
    if evals:
        ax_s.plot(
            [e["step"] for e in evals], [e["success_rate"] for e in evals], "o-", label="eval"
        )
    ax_s.set(title="success rate", xlabel="step", ylim=(-0.02, 1.02))
    ax_s.legend(loc="lower right")
    for agent in dict.fromkeys(a for e in steps for a in e["agents"]):
        pts = [
            (e["step"], e["agents"][agent]["reward_mean"]) for e in steps if agent in e["agents"]
        ]
        ax_r.plot([s for s, _ in pts], [r for _, r in pts], label=agent)
    ax_r.set(title="mean reward per agent (alpha*team + local)", xlabel="step")
    if steps:
        ax_r.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_run(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    events = read_metrics(run_dir / "metrics.jsonl")
    if not events:
        raise FileNotFoundError(
            f"{run_dir / 'metrics.jsonl'} holds no events: is {run_dir} a run directory?"
        )
    return plot(events, run_dir / PLOT_FILE)


class Reporter:
    """Receives the run's events. `mirror` also appends them to the local metrics.jsonl, for a run
    whose router writes its own run directory on another machine. `timing`: each step's line ends
    with where its time went (`atgrpo train --timing`)."""

    def __init__(self, cfg: RunConfig, *, mirror: bool, timing: bool = False):
        self.cfg = cfg
        self.dir = RunDir(cfg.run.run_dir)
        self.mirror = mirror
        self.timing = timing
        self.events: list[dict[str, Any]] = []
        self.bar = None
        self.tb = None

    def start(self, status: dict[str, Any]) -> None:
        from tensorboardX import SummaryWriter
        from tqdm import tqdm

        self.dir.path.mkdir(parents=True, exist_ok=True)
        # The router of this run writes metrics.jsonl itself when it shares this filesystem.
        if self.mirror and Path(status["run_dir"]) == self.dir.path.resolve():
            self.mirror = False
        if self.mirror:
            self.dir.truncate_events(-1)
        self._writer = SummaryWriter
        self.bar = tqdm(
            total=self.cfg.run.steps,
            desc=self.cfg.run.name,
            unit="step",
            file=sys.stderr,
            disable=not sys.stderr.isatty(),
            dynamic_ncols=True,
        )
        print(
            f"run {status['run_id']}: {self.cfg.level}, {len(self.cfg.agents)} agents on "
            f"{len(self.cfg.pools)} pool(s), {self.cfg.run.steps} steps; run directory "
            f"{status['run_dir']}",
            flush=True,
        )

    def on_event(self, e: dict[str, Any]) -> None:
        if e["kind"] == "status":
            self._status(e)
            return
        if e["kind"] == "rollback":
            self._rollback(e)
            return
        self.events.append(e)
        if self.mirror:
            self.dir.append_event(e)
        if self.tb is None:
            # The run's events come from its first one, so what an earlier `atgrpo train` of this
            # run directory wrote from that step on is replaced, not doubled.
            self._open_tb(purge_step=e["step"])
        for tag, value in tensorboard_scalars(e).items():
            self.tb.add_scalar(tag, value, e["step"])
        self.tb.flush()
        if e["kind"] == "step":
            self.bar.n = e["step"]
            self.bar.set_postfix(
                success=f"{e['success_rate']:.2f}", reward=f"{e['reward_mean']:+.3f}"
            )
            self._write(step_line(e, self.cfg.run.steps, self.timing))
        else:
            self._write(eval_line(e))
            self._plot()

    def _rollback(self, e: dict[str, Any]) -> None:
        """The steps after e["to_step"] are done again: drop them from the curves, the mirrored
        metrics.jsonl and TensorBoard (a writer reopened with purge_step hides every event at or
        after it written before), then say so on the console, with why."""
        keep = e["to_step"]
        self.events = [x for x in self.events if x["step"] <= keep]
        if self.mirror:
            self.dir.truncate_events(keep)
            self.dir.append_event(e)
        self._open_tb(purge_step=keep + 1)
        self.bar.n = keep
        self.bar.refresh()
        self._write(rollback_line(e))

    def _open_tb(self, purge_step: int) -> None:
        if self.tb is not None:
            self.tb.close()
        tb = self.dir.path / "tb"
        # A new file per writer, ordered after the others: an event file's name holds only the
        # second it was made, and a writer opened within the same second would overwrite it.
        n = len(list(tb.glob("events.out.tfevents.*"))) if tb.is_dir() else 0
        self.tb = self._writer(str(tb), purge_step=purge_step, filename_suffix=f".{n:04d}")

    def _status(self, e: dict[str, Any]) -> None:
        if e["state"] == "running" and e["resumed_from_step"]:
            self._write(f"resumed after step {e['resumed_from_step']}")
        if e["state"] not in FINAL_STATES:
            return
        self._plot()
        self.bar.close()
        if self.tb is not None:
            self.tb.close()
        what = f"run {e['state']} after step {e['step']}/{e['total_steps']}"
        drawn = f"; curves in {self.dir.path / PLOT_FILE}" if self._plotted else ""
        print(what + (f": {e['error']}" if e["error"] else "") + drawn, flush=True)

    @property
    def _plotted(self) -> bool:
        return any(e["kind"] == "step" for e in self.events)

    def _plot(self) -> None:
        if self._plotted:
            plot(self.events, self.dir.path / PLOT_FILE)

    def _write(self, line: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line)
        else:
            print(line, flush=True)


def add_command(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser(
        "plot", help="redraw a run's reward and success curves (RUN_DIR/curves.png)"
    )
    pl.add_argument("run_dir", type=Path)
    pl.set_defaults(fn=_cmd_plot)


def _cmd_plot(args: argparse.Namespace) -> int:
    try:
        print(plot_run(args.run_dir))
    except FileNotFoundError as err:
        print(f"atgrpo plot: {err}", file=sys.stderr)
        return 1
    return 0
