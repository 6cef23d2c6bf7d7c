"""rollout_svc with the tiny model, served over real gRPC for one test (`serve`), and what the
rollout tests send it: greedy sampling, a prompt, perturbed full weights and a LoRA adapter."""

import asyncio
import json

import torch

from atgrpo.contract.sampling import Sampling
from atgrpo.rpc.server import create_server
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.client import RolloutClient
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings
from tests.rollout.scripted import PickEnv

GREEDY = Sampling(temperature=0.0, max_tokens=12)
HELLO = [{"role": "user", "content": "Say something about grids."}]


def serve(model_dir, fn, *, lora=False, dtype="float32", continuous=True):
    async def go():
        engine = HFEngine(model_dir, device="cpu", dtype=dtype, continuous=continuous)
        replica = Replica({"p": PoolRuntime("p", engine, lora=lora)})
        registry = Registry(discover=False)
        registry.register(PickEnv)
        running = await create_server(bindings(replica, LocalEnvs(EnvHost(registry))))
        try:
            async with RolloutClient(f"127.0.0.1:{running.port}") as c:
                return await fn(c, engine)
        finally:
            await running.stop(0)

    return asyncio.run(go())


def _perturbed(engine, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * torch.randn(v.shape, generator=g)
        for k, v in engine.model.state_dict().items()
    }


def _adapter(model_dir, seed):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)
    state = get_peft_model_state_dict(model)
    return {k: v * 5 for k, v in state.items()}, json.loads(json.dumps(cfg.to_dict(), default=list))
