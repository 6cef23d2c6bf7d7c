"""trainer_svc over real gRPC: Setup, Train with version checks and idempotent replay, weights
pushed to a real rollout_svc, per-agent LoRA pushes, checkpoints that resume exactly."""

import asyncio
import dataclasses
import json

import pytest
import torch

from atgrpo import errors
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig, PoolSpec, TrainSample, UpdateConfig
from atgrpo.rpc.server import create_server
from rollout_svc.client import RolloutClient
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings as rollout_bindings
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.client import TrainerClient
from trainer_svc.server import bindings as trainer_bindings
from trainer_svc.trainer import REPLAYED, Trainer

GREEDY = Sampling(temperature=0.0, max_tokens=10)
HELLO = [{"role": "user", "content": "Tell me about the grid."}]


def pool_spec(model_dir, rollout=(), **kw) -> PoolSpec:
    base = dict(
        run_id="run1",
        pool="p",
        model_path=model_dir,
        agents=("a",),
        seed=0,
        lr=1e-3,
        weight_decay=0.0,
        warmup_steps=0,
        total_steps=10,
        min_lr_ratio=0.3,
        device="auto",
        rollout_addresses=tuple(rollout),
    )
    return PoolSpec(**{**base, **kw})


def with_services(model_dir, fn, *, lora=False):
    async def go():
        replica = Replica(
            {"p": PoolRuntime("p", HFEngine(model_dir, device="cpu", dtype="float32"), lora=lora)}
        )
        rollout = await create_server(rollout_bindings(replica, None))
        logic = Trainer()
        trainer = await create_server(trainer_bindings(trainer=logic))
        try:
            async with (
                TrainerClient(f"127.0.0.1:{trainer.port}") as t,
                RolloutClient(f"127.0.0.1:{rollout.port}") as r,
            ):
                return await fn(t, r, f"127.0.0.1:{rollout.port}", logic)
        finally:
            await trainer.stop(0)
            await rollout.stop(0)

    return asyncio.run(go())


def test_a_retried_step_is_answered_from_memory_and_only_the_last_steps_are_kept(tiny_model):
    """A run of a million steps must not hold a million results: older steps are dropped, and
    their samples are refused by version anyway, so nothing trains twice."""
    samples = on_policy_samples(load(tiny_model))

    async def go():
        t = Trainer()
        await t.setup(pool_spec(tiny_model))
        last = REPLAYED + 2
        for step in range(1, last + 1):
            assert not (await t.train("run1", step, step - 1, samples, UpdateConfig())).replayed
        assert len(t._done) == REPLAYED
        again = await t.train("run1", last, last - 1, samples, UpdateConfig())
        assert again.replayed and again.version == last
        with pytest.raises(errors.FailedPrecondition, match="drawn from version 0"):
            await t.train("run1", 1, 0, samples, UpdateConfig())

    asyncio.run(go())


def test_train_bumps_the_version_and_pushes_weights_that_change_the_rollout(tiny_model):
    samples = on_policy_samples(load(tiny_model))

    async def go(t, r, rollout_address, logic):
        with pytest.raises(errors.FailedPrecondition, match="Setup first"):
            await t.train("run1", 1, 0, samples)
        info = await t.setup(pool_spec(tiny_model, [rollout_address]))
        assert (info.version, info.run_id) == (0, "run1")
        assert (await t.setup(pool_spec(tiny_model, [rollout_address]))).version == 0  # idempotent
        with pytest.raises(errors.FailedPrecondition, match="serves run 'run1'"):
            await t.setup(pool_spec(tiny_model, run_id="other"))
        # A single small update may keep the greedy tokens; their log-probs must move.
        before = (await r.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].logprobs
        resp = await t.train("run1", 1, 0, samples)
        assert resp.version == 1 and not resp.replayed and resp.metrics["tokens"] > 0
        # The tied head is not pushed: the payload is every other weight plus a safetensors header.
        weights = sum(
            v.numel() * 4 for k, v in load(tiny_model).state_dict().items() if k != "lm_head.weight"
        )
        assert weights < resp.metrics["push_bytes"] < weights + 65536
        assert resp.agents["a"]["samples"] == len(samples)
        # Its memory after the update, what it handed back (model_thread.release_freed_memory), its
        # peak
        m = resp.metrics
        assert 0 < m["rss_gb"] <= m["rss_peak_gb"] and -0.05 < m["rss_released_gb"] < m["rss_gb"]
        # The engine's log-probs against the trainer's own, over the wire (issue 59): these
        # samples' are the same model's, so the trainer finds no mismatch
        assert m["mismatch_outside_support"] == 0.0 and m["mismatch_capped_fraction"] == 0.0
        assert m["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
        for q in ("p05", "p50", "p95"):
            assert m[f"mismatch_ratio_{q}"] == pytest.approx(1.0, abs=1e-3), q
        assert {(p.adapter, p.version) for p in await r.policies()} == {("", 1)}
        after = await r.generate("p", messages=HELLO, sampling=GREEDY)
        assert after.policy.version == 1 and after.completions[0].logprobs != before
        again = await t.train("run1", 1, 0, samples)
        assert (
            again.replayed and again.version == 1 and again.metrics["loss"] == resp.metrics["loss"]
        )
        assert (await t.get_info()).version == 1
        with pytest.raises(errors.FailedPrecondition, match="drawn from version 0"):
            await t.train("run1", 2, 0, samples)

    with_services(tiny_model, go)


def test_bad_samples_train_nothing(tiny_model):
    good = on_policy_samples(load(tiny_model), n=2)
    bad = [*good, TrainSample("a", [1, 2], [3], [0.0, 0.0], 0.1)]

    async def go(t, r, rollout_address, logic):
        # the run's budget, below the flag's
        await t.setup(pool_spec(tiny_model, micro_batch_tokens=1000))
        with pytest.raises(errors.InvalidArgument, match="sample 2"):
            await t.train("run1", 1, 0, bad)
        with pytest.raises(errors.InvalidArgument, match="not 'zed'"):
            await t.train("run1", 1, 0, [TrainSample("zed", [1], [2], [0.0], 1.0)])
        with pytest.raises(errors.InvalidArgument, match="over the trainer's micro-batch budget"):
            await t.train("run1", 1, 0, [TrainSample("a", [1] * 1500, [2], [0.0], 1.0)])
        assert (await t.get_info()).version == 0
        assert (await t.train("run1", 1, 0, good)).version == 1  # the same step, now valid

    with_services(tiny_model, go)


def test_lora_pool_trains_only_the_trained_agents_adapter_and_pushes_all_at_the_pools_version(
    tiny_model,
):
    async def go(t, r, rollout_address, logic):
        await t.setup(
            pool_spec(
                tiny_model,
                [rollout_address],
                agents=("tool", "plan"),
                specialization="lora",
                lora_rank=4,
                lora_alpha=8,
                lora_targets=("q_proj", "v_proj"),
            )
        )
        # Setup pushed every fresh adapter at version 0, so Collect can sample each agent at once.
        assert {(p.adapter, p.version) for p in await r.policies()} == {
            ("", 0),
            ("tool", 0),
            ("plan", 0),
        }
        fresh = await r.generate("p", adapter="tool", messages=HELLO, sampling=GREEDY)
        base0 = await r.generate("p", messages=HELLO, sampling=GREEDY)
        # B = 0
        assert fresh.completions[0].logprobs == pytest.approx(
            base0.completions[0].logprobs, abs=1e-5
        )
        samples = on_policy_samples(load(tiny_model), agents=("plan",))
        resp = await t.train("run1", 1, 0, samples)
        assert resp.version == 1 and set(resp.agents) == {"plan"}
        # Every adapter is at the pool's version (what Collect pins); the untrained one is
        # unchanged.
        assert {(p.adapter, p.version) for p in await r.policies()} == {
            ("", 0),
            ("tool", 1),
            ("plan", 1),
        }
        tool = await r.generate("p", adapter="tool", messages=HELLO, sampling=GREEDY)
        assert tool.completions[0].logprobs == fresh.completions[0].logprobs
        base = (await r.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].logprobs
        plan = await r.generate("p", adapter="plan", messages=HELLO, sampling=GREEDY)
        assert plan.policy.version == 1 and plan.completions[0].logprobs != base

    with_services(tiny_model, go, lora=True)


def test_kl_to_the_initial_weights_only_when_asked_and_samples_of_old_weights_are_refused(
    tiny_model,
):
    samples = on_policy_samples(load(tiny_model))

    async def go(t, r, rollout_address, logic):
        await t.setup(pool_spec(tiny_model, [rollout_address]))
        plain = await t.train(
            "run1", 1, 0, [dataclasses.replace(s, policy_version=0) for s in samples]
        )
        # nothing held at kl_coef 0
        assert "kl_ref" not in plain.metrics and logic.state._reference is None
        assert plain.metrics["staleness_max"] == 0
        with pytest.raises(
            errors.FailedPrecondition,
            match="drawn from version 0, but this run trains only on version 1",
        ):
            await t.train("run1", 2, 1, [dataclasses.replace(s, policy_version=0) for s in samples])
        kl = await t.train("run1", 2, 1, samples, UpdateConfig(loss=LossConfig(kl_coef=0.1)))
        # one update from the initial weights
        assert kl.metrics["kl_ref"] > 0 and logic.state._reference is not None
        assert kl.version == 2

    with_services(tiny_model, go)


def test_checkpoint_round_trip_and_exact_resume(tiny_model, tmp_path):
    s1 = on_policy_samples(load(tiny_model), seed=1)
    s2 = on_policy_samples(load(tiny_model), seed=2)

    async def first(t, r, rollout_address, logic):
        await t.setup(
            pool_spec(tiny_model, checkpoint_dir=str(tmp_path), checkpoint_every_updates=2)
        )
        await t.train("run1", 1, 0, s1)
        saved = await t.save_checkpoint()
        assert saved.path == str(tmp_path / "version-1") and saved.version == 1
        await t.train("run1", 2, 1, s2)
        assert (tmp_path / "version-2" / "atgrpo.json").exists()  # every 2 updates, unasked
        return saved.path, _params(logic)

    async def resumed(t, r, rollout_address, logic):
        info = await t.setup(pool_spec(tiny_model, [rollout_address]), resume_from=ckpt)
        assert info.version == 1
        # replica caught up
        assert {(p.adapter, p.version) for p in await r.policies()} == {("", 1)}
        await t.train("run1", 2, 1, s2)
        return _params(logic)

    ckpt, uninterrupted = with_services(tiny_model, first)
    again = with_services(tiny_model, resumed)
    assert all(torch.equal(uninterrupted[k], again[k]) for k in uninterrupted)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(f"{ckpt}/model") is not None


def test_a_restarted_trainer_takes_replicas_back_to_a_version_0_checkpoint(tiny_model, tmp_path):
    """The run's first checkpoint is version 0; the replicas kept serving version 1 while the
    trainer restarted: the restored trainer must push its weights, though a replica starts at v0."""
    samples = on_policy_samples(load(tiny_model))

    async def go(t, r, rollout_address, logic):
        await t.setup(pool_spec(tiny_model, [rollout_address]))
        ckpt = (await t.save_checkpoint(str(tmp_path / "step-0"))).path
        await t.train("run1", 1, 0, samples)
        assert {(p.adapter, p.version) for p in await r.policies()} == {("", 1)}
        restarted = await create_server(trainer_bindings(trainer=Trainer()))
        try:
            async with TrainerClient(f"127.0.0.1:{restarted.port}") as again:
                assert (
                    await again.setup(pool_spec(tiny_model, [rollout_address]), resume_from=ckpt)
                ).version == 0
        finally:
            await restarted.stop(0)
        assert {(p.adapter, p.version) for p in await r.policies()} == {("", 0)}

    with_services(tiny_model, go)


class _Payload:
    """Unpickling this runs os.system: what a booby-trapped checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_unrun(tiny_model, tmp_path):
    async def save(t, r, rollout_address, logic):
        await t.setup(pool_spec(tiny_model))
        return (await t.save_checkpoint(str(tmp_path / "ckpt"))).path

    ckpt = with_services(tiny_model, save)
    # what atgrpo writes loads safely
    state = torch.load(f"{ckpt}/trainer_state.pt", weights_only=True)
    marker = tmp_path / "ran"
    torch.save({**state, "extra": _Payload(marker)}, f"{ckpt}/trainer_state.pt")

    async def resume(t, r, rollout_address, logic):
        with pytest.raises(errors.InvalidArgument, match="could run code on load"):
            await t.setup(pool_spec(tiny_model), resume_from=ckpt)

    with_services(tiny_model, resume)
    assert not marker.exists()


def _params(logic):
    # The trainer runs in this process: read its model directly for a bitwise comparison.
    return {k: v.clone() for k, v in logic.state.model.state_dict().items()}


def _du(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoint_bytes_is_what_a_save_writes(tiny_model, tmp_path, dtype):
    """GetInfo's checkpoint_bytes sizes the save's deadline and `atgrpo plan`'s disk: after an
    update (AdamW's moments exist), it is what SaveCheckpoint writes, to within the files'
    headers."""
    samples = on_policy_samples(load(tiny_model))

    async def go(t, r, rollout_address, logic):
        assert (await t.get_info()).checkpoint_bytes == 0  # no pool yet
        await t.setup(pool_spec(tiny_model, dtype=dtype))
        await t.train("run1", 1, 0, samples)
        return (await t.get_info()).checkpoint_bytes, (
            await t.save_checkpoint(str(tmp_path / "c"))
        ).path

    expected, path = with_services(tiny_model, go)
    written = _du(tmp_path / "c")
    assert expected > 0 and abs(written - expected) / expected < 0.05, (written, expected)


def test_delete_checkpoint_deletes_only_this_runs_checkpoints(tiny_model, tmp_path):
    async def go(t, r, rollout_address, logic):
        await t.setup(pool_spec(tiny_model))
        ours = (await t.save_checkpoint(str(tmp_path / "checkpoints" / "step-000002" / "p"))).path
        other_pool = tmp_path / "checkpoints" / "step-000002" / "q"
        (other_pool / "model").mkdir(parents=True)
        stray = tmp_path / "notes"
        stray.mkdir()
        (stray / "keep.txt").write_text("mine")
        with pytest.raises(
            errors.FailedPrecondition, match="not a checkpoint of run 'run1', pool 'p'"
        ):
            await t.delete_checkpoint(str(stray))
        with pytest.raises(errors.FailedPrecondition, match="not a checkpoint"):
            await t.delete_checkpoint(str(other_pool))
        with pytest.raises(errors.InvalidArgument, match="needs dir"):
            await t.delete_checkpoint("")
        assert await t.delete_checkpoint(ours) is True
        assert not (tmp_path / "checkpoints" / "step-000002" / "p").exists()
        assert other_pool.exists()  # the step folder stays while it holds another
        assert await t.delete_checkpoint(ours) is False  # already gone: a retry is harmless
        assert (stray / "keep.txt").read_text() == "mine"

        other_run = (
            await t.save_checkpoint(str(tmp_path / "checkpoints" / "step-000004" / "p"))
        ).path
        meta = json.loads(
            (tmp_path / "checkpoints" / "step-000004" / "p" / "atgrpo.json").read_text()
        )
        meta["spec"]["run_id"] = "another-run"
        (tmp_path / "checkpoints" / "step-000004" / "p" / "atgrpo.json").write_text(
            json.dumps(meta)
        )
        with pytest.raises(errors.FailedPrecondition, match="not a checkpoint of run 'run1'"):
            await t.delete_checkpoint(other_run)
        meta["spec"]["run_id"] = "run1"
        (tmp_path / "checkpoints" / "step-000004" / "p" / "atgrpo.json").write_text(
            json.dumps(meta)
        )
        assert await t.delete_checkpoint(other_run) is True
        assert not (tmp_path / "checkpoints" / "step-000004").exists()  # emptied: it goes too

    with_services(tiny_model, go)


def test_a_rollback_to_the_start_reloads_the_model_at_model_path(tiny_model):
    """Setup with reload and no resume_from: a trainer that kept its weights goes back to version 0
    and the starting weights (the router's rollback before the first checkpoint)."""
    samples = on_policy_samples(load(tiny_model))

    async def go(t, r, rollout_address, logic):
        await t.setup(pool_spec(tiny_model, [rollout_address]))
        start = _params(logic)
        await t.train("run1", 1, 0, samples)
        # a repeat keeps it
        assert (await t.setup(pool_spec(tiny_model, [rollout_address]))).version == 1
        info = await t.setup(pool_spec(tiny_model, [rollout_address]), reload=True)
        assert info.version == 0 and all(
            torch.equal(start[k], v) for k, v in _params(logic).items()
        )
        assert {(p.adapter, p.version) for p in await r.policies()} == {("", 0)}

    with_services(tiny_model, go)


def test_an_async_update_takes_stale_samples_over_the_wire_and_reports_their_staleness(tiny_model):
    from prometheus_client import REGISTRY

    samples = on_policy_samples(load(tiny_model))
    labels = {"run": "run1", "pool": "p"}

    def value(name):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    async def go(t, r, rollout_address, logic):
        await t.setup(pool_spec(tiny_model))
        await t.train("run1", 1, 0, [dataclasses.replace(s, policy_version=0) for s in samples])
        seen, busy = (
            value("atgrpo_trainer_sample_staleness_count"),
            value("atgrpo_trainer_busy_seconds_total"),
        )
        lagging = value("atgrpo_trainer_sample_staleness_sum")
        # Step 2 at version 1: half the samples from version 0 (max_staleness travels in
        # UpdateParams).
        mixed = [dataclasses.replace(s, policy_version=i % 2) for i, s in enumerate(samples)]
        resp = await t.train("run1", 2, 1, mixed, UpdateConfig(max_staleness=1))
        assert resp.version == 2
        assert resp.metrics["staleness_max"] == 1 and resp.metrics["staleness_mean"] == 0.5
        assert value("atgrpo_trainer_sample_staleness_count") == seen + len(samples)
        assert value("atgrpo_trainer_sample_staleness_sum") == lagging + len(samples) / 2
        assert value("atgrpo_trainer_busy_seconds_total") > busy
        # Version 0 is now 2 behind: refused whole, nothing trained.
        with pytest.raises(errors.FailedPrecondition, match="2 versions behind version 2"):
            await t.train("run1", 3, 2, mixed, UpdateConfig(max_staleness=1))
        assert (await t.get_info()).version == 2

    with_services(tiny_model, go)
