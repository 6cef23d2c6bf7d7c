"""A short local training run as a real Prometheus sees it.

The five services run as local processes (atgrpo.cli.runner.LocalServices) on the toy relay with the
tiny model; Debian's prometheus scrapes every service's /metrics each second on loopback, with
the chart's alert rules loaded. Then Prometheus' HTTP API must show the expected series with
plausible values (cross-checked between services), every dashboard query must be valid PromQL
that returns data, no alert may fire on the healthy run, and promtool must accept every
service's exposition.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from atgrpo.cli import launcher
from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import parse_config
from tests.observability.conftest import DASHBOARDS, RULE_FILES
from tests.observability.exported import metric_names

pytestmark = pytest.mark.slow

RUN = "obs-l1"
STEPS, TASKS, K, MAX_TURNS, MAX_TOKENS = 3, 4, 4, 2, 4
AGENTS = ("speaker", "listener")
# Dashboard series the toy run cannot produce: the toy env runs no code in the sandbox, the
# sandbox runs isolated, and the rollout runs the hf engine on CPU (no KV-cache share, no GPU).
NOT_IN_A_TOY_RUN = {
    "atgrpo_sandbox_exec_seconds_bucket",
    "atgrpo_sandbox_exec_seconds_count",
    "atgrpo_sandbox_isolation_disabled",
    "atgrpo_rollout_kv_cache_usage_ratio",
    "atgrpo_gpu_memory_allocated_bytes",
    "atgrpo_gpu_memory_reserved_bytes",
    # the OpenAI port (rollout_svc --http-port): a training run never calls it
    "atgrpo_rollout_http_requests_total",
    "atgrpo_rollout_http_request_seconds_bucket",
    "atgrpo_rollout_http_tokens_total",
}
# What Grafana substitutes into the queries ("All" for the variables).
GRAFANA_VARS = {"$__rate_interval": "1m", "$run": ".*", "$agent": ".*", "$pool": ".*"}


def toy_config(run_dir: Path, model: str) -> dict:
    """L1: one pool plays both roles; an evaluation before the first step and after the last."""
    sampling = {"temperature": 1.0, "max_tokens": MAX_TOKENS}
    return {
        "run": {
            "name": RUN,
            "seed": 0,
            "steps": STEPS,
            "tasks_per_step": TASKS,
            "eval_every_steps": STEPS,
            "eval_tasks": 4,
            "checkpoint_every_steps": 0,
            "run_dir": str(run_dir),
        },
        "env": {"name": "toy", "turn_order": list(AGENTS), "max_turns": MAX_TURNS},
        "pools": {
            "a": {
                "model_path": model,
                "device": "cpu",
                "dtype": "float32",
                "optim": {"lr": 5e-4, "warmup_steps": 0},
            }
        },
        "agents": {
            a: {
                "pool": "a",
                "train_sampling": sampling,
                "eval_sampling": {"max_tokens": MAX_TOKENS},
            }
            for a in AGENTS
        },
        # kl_coef > 0 so the reference is scored and its gauge (a dashboard panel) exported.
        "algorithm": {"k": K, "mini_batch_size": 64, "kl_coef": 0.01},
    }


class Quiet:
    """The reporter drive() wants; keeps the final status."""

    def start(self, status):
        self.status = status

    def on_event(self, event):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus on loopback scraping `services` every second, with `rule_files` loaded."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        services: list[launcher.LocalService],
        rule_files: list[Path],
    ):
        workdir.mkdir(parents=True, exist_ok=True)
        self.binary, self.workdir = binary, workdir
        jobs: dict[str, list[str]] = {}
        for s in services:
            jobs.setdefault(s.kind, []).append(s.metrics_address)
        # `component` as the chart's relabeling sets it, so the rules and dashboards apply as is.
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": f"atgrpo-{kind}",
                    "static_configs": [{"targets": targets, "labels": {"component": kind}}],
                }
                for kind, targets in jobs.items()
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> Prometheus:
        for _ in range(3):  # a port taken between picking and binding: pick again
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            with self.log.open("w") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={self.config}",
                        f"--storage.tsdb.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                        if r.status == 200:
                            return self
                except OSError:
                    time.sleep(0.2)
            self.__exit__()
        raise AssertionError(f"prometheus did not start; its log:\n{self.log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params) -> dict | list:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as err:
            body = json.load(err)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), data
        return (
            data["result"]
            if data["resultType"] == "vector"
            else [{"metric": {}, "value": data["result"]}]
        )

    def values(self, expr: str) -> dict[tuple, float]:
        """{sorted labels (without the name): value}"""
        return {
            tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(
                r["value"][1]
            )
            for r in self.query(expr)
        }

    def value(self, expr: str) -> float:
        got = self.values(expr)
        assert len(got) == 1, f"{expr}: expected one series, got {got}"
        return next(iter(got.values()))

    def wait_for(self, expr: str, want: float | None = None, timeout_s: float = 20) -> None:
        """Until every series of `expr` equals `want` (any result at all with want=None)."""
        deadline = time.monotonic() + timeout_s
        got = None
        while time.monotonic() < deadline:
            got = self.values(expr)
            if got and (want is None or all(v == want for v in got.values())):
                return
            time.sleep(0.25)
        raise AssertionError(f"{expr} = {got}, not {want}, after {timeout_s} s")


@pytest.fixture(scope="module")
def scraped(prometheus, tiny_model, tmp_path_factory):
    """Train STEPS steps under Prometheus' eye; yields (prometheus, services, start time)."""
    tmp = tmp_path_factory.mktemp("obs")
    cfg = parse_config(toy_config(tmp / "run", tiny_model))
    with LocalServices(cfg) as running:
        services = launcher.read_state(tmp / "run" / "services")
        with Prometheus(prometheus, tmp / "prometheus", services, RULE_FILES) as prom:
            assert len(services) == 5
            prom.wait_for(
                'count(up{component=~"router|env|sandbox|rollout|trainer"} == 1)', len(services)
            )
            started = time.time()
            reporter = Quiet()
            final = asyncio.run(drive(running, reporter))
            assert final["state"] == "finished", final
            # The final values: every service scraped once more after the run ended (a sample's
            # timestamp is its scrape's start).
            prom.wait_for(f"min(timestamp(up)) > {time.time():.3f}")
            # The run lasts seconds: let the newest series (born at step 1) have the samples rate()
            # needs.
            for newest in ("atgrpo_router_steps_total", "atgrpo_trainer_updates_total"):
                prom.wait_for(f"count_over_time({newest}[1m]) >= 3")
            yield prom, services, started


def per_agent(prom: Prometheus, expr: str) -> dict[str, float]:
    return {dict(labels)["agent"]: v for labels, v in prom.values(expr).items()}


def test_targets_are_up_and_scraped_cleanly(scraped):
    prom, services, _ = scraped
    up = prom.values('up{component=~"router|env|sandbox|rollout|trainer"}')
    assert sorted(dict(k)["component"] for k in up) == sorted(s.kind for s in services)
    for target in prom.api("targets")["activeTargets"]:
        assert target["health"] == "up" and not target["lastError"], target


def test_router_series(scraped):
    prom, _, started = scraped
    r = f'run="{RUN}"'
    assert prom.value(f"atgrpo_router_completed_step{{{r}}}") == STEPS
    assert prom.value(f"atgrpo_router_steps_total{{{r}}}") == STEPS
    assert started <= prom.value(f"atgrpo_router_last_step_timestamp_seconds{{{r}}}") <= time.time()
    assert prom.value(f"atgrpo_router_step_seconds_count{{{r}}}") == STEPS
    phases = {
        dict(k)["phase"]: v
        for k, v in prom.values(f"atgrpo_router_step_phase_seconds_sum{{{r}}}").items()
    }
    assert set(phases) == {"rollout", "train", "weight_sync"}
    assert all(v > 0 for v in phases.values()), phases
    assert sum(phases.values()) <= prom.value(f"atgrpo_router_step_seconds_sum{{{r}}}")
    current = prom.values(f"atgrpo_router_run_state{{{r}}} == 1")  # exactly one state
    assert [dict(k)["state"] for k in current] == ["finished"]

    for split in ("train", "eval"):
        rewards = per_agent(prom, f'atgrpo_router_reward_mean{{{r}, split="{split}"}}')
        assert set(rewards) == set(AGENTS)
        # a step pays at most 1.1; eval sums turns
        top = 1.2 if split == "train" else 1.2 * MAX_TURNS
        assert all(0 <= v <= top for v in rewards.values()), rewards
        success = per_agent(prom, f'atgrpo_router_success_ratio{{{r}, split="{split}"}}')
        assert set(success) == set(AGENTS) and all(0 <= v <= 1 for v in success.values())
        turns = per_agent(prom, f'atgrpo_router_turns_mean{{{r}, split="{split}"}}')
        assert all(1 <= v <= MAX_TURNS for v in turns.values()), turns
    episodes = {
        dict(k)["split"]: v for k, v in prom.values(f"atgrpo_router_episodes_total{{{r}}}").items()
    }
    assert episodes == {"train": STEPS * TASKS, "eval": 2 * 4}  # two evaluations of 4 tasks
    assert set(prom.values(f"atgrpo_router_failed_episodes_total{{{r}}}").values()) == {0}

    samples = per_agent(prom, f"atgrpo_router_samples_total{{{r}}}")
    assert set(samples) == set(AGENTS)
    # K samples per agent, turn and task
    assert all(STEPS * TASKS * K <= n <= STEPS * TASKS * K * MAX_TURNS for n in samples.values()), (
        samples
    )
    assert set(per_agent(prom, f"atgrpo_router_group_size_mean{{{r}}}").values()) == {K}
    groups = per_agent(prom, f"atgrpo_router_groups{{{r}}}")
    assert all(TASKS <= g <= TASKS * MAX_TURNS for g in groups.values()), groups
    assert all(
        0 <= v <= 1 for v in per_agent(prom, f"atgrpo_router_zero_variance_ratio{{{r}}}").values()
    )
    assert all(
        abs(v) < 1e-3 for v in per_agent(prom, f"atgrpo_router_advantage_mean{{{r}}}").values()
    )
    assert all(v >= 0 for v in per_agent(prom, f"atgrpo_router_advantage_std{{{r}}}").values())
    assert prom.value(f"atgrpo_router_dropped_samples_total{{{r}}}") == 0  # no filter configured
    # synchronous: nothing too stale, every sample on-policy (the series exists for the dashboard at
    # 0)
    assert prom.value(f'atgrpo_router_stale_samples_dropped_total{{{r}, pool="a"}}') == 0


def test_trainer_series(scraped):
    prom, _, _ = scraped
    p = f'run="{RUN}", pool="a"'
    assert prom.value(f"atgrpo_trainer_policy_version{{{p}}}") == STEPS
    assert prom.value(f"atgrpo_trainer_updates_total{{{p}}}") == STEPS
    assert prom.value(f"atgrpo_trainer_update_seconds_count{{{p}}}") == STEPS
    for name in ("loss", "approx_kl", "grad_norm", "entropy_nats"):
        assert math.isfinite(prom.value(f"atgrpo_trainer_{name}{{{p}}}")), name
    # 0 when every group had equal rewards
    assert prom.value(f"atgrpo_trainer_grad_norm{{{p}}}") >= 0
    assert prom.value(f"atgrpo_trainer_entropy_nats{{{p}}}") > 0
    assert prom.value(f"atgrpo_trainer_kl_ref{{{p}}}") >= 0  # kl_coef 0.01: scored each update
    assert prom.value(f"atgrpo_trainer_staleness_max{{{p}}}") == 0  # synchronous: on-policy only
    assert 0 <= prom.value(f"atgrpo_trainer_clip_ratio{{{p}}}") <= 1
    # one push to the one replica per update, every byte acknowledged, none failed
    assert prom.value(f"atgrpo_trainer_weight_push_seconds_count{{{p}}}") == STEPS
    assert prom.value(f"atgrpo_trainer_weight_push_bytes_total{{{p}}}") > 0
    assert prom.value(f"atgrpo_trainer_weight_push_failures_total{{{p}}}") == 0
    # the trainer trained on every sample the router collected (no filter), agent by agent
    router = per_agent(prom, f'atgrpo_router_samples_total{{run="{RUN}"}}')
    assert per_agent(prom, f"atgrpo_trainer_samples_total{{{p}}}") == router
    tokens = per_agent(prom, f"atgrpo_trainer_tokens_total{{{p}}}")
    assert all(router[a] <= tokens[a] <= router[a] * MAX_TOKENS for a in AGENTS), tokens
    assert (
        prom.value(
            'atgrpo_rpc_handled_total{service="atgrpo.v1.TrainerService", method="Train", '
            'code="OK"}'
        )
        == STEPS
    )


def test_rollout_series(scraped):
    prom, _, started = scraped
    assert prom.value('atgrpo_rollout_policy_version{pool="a", adapter=""}') == STEPS
    completions = prom.value('atgrpo_rollout_completions_total{pool="a"}')
    trained = sum(per_agent(prom, f'atgrpo_router_samples_total{{run="{RUN}"}}').values())
    assert completions >= trained  # every training sample, plus the evaluations
    tokens = prom.value('atgrpo_rollout_generated_tokens_total{pool="a"}')
    assert 0 < tokens <= completions * MAX_TOKENS
    assert prom.value('atgrpo_rollout_batch_rows_sum{pool="a"}') == completions
    assert (
        prom.value('atgrpo_rollout_generate_seconds_count{pool="a"}')
        == prom.value('atgrpo_rollout_batch_rows_count{pool="a"}')
        > 0
    )
    # busy: every engine batch (and the weight loads besides), within the run's wall time
    busy = prom.value('atgrpo_rollout_busy_seconds_total{pool="a"}')
    assert (
        prom.value('atgrpo_rollout_generate_seconds_sum{pool="a"}') <= busy <= time.time() - started
    )


def test_env_and_sandbox_series(scraped):
    prom, _, _ = scraped
    episodes = prom.value(f'sum(atgrpo_router_episodes_total{{run="{RUN}"}})')
    assert prom.value('atgrpo_env_resets_total{env="toy"}') == episodes  # one Reset per episode
    assert prom.value('atgrpo_env_live_episodes{env="toy"}') == 0  # every episode was closed
    steps = prom.value('atgrpo_env_step_seconds_count{env="toy"}')
    completions = prom.value('atgrpo_rollout_completions_total{pool="a"}')
    assert steps == completions  # each completion is applied by one Step
    assert prom.value('atgrpo_env_fork_seconds_count{env="toy"}') > 0
    assert 0 < prom.value('atgrpo_env_step_seconds_sum{env="toy"}') < steps
    assert prom.value("atgrpo_sandbox_workers") >= 1
    assert prom.value("atgrpo_sandbox_queue_capacity") >= 0
    assert prom.value("atgrpo_sandbox_queue_depth") == 0
    assert prom.value("atgrpo_sandbox_rejected_total") == 0
    assert not prom.values("atgrpo_sandbox_isolation_disabled")


def test_every_dashboard_query_runs_and_shows_data(scraped):
    prom, _, _ = scraped
    empty = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in GRAFANA_VARS.items():
                    expr = expr.replace(var, value)
                result = prom.query(expr)  # a PromQL error fails here, naming the query
                if not result and not metric_names(expr) <= NOT_IN_A_TOY_RUN:
                    empty.append(f"{path.name}: {panel['title']}: {expr}")
    assert not empty, "queries with no data after a training run:\n" + "\n".join(empty)


def test_rules_evaluate_and_a_healthy_run_fires_no_alert(scraped):
    prom, _, _ = scraped
    deadline = time.monotonic() + 10
    while True:
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if (
            all(r.get("lastEvaluation", "").startswith("20") for r in rules)
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.25)
    assert {g["file"] for g in groups} == {str(p) for p in RULE_FILES}
    assert rules and all(r["health"] == "ok" for r in rules), [
        (r["name"], r.get("lastError")) for r in rules
    ]
    firing = [a for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing


def test_promtool_accepts_every_exposition(scraped, promtool):
    _, services, _ = scraped
    for s in services:
        with urllib.request.urlopen(f"http://{s.metrics_address}/metrics", timeout=10) as r:
            text = r.read()
        out = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
        )
        assert out.returncode == 0 and not out.stdout.strip(), (
            s.name,
            out.stdout.decode(),
            out.stderr.decode(),
        )
