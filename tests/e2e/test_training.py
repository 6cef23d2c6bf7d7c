"""Training end to end: the five services as real processes, the tiny model, real updates.

Each test starts the services a config needs (atgrpo.cli.runner.LocalServices), drives the router
over gRPC as `atgrpo train` does, and checks what the run left: the step's samples as the router
grouped them, the metrics, the checkpoints, and the versions the rollout replicas serve.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from atgrpo.cli.runner import LocalServices, drive, run_until
from atgrpo.config import parse_config
from atgrpo.discovery import listed_now
from atgrpo.models.taught import TOY_CODE
from atgrpo.rundir import read_metrics
from rollout_svc.client import RolloutClient
from router_svc.client import RouterClient

pytestmark = pytest.mark.slow

K = 4


class Collect:
    """A reporter that keeps the events (drive() reports to it as the CLI's Reporter would)."""

    def __init__(self):
        self.status, self.events = None, []

    def start(self, status):
        self.status = status

    def on_event(self, event):
        self.events.append(event)


def toy_config(run_dir: Path, model: str, level: str, *, steps: int = 2, **run) -> dict:
    agents = ["speaker"] if level == "L0" else ["speaker", "listener"]
    pools = {
        "a": {
            "model_path": model,
            "device": "cpu",
            "dtype": "float32",
            "optim": {"lr": 5e-4, "warmup_steps": 0},
        }
    }
    if level == "L2":
        pools["a"].update(specialization="lora", optim={"lr": 3e-3, "warmup_steps": 0})
    if level == "L3":
        pools["b"] = dict(pools["a"])
    pool_of = {"speaker": "a", "listener": "b" if level == "L3" else "a"}
    sampling = {"temperature": 1.0, "max_tokens": 4}
    return {
        "run": {
            "name": f"e2e-{level.lower()}",
            "seed": 0,
            "steps": steps,
            "tasks_per_step": 4,
            "eval_every_steps": 0,
            "eval_tasks": 4,
            "checkpoint_every_steps": 0,
            "save_samples": True,
            "run_dir": str(run_dir),
            **run,
        },
        "env": {"name": "toy", "turn_order": agents, "max_turns": 2},
        "pools": pools,
        "agents": {
            a: {"pool": pool_of[a], "train_sampling": sampling, "eval_sampling": {"max_tokens": 4}}
            for a in agents
        },
        "algorithm": {"k": K, "mini_batch_size": 64},
    }


async def served_versions(cfg) -> dict[tuple[str, str], int]:
    out = {}
    for targets in cfg.services.rollout.values():
        for address in listed_now(targets):
            async with RolloutClient(address) as client:
                out.update({(p.pool, p.adapter): p.version for p in await client.policies()})
    return out


def train_locally(data: dict) -> tuple[Collect, dict]:
    """Run to the end; returns the events and what the replicas serve before they stop."""
    cfg = parse_config(data)
    sink = Collect()
    with LocalServices(cfg) as running:
        final = asyncio.run(drive(running, sink))
        served = asyncio.run(served_versions(running))
    assert final["state"] == "finished", final
    return sink, served


@pytest.mark.parametrize("level", ["L0", "L1", "L2", "L3"])
def test_a_few_steps_at_each_level(level, tiny_model, tmp_path, capsys):
    from transformers import AutoTokenizer

    from atgrpo.cli import main

    tok = AutoTokenizer.from_pretrained(tiny_model)
    data = toy_config(tmp_path / "run", tiny_model, level)
    cfg = parse_config(data)
    sink, served = train_locally(data)
    assert cfg.level == level

    steps = [e for e in sink.events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    pools = {a: cfg.agents[a].pool for a in cfg.env.turn_order}
    for e in steps:
        for pool, m in e["pools"].items():
            assert m["version"] == e["step"]  # every pool advanced once per step
            # only its agents' samples
            assert set(m["agents"]) <= {a for a, p in pools.items() if p == pool}
        for step_file in [tmp_path / "run" / "samples" / f"step-{e['step']:06d}.jsonl"]:
            samples = [json.loads(line) for line in step_file.read_text().splitlines()]
            groups = defaultdict(list)
            for s in samples:
                groups[(s["task_id"], s["agent"], s["turn"])].append(s)
                # the text the env judged is kept with the sample: the symbol it found is in it
                assert s["info"]["symbol"] is None or s["info"]["symbol"] in s["response_text"]
                assert s["pool"] == pools[s["agent"]] == s["policy"]["pool"]
                assert s["policy"]["version"] == e["step"] - 1  # drawn from the weights before it
                # what the agent saw, as text beside the ids: the ids decoded, its prompt in it
                assert s["prompt_text"] == tok.decode(s["prompt_ids"], skip_special_tokens=False)
                assert f"{s['agent']}:" in s["prompt_text"]
            assert groups and all(len(g) == K for g in groups.values())  # K branches from one state
            for g in groups.values():
                assert abs(sum(s["advantage"] for s in g)) < 1e-6
                assert all(math.isfinite(s["advantage"]) for s in g)
            by_pool = defaultdict(int)
            for s in samples:
                by_pool[s["pool"]] += 1
            assert {p: sum(m["agents"].values()) for p, m in e["pools"].items()} == dict(by_pool)

    # `atgrpo samples` prints them readably: the last step's kept samples of one agent
    agent = cfg.env.turn_order[-1]
    kept = [s for s in samples if s["agent"] == agent and s["selected"]]
    capsys.readouterr()
    assert main(["samples", str(tmp_path / "run"), "--agent", agent, "--selected"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"· {agent} · branch ") == out.count("(selected)") == len(kept) > 0
    assert out.startswith("step 2 · task ") and "\nprompt:\n  " in out and "\nresponse:\n" in out

    # The replicas serve what the trainers hold: the model, or every agent's adapter, at version 2.
    if level == "L2":
        assert served == {("a", "speaker"): 2, ("a", "listener"): 2} | {("a", ""): 0}
    else:
        assert served == {(p, ""): 2 for p in cfg.pools}
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(cfg.pools)


async def stop_after_step(running, step: int) -> dict:
    """Start the run, ask it to stop once `step` is recorded; its final status."""
    return await run_until(running, lambda e: e["kind"] == "step" and e["step"] == step, "test")


def test_stopped_run_resumes_after_its_last_step(tiny_model, tmp_path):
    data = toy_config(tmp_path / "run", tiny_model, "L1", steps=4)
    cfg = parse_config(data)
    with LocalServices(cfg) as running:
        first = asyncio.run(stop_after_step(running, 2))
    assert first["state"] == "stopped" and first["step"] in (2, 3), first

    # New processes: the trainers load the stop's checkpoint, the router continues after it.
    sink, served = train_locally(data)
    assert sink.status["state"] in ("starting", "running")
    final = [e for e in sink.events if e["kind"] == "status"][-1]
    assert final["resumed_from_step"] == first["step"]
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [e["step"] for e in metrics if e["kind"] == "step"]
    assert steps == [1, 2, 3, 4]  # each step exactly once
    assert [e["pools"]["a"]["version"] for e in metrics if e["kind"] == "step"] == [1, 2, 3, 4]
    assert served == {("a", ""): 4}


def test_keep_checkpoints_prunes_the_disk_and_the_run_still_resumes(tiny_model, tmp_path):
    """keep_checkpoints 2 over 6 checkpoint intervals: the last 2 and the best by eval success stay
    on disk, nothing at step 0; new processes resume from the last and prune on."""
    from atgrpo.rundir import RunDir
    from router_svc.checkpoints import retained

    run_dir = tmp_path / "run"
    data = toy_config(
        run_dir,
        tiny_model,
        "L1",
        steps=6,
        checkpoint_every_steps=1,
        keep_checkpoints=2,
        eval_every_steps=1,
        eval_tasks=2,
        save_samples=False,
        save_eval_samples=True,
    )
    train_locally(data)
    # run.save_eval_samples: every evaluation's samples, the two eval tasks each time, no advantage.
    written = sorted(p.name for p in (run_dir / "eval-samples").iterdir())
    assert written == [f"step-{s:06d}.jsonl" for s in range(7)]
    rows = [json.loads(line) for line in (run_dir / "eval-samples" / "step-000006.jsonl").open()]
    assert len({r["task_id"] for r in rows}) == 2 and {r["advantage"] for r in rows} == {None}
    assert all(r["reward"] == r["local_reward"] and r["response_text"] is not None for r in rows)

    def on_disk() -> list[int]:
        return sorted(
            int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").iterdir()
        )

    evals = {
        e["step"]: e["success_rate"]
        for e in read_metrics(run_dir / "metrics.jsonl")
        if e["kind"] == "eval"
    }
    progress = RunDir(run_dir).read_progress()
    assert [c.success for c in progress.checkpoints] == [
        evals[c.step] for c in progress.checkpoints
    ]
    best = max(range(1, 7), key=lambda s: (evals[s], s))
    assert on_disk() == sorted({5, 6, best}) == [c.step for c in progress.checkpoints]
    assert [c.step for c in retained(progress.checkpoints, 2)] == on_disk()
    assert all(
        sorted(p.name for p in (run_dir / "checkpoints" / f"step-{s:06d}").iterdir()) == ["a"]
        for s in on_disk()
    )

    data["run"]["steps"] = 8  # new processes: the trainer loads step 6
    sink, served = train_locally(data)
    final = [e for e in sink.events if e["kind"] == "status"][-1]
    assert final["resumed_from_step"] == 6 and served == {("a", ""): 8}
    evals = {
        e["step"]: e["success_rate"]
        for e in read_metrics(run_dir / "metrics.jsonl")
        if e["kind"] == "eval"
    }
    best = max(range(1, 9), key=lambda s: (evals[s], s))
    assert on_disk() == sorted({7, 8, best})


class StopAtSuccess(Collect):
    """Collects, and asks the router to stop the run after the first greedy evaluation whose
    success reaches `target` (the step in flight completes, as after a Ctrl-C)."""

    def __init__(self, router: str, target: float):
        super().__init__()
        self.router, self.target, self.stopping = router, target, None

    def on_event(self, event):
        super().on_event(event)
        reached = event["kind"] == "eval" and event["success_rate"] >= self.target
        if reached and self.stopping is None:
            self.stopping = asyncio.get_running_loop().create_task(self._stop())

    async def _stop(self):
        async with RouterClient(self.router) as client:
            await client.stop_run(self.status["run_id"], f"greedy success >= {self.target}")


def test_the_demo_learns(tiny_model, tmp_path):
    """The demo's config (examples/toy_L1_tiny.yaml) from the random tiny model, at most 30 steps:
    greedy eval success goes from ~0 to at least 0.125, and the run stops at the first evaluation
    that shows it (step 10 in probes).

    A random model's greedy answer names no digit (it emits one ~1% of the time when sampling), so
    the bar needs the loop to have learnt from the rare rewarded samples. It is set so that any
    listener that names a digit passes: each of the four secrets is the secret of 9 to 24 of the
    64 eval tasks (0.14 at least); one run's listener said "1" to every message, 11 of 64. That is
    the format, not the relay (a blind listener succeeds at most 1/4 + 3/4 * 1/3 = 0.5 over two
    turns); `make demo` shows the relay (0.83 by step 225, 1.0 from 275), and
    test_swapping_the_trained_adapters_breaks_the_relay pins that each role learns its own skill.
    The full 350-step climb to 0.75 took 6.5 minutes of a 21-minute suite and is not repeated."""
    import yaml

    data = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples" / "toy_L1_tiny.yaml").read_text()
    )
    data["run"].update(
        steps=30, eval_every_steps=5, checkpoint_every_steps=0, run_dir=str(tmp_path / "run")
    )
    data["pools"]["shared"]["model_path"] = tiny_model
    cfg = parse_config(data)
    with LocalServices(cfg) as running:
        sink = StopAtSuccess(running.services.router, 0.125)
        final = asyncio.run(drive(running, sink))
    evals = [(e["step"], e["success_rate"]) for e in sink.events if e["kind"] == "eval"]
    assert evals[0] == (0, evals[0][1]) and evals[0][1] <= 0.05, evals
    assert evals[-1][1] >= 0.125, evals
    # stopped at the first evaluation that reached it (finished: that was the last one)
    assert final["state"] in ("stopped", "finished"), final
    assert all(success < 0.125 for _, success in evals[:-1]), evals
    # every step trained the shared pool once, and only the steps before the stop ran
    steps = [e for e in sink.events if e["kind"] == "step"]
    assert [e["pools"]["shared"]["version"] for e in steps] == list(range(1, len(steps) + 1))
    assert len(steps) <= evals[-1][0] + 1


def test_swapping_the_trained_adapters_breaks_the_relay(knows_the_code, tmp_path):
    """The paper's swap ablation in miniature. At L2 each role trains its own LoRA adapter on the
    toy relay with a code (the speaker must say 7 for secret 3, the listener must decode 7 back to
    3). Evaluated greedily from the checkpoint, the team solves the relay; with the two adapters'
    folders swapped (the speaker runs the listener's adapter and the other way round) it fails.

    Not by chance: swapping adapters that training left as they started (LoRA's B is zero) changes
    nothing, and a greedy relay from the untaught pairs solves a task only where both roles' argmax
    happen to go the right way (13 in 16 in one probe), so the gap needs each role to have learnt
    its own direction. Swapped, the speaker says the secret itself, which is not a code symbol,
    and the listener answers in the code's alphabet: 0 of 32 in the probes."""
    import shutil

    from atgrpo.cli.runner import evaluate

    data = toy_config(tmp_path / "run", knows_the_code, "L2", steps=40, eval_tasks=32)
    data["env"].update(max_turns=1, options={"code": TOY_CODE})
    data["run"]["tasks_per_step"] = 8
    data["algorithm"].update(k=8, mini_batch_size=512)
    cfg = parse_config(data)
    train_locally(data)

    ckpt = tmp_path / "run" / "checkpoints" / "step-000040"
    swapped = tmp_path / "swapped" / ckpt.name
    shutil.copytree(ckpt / "a", swapped / "a")
    adapters = swapped / "a" / "model"
    (adapters / "speaker").rename(adapters / "was-speaker")
    (adapters / "listener").rename(adapters / "speaker")
    (adapters / "was-speaker").rename(adapters / "listener")
    trained, crossed = evaluate(cfg, ckpt), evaluate(cfg, swapped)

    assert trained["step"] == crossed["step"] == 40
    # Alone: 30-32 of 32 trained; a clean clone's loaded make test left 27 of 32 once.
    assert trained["success_rate"] >= 0.75, trained
    # Alone: 0 of 32 swapped. Under a loaded make test the run's samples differ (the engine batches
    # whatever requests arrive together) and one run left 10 of 32: the bound is the gap, not luck.
    assert (
        crossed["success_rate"] <= 0.4 and trained["success_rate"] - crossed["success_rate"] >= 0.5
    ), crossed
    assert (
        crossed["agents"]["speaker"]["reward_mean"]
        < 0.1
        < trained["agents"]["speaker"]["reward_mean"]
    )


def test_cli_train_eval_and_plot(tiny_model, tmp_path, subprocess_env):
    """`atgrpo train` as a user runs it: a line per step and evaluation, and a run directory with
    the config, metrics, TensorBoard events, checkpoints and the curves; then `eval` and `plot`."""
    import subprocess
    import sys

    import yaml

    data = toy_config(tmp_path / "ignored", tiny_model, "L1", steps=5, eval_every_steps=2)
    cfg_path = tmp_path / "toy.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"

    def atgrpo(*args):
        return subprocess.run(
            [sys.executable, "-m", "atgrpo.cli", *args],
            env=subprocess_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    out = atgrpo("train", str(cfg_path), "--steps", "2", "--run-dir", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "step    2/2" in out.stdout
        and "eval @ step    2" in out.stdout
        and "run finished" in out.stdout
    )
    assert {"config.yaml", "metrics.jsonl", "state.json", "curves.png", "tb", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()
    }
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    # --steps applied; no dead ports kept
    assert saved["run"]["steps"] == 2 and "services" not in saved
    assert next((run_dir / "tb").glob("events.out.tfevents.*")).stat().st_size > 0
    assert (run_dir / "checkpoints" / "step-000002" / "a" / "model" / "config.json").exists()

    ev = atgrpo("eval", str(run_dir / "config.yaml"), "--checkpoint", str(run_dir), "--json")
    assert ev.returncode == 0, ev.stdout + ev.stderr
    result = json.loads(ev.stdout[ev.stdout.index("{") :])
    assert result["kind"] == "eval" and result["step"] == 2 and result["episodes"] == 4
    assert 0.0 <= result["success_rate"] <= 1.0 and set(result["agents"]) == {"speaker", "listener"}
    assert (run_dir / "evals" / "step-000002" / "services" / "logs" / "router.log").exists()
    # a checkpoint holds only weights
    assert not (run_dir / "checkpoints" / "step-000002" / "eval").exists()

    (run_dir / "curves.png").unlink()
    assert (
        atgrpo("plot", str(run_dir)).returncode == 0 and (run_dir / "curves.png").stat().st_size > 0
    )
    missing = atgrpo("train", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "file not found" in missing.stderr


def test_sigterm_to_atgrpo_train_stops_its_local_services(tiny_model, tmp_path, subprocess_env):
    import signal
    import subprocess
    import sys
    import time

    import psutil
    import yaml

    from atgrpo.cli import launcher

    cfg_path = tmp_path / "toy.yaml"
    cfg_path.write_text(yaml.safe_dump(toy_config(tmp_path / "run", tiny_model, "L1", steps=1000)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "atgrpo.cli", "train", str(cfg_path)],
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
        assert proc.poll() is None
        time.sleep(0.5)
    services = launcher.read_state(tmp_path / "run" / "services")
    assert len(services) == 5 and all(launcher.is_ours(s) for s in services)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(
        [psutil.Process(s.pid) for s in services if launcher.is_ours(s)], timeout=15
    )
    assert not alive


ANSWERS = {
    "coder": "```python\nprint(input())\n```",
    "tester": "**Test Input:**\n```\n1\n2\n```\n**Test Output:**\n```\n0\n```",
    "tool": "```python\nprint(120)\n```",
    "reasoner": "The answer is \\boxed{120}",
}


@pytest.fixture(scope="module")
def taught(tiny_model, tmp_path_factory) -> str:
    """The tiny model taught to answer each code/math role with a program, tests or a boxed
    answer."""
    from atgrpo.models.taught import role_prompts, teach
    from env_svc.envs.code import CodeEnv
    from env_svc.envs.math import MathEnv

    prompts = role_prompts(CodeEnv({}), ["coder", "tester"]) + role_prompts(
        MathEnv({}), ["tool", "reasoner"]
    )
    # 480 steps (~10 s): at 240 the tool answered the coder's program 91% of the time (measured at
    # temperature 0.7), and a run whose tool never wrote print(120) failed the sandbox test below.
    return teach(
        tiny_model, tmp_path_factory.mktemp("models") / "taught", prompts, ANSWERS, steps=480
    )


def sandbox_calls(services) -> dict[str, float]:
    """The sandbox's own count of the programs it ran, by method (from its /metrics)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    sandbox = next(s for s in services if s.kind == "sandbox")
    text = (
        urllib.request.urlopen(f"http://{sandbox.metrics_address}/metrics", timeout=5)
        .read()
        .decode()
    )
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "atgrpo_rpc_handled_total" and s.labels.get("code") == "OK":
                out[s.labels["method"]] += s.value
    return out


@pytest.mark.parametrize(
    "env, roles, ran, method",
    [
        ("code", ["coder", "tester"], "verdicts", "RunTests"),
        ("math", ["tool", "reasoner"], "verdict", "Execute"),
    ],
)
def test_code_and_math_train_through_the_sandbox(env, roles, ran, method, taught, tmp_path):
    """A few steps of each environment through all five services: the programs the model writes run
    in the real sandbox, and the rewards of the roles that write programs come from those runs."""
    from atgrpo.cli import launcher

    data = toy_config(tmp_path / "run", taught, "L1")
    data["env"] = {"name": env, "turn_order": roles, "max_turns": 2}
    sampling = {"temperature": 0.7, "max_tokens": 40}
    data["agents"] = {
        r: {"pool": "a", "train_sampling": sampling, "eval_sampling": {"max_tokens": 40}}
        for r in roles
    }
    data["algorithm"]["k"] = 2
    data["run"]["tasks_per_step"] = 2
    cfg = parse_config(data)
    sink = Collect()
    with LocalServices(cfg) as running:
        final = asyncio.run(drive(running, sink))
        calls = sandbox_calls(launcher.read_state(tmp_path / "run" / "services"))
    assert final["state"] == "finished", final
    assert [e["pools"]["a"]["version"] for e in sink.events if e["kind"] == "step"] == [1, 2]
    programs = [
        json.loads(line)
        for f in sorted((tmp_path / "run" / "samples").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    writer = [s for s in programs if s["agent"] == roles[0]]
    assert writer and all(ran in s["info"] or "parse_error" in s["info"] for s in writer)
    executed = [s for s in writer if ran in s["info"]]
    assert len(executed) >= len(writer) / 2  # the taught model writes programs
    assert calls[method] >= len(executed)  # each one ran in the sandbox service
    clean = [s for s in executed if s["info"][ran] == "ok" or "ok" in s["info"][ran]]
    # a program that ran is scored on its output
    assert clean and all(s["local_reward"] >= 0 for s in clean)
