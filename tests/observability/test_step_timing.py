"""Where a step's time goes (docs/observability.md, "A step's time"): the FLOP counts by hand, the
matmul rate, how a Collect and an engine batch split their time, how the router folds replicas and
pools into the step record, the wire, and `atgrpo train --timing`'s step line.
A step of real services is in tests/router/test_step_timing_live.py."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from atgrpo import perf
from atgrpo.cli.report import step_line, tensorboard_scalars
from atgrpo.contract import rollout_wire, trainer_wire
from atgrpo.contract.rollout import (
    AgentPlan,
    CollectPlan,
    Completion,
    EpisodeEnd,
    Generation,
    PolicyRef,
    TaskRef,
)
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainResult
from atgrpo.perf import ModelSize
from rollout_svc.pool import PoolRuntime
from rollout_svc.tree import CollectClock, collect
from router_svc.events import timing_fields
from tests.rollout.scripted import ScriptedEngine
from tests.rollout.test_tree import envs

SIZE = ModelSize(body=1000, head=200, body_trainable=1000, head_trainable=200)


# ---- FLOPs -----------------------------------------------------------------------------------


def test_flops_of_a_forward_a_backward_and_an_update_by_hand():
    # 10 positions, 4 of them with logits: 2 x (1000 x 10 + 200 x 4) = 21,600
    assert perf.forward_flops(SIZE, 10, 4) == 21_600
    # activations' gradients as much again, every weight's gradient as much again: 4N
    assert perf.backward_flops(SIZE, 10, 4) == 43_200
    assert perf.update_flops(SIZE, 10, 4) == 64_800  # 6N: full fine-tuning
    lora = ModelSize(body=1000, head=200, body_trainable=16, head_trainable=0)
    assert perf.backward_flops(lora, 10, 4) == 21_600 + 2 * 16 * 10
    assert perf.update_flops(lora, 10, 4) == 43_520  # ~4N: a frozen base with adapters


def test_flops_of_a_generation_by_hand():
    # 2 prompts, 30 prompt positions (logits at each prompt's last), 5 decoded tokens (logits each):
    # 2 x (1000 x 30 + 200 x 2) + 2 x (1000 x 5 + 200 x 5) = 60,800 + 12,000
    assert perf.generation_flops(SIZE, 2, 30, 5) == 72_800


class Tiny(torch.nn.Module):
    def __init__(self, tied: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)  # a lookup: not counted
        self.up = torch.nn.Linear(8, 16)  # 128 + 16
        self.down = torch.nn.Linear(16, 8, bias=False)  # 128
        self.head = torch.nn.Linear(8, 50, bias=False)  # 400
        if tied:
            self.head.weight = self.embed.weight

    def get_output_embeddings(self):
        return self.head


def test_model_size_counts_the_linear_layers_and_the_head_apart():
    model = Tiny()
    assert perf.model_size(model) == ModelSize(
        body=272, head=400, body_trainable=272, head_trainable=400
    )
    model.up.requires_grad_(False)
    model.head.requires_grad_(False)
    assert perf.model_size(model) == ModelSize(
        body=272, head=400, body_trainable=128, head_trainable=0
    )
    assert perf.model_size(Tiny(tied=True)).head == 400  # a tied head still runs a matmul
    with torch.device("meta"):  # sizes from a config alone (vLLM's engine)
        assert perf.model_size(Tiny()).body == 272


def test_the_matmul_rate_is_measured_once_per_process():
    rate = perf.matmul_rate("cpu", torch.float32)
    assert rate > 1e8  # at least 0.1 GFLOP/s on any CPU
    start = time.perf_counter()
    assert perf.matmul_rate("cpu", torch.float32) == rate  # cached: not measured again
    assert time.perf_counter() - start < 0.01
    assert perf.matmul_rate("meta") == 0.0  # nothing runs there: no figure


def test_on_a_cpu_the_rate_counts_the_packed_onednn_linear_the_engine_runs():
    a, b = torch.randn(64, 96), torch.randn(96, 32)
    if perf.packable(torch.float32):
        assert perf._packed_rate(a, b, 0.01) > 1e8
    assert perf._packed_rate(a.half(), b.half(), 0.01) == 0.0  # no packed float16: not counted
    assert perf.matmul_rate("cpu", torch.float16, 0.01, (64, 96, 32)) > 0  # torch's matmul alone


# ---- rollout: a Collect and an engine batch ---------------------------------------------------


class SleepyEnvs:
    async def step(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "ok"


class SleepyGenerator:
    async def generate(self, agent, messages, n: int) -> Generation:
        await asyncio.sleep(0.3)
        return Generation([1], [], PolicyRef("p"), timing={"decode_s": 0.25, "gen_flops": 10.0})


def test_env_time_counts_only_what_generation_does_not_hide():
    async def go():
        clock = CollectClock()
        timed_envs, gen = clock.envs(SleepyEnvs()), clock.generator(SleepyGenerator())
        await timed_envs.step(0.1)  # alone: counted
        # under a generation: hidden
        await asyncio.gather(timed_envs.step(0.1), gen.generate(None, [], 1))
        return clock.report()

    t = asyncio.run(go())
    assert 0.1 <= t["env_s"] < 0.2  # the second 0.1 s ran while the generation did
    assert t["collect_s"] >= 0.4
    assert (t["decode_s"], t["gen_flops"]) == (0.25, 10.0)  # the generation's own figures, summed


class TimedScript(ScriptedEngine):
    """The scripted engine, each generation reporting a made-up share of its batch."""

    async def generate(self, agent, messages, n):
        g = await super().generate(agent, messages, n)
        g.timing = {
            "prefill_s": 0.5,
            "decode_s": 1.0,
            "decode_tokens": float(n),
            "gen_flops": 100.0,
        }
        return g


def test_the_last_episode_end_of_a_collect_carries_its_timing():
    plan = CollectPlan(
        env="pick",
        tasks=tuple(TaskRef(f"t{i}", i, episode=i + 1) for i in range(3)),
        agents={"a": AgentPlan("a", "p"), "b": AgentPlan("b", "p")},
        turn_order=("a", "b"),
        max_turns=1,
        k=4,
    )
    engine = TimedScript(lambda agent, msgs, n, i: ["1"] * n)

    async def go():
        return [e async for e in collect(plan, envs(), engine)]

    ends = [e for e in asyncio.run(go()) if isinstance(e, EpisodeEnd)]
    assert [bool(e.timing) for e in ends] == [False, False, True]
    t = ends[-1].timing
    calls = len(engine.calls)  # 3 tasks x 2 agents, one generation each
    assert calls == 6
    assert (
        t["prefill_s"] == 0.5 * calls
        and t["decode_s"] == 1.0 * calls
        and t["gen_flops"] == 100.0 * calls
    )
    assert t["decode_tokens"] == 4.0 * calls
    assert t["env_s"] > 0 and t["collect_s"] > 0


class SplitEngine:
    """An engine that says how much of each batch was prefill, as the hf engine does."""

    model_size = SIZE
    prefill_s = 0.02

    def __init__(self):
        self.last_timing = {}

    def matmul_rate(self) -> float:
        return 1e9

    def generate(self, prompts, ns, s, adapter=""):
        time.sleep(0.05)
        self.last_timing = {"prefill_s": self.prefill_s}
        tokens = {30: 3, 10: 1}  # decoded tokens per sample, by prompt length
        return [
            [
                Completion([7] * tokens[len(p)], [-0.1] * tokens[len(p)], "x", "length")
                for _ in range(n)
            ]
            for p, n in zip(prompts, ns, strict=True)
        ]


class WholeEngine(SplitEngine):
    """One that does not split (vLLM): the whole batch counts as decode."""

    def generate(self, prompts, ns, s, adapter=""):
        out = super().generate(prompts, ns, s, adapter)
        del self.last_timing
        return out


@pytest.mark.parametrize("engine_class", [SplitEngine, WholeEngine])
def test_a_batch_is_shared_by_prompt_and_decoded_tokens(engine_class):
    async def go():
        pool = PoolRuntime("p", engine_class())
        s = Sampling(max_tokens=3)
        return await asyncio.gather(
            pool.generate("", [5] * 30, s, 2), pool.generate("", [6] * 10, s, 2)
        )

    a, b = (g.timing for g in asyncio.run(go()))  # one batch: both requests came at once
    prefill = SplitEngine.prefill_s if engine_class is SplitEngine else 0.0
    assert a["prefill_s"] == pytest.approx(prefill * 30 / 40) and b["prefill_s"] == pytest.approx(
        prefill * 10 / 40
    )
    assert a["decode_s"] == pytest.approx(3 * b["decode_s"])  # 2 x 3 decoded tokens against 2 x 1
    batch = a["prefill_s"] + a["decode_s"] + b["prefill_s"] + b["decode_s"]
    assert batch >= 0.05
    assert (a["prefill_tokens"], a["decode_tokens"], b["prefill_tokens"], b["decode_tokens"]) == (
        30,
        6,
        10,
        2,
    )
    # 2 x (1000 x 30 + 200) + 2 x (1000 x 6 + 200 x 6) and 2 x (1000 x 10 + 200) + 2 x (1000 x 2 +
    # 200 x 2)
    assert (a["gen_flops"], b["gen_flops"]) == (74_800, 25_200)
    assert a["gen_matmul_flops"] == pytest.approx((a["prefill_s"] + a["decode_s"]) * 1e9)


# ---- the router: replicas and pools into one step record --------------------------------------


def end(**timing) -> EpisodeEnd:
    return EpisodeEnd("t", True, 1, {}, timing=timing)


def test_the_step_follows_the_slowest_replica_and_pool_and_rates_count_them_all():
    ends = [
        end(),
        end(
            collect_s=10,
            prefill_s=1,
            decode_s=5,
            env_s=2,
            prefill_tokens=100,
            decode_tokens=400,
            gen_flops=6e9,
            gen_matmul_flops=12e9,
        ),
        end(
            collect_s=8,
            prefill_s=2,
            decode_s=2,
            env_s=1,
            prefill_tokens=50,
            decode_tokens=100,
            gen_flops=2e9,
            gen_matmul_flops=8e9,
        ),
    ]
    # a trainer that does not report timing
    pools = {
        "p": {
            "train_seconds": 20,
            "time_forward_s": 5,
            "time_backward_s": 10,
            "time_optimizer_s": 1,
            "update_tokens": 1000,
            "update_flops": 32e9,
            "matmul_flops_per_s": 4e9,
        },
        "q": {
            "train_seconds": 10,
            "time_forward_s": 2,
            "time_backward_s": 4,
            "time_optimizer_s": 2,
            "update_tokens": 500,
            "update_flops": 8e9,
            "matmul_flops_per_s": 1e9,
        },
        "old": {"train_seconds": 30},
    }
    t = timing_fields(ends, pools, rollout_s=11.0)
    assert t == pytest.approx(
        {
            "time_prefill_s": 1,
            "time_decode_s": 5,
            "time_env_s": 2,
            "time_wait_s": 3,  # 11 - (1 + 5 + 2)
            "prefill_tokens": 150,
            "decode_tokens": 500,
            "gen_flops_per_s": 8e9 / 10,
            "gen_mfu": 8e9 / 20e9,
            "gen_matmul_flops_per_s": 20e9 / 10,
            "time_forward_s": 5,
            "time_backward_s": 10,
            "time_optimizer_s": 1,
            "update_tokens": 1500,
            # 16 s and 8 s of compute; the matmul rates do 16 x 4e9 + 8 x 1e9 = 72e9 in them
            "update_flops_per_s": 40e9 / 24,
            "update_mfu": 40e9 / 72e9,
            "update_matmul_flops_per_s": 72e9 / 24,
        }
    )


def test_a_replica_running_several_collects_at_once_counts_its_model_seconds_once_each():
    # One replica served three Collects at once (the dispatcher's chunks): its model's seconds are
    # split among their requests, so they add up; its env seconds are the longest Collect's. The
    # other replica ran one shorter Collect.
    ends = [
        end(replica=0, collect_s=12, prefill_s=1, decode_s=4, env_s=1),
        end(replica=0, collect_s=9, prefill_s=0.5, decode_s=3, env_s=2),
        end(replica=0, collect_s=6, prefill_s=0.5, decode_s=1, env_s=0.5),
        end(replica=1, collect_s=11, prefill_s=1, decode_s=9, env_s=1),
    ]
    t = timing_fields(ends, {}, rollout_s=13.0)
    assert (t["time_prefill_s"], t["time_decode_s"], t["time_env_s"]) == (2, 8, 2)
    assert t["time_wait_s"] == pytest.approx(1)  # 13 - (2 + 8 + 2)
    # env seconds never exceed what the model's seconds leave of the rollout
    t = timing_fields(ends, {}, rollout_s=10.5)
    assert (t["time_env_s"], t["time_wait_s"]) == (0.5, 0)


def test_services_that_report_no_timing_give_zero_times_and_no_rates():
    t = timing_fields([end()], {"p": {"train_seconds": 3}}, rollout_s=2.5)
    assert t == {
        "time_prefill_s": 0.0,
        "time_decode_s": 0.0,
        "time_env_s": 0.0,
        "time_wait_s": 2.5,
        "prefill_tokens": 0.0,
        "decode_tokens": 0.0,
        "time_forward_s": 0.0,
        "time_backward_s": 0.0,
        "time_optimizer_s": 0.0,
        "update_tokens": 0.0,
    }


# ---- the wire ----------------------------------------------------------------------------------


def test_timing_survives_the_wire():
    plan = CollectPlan(env="e", tasks=(), agents={}, turn_order=(), max_turns=1)
    timed = end(collect_s=2.0, decode_s=1.5)
    assert rollout_wire.event_from_pb(rollout_wire.end_to_pb(timed, plan)).timing == {
        "collect_s": 2.0,
        "decode_s": 1.5,
    }
    assert rollout_wire.event_from_pb(rollout_wire.end_to_pb(end(), plan)).timing == {}
    g = Generation(
        [1, 2], [Completion([3], [-0.1], "x", "stop")], PolicyRef("p"), timing={"prefill_s": 0.25}
    )
    assert rollout_wire.generation_from_pb(rollout_wire.generation_to_pb(g)).timing == {
        "prefill_s": 0.25
    }

    figures = {
        "loss": 0.1,
        "clip_fraction": 0.0,
        "approx_kl": 0.0,
        "entropy": 1.0,
        "grad_norm": 1.0,
        "train_seconds": 2.0,
        "push_seconds": 0.5,
        "staleness_mean": 0.0,
    }
    timing = {
        "time_forward_s": 0.5,
        "time_backward_s": 1.0,
        "time_optimizer_s": 0.25,
        "update_tokens": 96.0,
        "update_flops": 1e9,
        "matmul_flops_per_s": 2e10,
    }
    back = trainer_wire.result_from_pb(
        trainer_wire.result_to_pb(TrainResult("r", 1, 1, figures | timing), "p")
    )
    assert {k: back.metrics[k] for k in timing} == timing


# ---- `atgrpo train --timing` and TensorBoard -----------------------------------------------------

STEP = {
    "kind": "step",
    "step": 3,
    "success_rate": 0.5,
    "reward_mean": 0.25,
    "agents": {"coder": {"reward_mean": 0.25, "prompt_truncated_fraction": 0.0}},
    "pools": {"p": {"version": 3, "loss": 0.1, "approx_kl": 0.01}},
    "rollout_seconds": 14.6,
    "train_seconds": 28.7,
    "weight_sync_seconds": 1.1,
}
BREAKDOWN = {
    "time_prefill_s": 1.2,
    "time_decode_s": 11.1,
    "time_env_s": 0.8,
    "time_wait_s": 0.3,
    "gen_mfu": 0.58,
    "time_forward_s": 10.1,
    "time_backward_s": 18.2,
    "time_optimizer_s": 0.4,
    "update_mfu": 0.61,
    "gen_flops_per_s": 6.6e10,
    "prefill_tokens": 1200.0,
}
LINE = (
    "step    3/10  success 0.50  reward +0.250 | coder +0.250 | p v3 loss +0.1000 kl 0.0100 | 44.4s"
)


def test_the_step_line_shows_the_breakdown_only_when_asked():
    e = STEP | BREAKDOWN
    assert step_line(e, 10) == LINE
    assert step_line(e, 10, timing=True) == (
        LINE + " | gen 12.3s (prefill 1.2 decode 11.1, 58% mm) env 0.80s wait 0.30s"
        " | update fwd 10.1 bwd 18.2 opt 0.40 (61% mm) push 1.1s"
    )
    # no matmul rate measured (vLLM on a GPU): no share; a small share keeps a digit
    slow = {k: v for k, v in e.items() if k != "update_mfu"} | {"gen_mfu": 0.043}
    assert step_line(slow, 10, timing=True).endswith(
        " | gen 12.3s (prefill 1.2 decode 11.1, 4.3% mm) env 0.80s wait 0.30s | update fwd 10.1 "
        "bwd 18.2 opt 0.40 push 1.1s"
    )
    assert step_line(STEP, 10, timing=True) == LINE  # a step recorded without a breakdown


def test_tensorboard_gets_the_seconds_under_time_and_the_rates_under_perf():
    tags = tensorboard_scalars(STEP | BREAKDOWN)
    assert (
        tags["time/prefill_s"] == 1.2
        and tags["time/optimizer_s"] == 0.4
        and tags["time/rollout_seconds"] == 14.6
    )
    assert (
        tags["perf/gen_mfu"] == 0.58
        and tags["perf/gen_flops_per_s"] == 6.6e10
        and tags["perf/prefill_tokens"] == 1200
    )
    assert {t for t in tags if t.startswith("time/")} == {
        "time/rollout_seconds",
        "time/train_seconds",
        "time/weight_sync_seconds",
        "time/prefill_s",
        "time/decode_s",
        "time/env_s",
        "time/wait_s",
        "time/forward_s",
        "time/backward_s",
        "time/optimizer_s",
    }


def test_tensorboard_gets_each_pools_trainer_memory():
    pools = {
        "p": {
            "version": 3,
            "loss": 0.1,
            "memory": {"rss_gb": 10.5, "rss_released_gb": 8.0, "rss_peak_gb": 11.0},
        }
    }
    tags = tensorboard_scalars(STEP | {"pools": pools})
    assert (
        tags["pool/p/memory/rss_gb"],
        tags["pool/p/memory/rss_released_gb"],
        tags["pool/p/memory/rss_peak_gb"],
    ) == (10.5, 8.0, 11.0)
    assert tags["pool/p/loss"] == 0.1 and not any("memory" in t for t in tensorboard_scalars(STEP))


def test_tensorboard_gets_each_pools_mismatch_figures():
    pools = {"p": {"version": 3, "mismatch": {"mismatch_kl": 0.25, "mismatch_ratio_p05": 0.75}}}
    tags = tensorboard_scalars(STEP | {"pools": pools})
    assert tags["pool/p/mismatch/mismatch_kl"] == 0.25
    assert tags["pool/p/mismatch/mismatch_ratio_p05"] == 0.75
