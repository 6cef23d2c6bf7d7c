"""What `atgrpo train` shows of a rollback: a console line with the step it went back to and why,
curves and TensorBoard that hold each step once (the replayed values, not the undone ones)."""

from atgrpo.cli.report import Reporter
from atgrpo.contract.run import rollback_dict, status_dict
from atgrpo.rundir import read_metrics
from tests.observability.tensorboard_events import shown_scalars
from tests.router.test_run_pieces import config

WHY = "trainer 'a' restarted and lost its weights"


def step(s: int, reward: float) -> dict:
    return {
        "kind": "step",
        "step": s,
        "success_rate": 0.5,
        "reward_mean": reward,
        "agents": {"speaker": {"reward_mean": reward, "samples": 8}},
        "pools": {"a": {"version": s, "loss": 0.1, "approx_kl": 0.0}},
        "rollout_seconds": 0.1,
        "train_seconds": 0.1,
        "weight_sync_seconds": 0.0,
    }


def follow(reporter: Reporter, events: list[dict], tmp_path) -> None:
    reporter.start(status_dict("r", "starting", 0, 5, str(tmp_path / "elsewhere")))
    for e in events:
        reporter.on_event(e)
    reporter.on_event(status_dict("r", "finished", 5, 5, str(tmp_path / "elsewhere")))


RUN = (
    [{"kind": "eval", "step": 0, "success_rate": 0.0, "episodes": 4, "agents": {}}]
    + [step(s, 0.0) for s in (1, 2, 3)]
    + [rollback_dict(3, 1, "step-000001", WHY)]
    + [step(s, 1.0) for s in (2, 3, 4, 5)]
)


def test_a_rollback_is_said_on_the_console_and_tensorboard_shows_each_step_once(tmp_path, capsys):
    cfg = config(tmp_path, level="L2", steps=5)
    follow(Reporter(cfg, mirror=True), RUN, tmp_path)
    out = capsys.readouterr().out
    assert (
        "rolled back from step 3 to step 1 (checkpoint step-000001): trainer 'a' restarted and "
        "lost its weights; steps 2-3 are trained again"
    ) in out
    assert (
        out.index("step    3/5")
        < out.index("rolled back")
        < out.index("step    2/5", out.index("rolled back"))
    )
    shown = shown_scalars(tmp_path / "tb")
    assert shown["train/reward_mean"] == [(1, 0.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.0)]
    assert [s for s, _ in shown["eval/success_rate"]] == [0]
    # The mirrored metrics.jsonl (a router on another machine) keeps the rollback, and each step
    # once.
    kept = read_metrics(tmp_path / "metrics.jsonl")
    assert [(e["kind"], e["step"]) for e in kept] == [("eval", 0), ("step", 1), ("rollback", 1)] + [
        ("step", s) for s in (2, 3, 4, 5)
    ]


def test_following_the_run_again_replaces_what_tensorboard_held(tmp_path, capsys):
    """`atgrpo train` again on the run directory (a resume) is sent the run's events from the start:
    TensorBoard shows them once, not twice."""
    cfg = config(tmp_path, level="L2", steps=5)
    follow(Reporter(cfg, mirror=False), RUN, tmp_path)
    follow(
        Reporter(cfg, mirror=False),
        [e for e in RUN if e["kind"] != "step" or e["step"] <= 1 or e["reward_mean"] == 1.0],
        tmp_path,
    )
    assert [s for s, _ in shown_scalars(tmp_path / "tb")["train/reward_mean"]] == [1, 2, 3, 4, 5]
