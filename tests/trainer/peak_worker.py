"""One measurement of the trainer-vs-plan test: `python peak_worker.py SPEC_JSON` prints the peak
memory of one real update (trainer_svc.update.update, AdamW, two optimizer steps) of a randomly
initialised Qwen3-shaped model on CPU, as JSON.

SPEC_JSON: {"config": Qwen3Config kwargs, "dtype": "float32" | "bfloat16", "rows": R,
"prompt": P, "response": T, "micro_batch_tokens": M, "checkpointing": bool}.

How: glibc hands every freed block over 64 KiB back to the system (MALLOC_MMAP_THRESHOLD_, set by
the caller), so the resident set follows torch's allocations. A warm-up update of a one-layer model
of the same shape first pages in the code and torch's lazy state, then the high-water mark (VmHWM)
is reset to the resident set (/proc/self/clear_refs) and the model is built, as PoolState builds it
(float32 masters under bf16, which then runs under autocast), and updated. The peak is VmHWM minus
the resident set before the model existed: weights, gradients, optimizer state, activations,
log-prob temporaries, all of it.
"""

import gc
import json
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig, TrainSample, UpdateConfig
from trainer_svc.update import update
from trainer_svc.update_context import TrainerUpdateSettings


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _run(spec: dict, layers: int | None = None) -> None:
    torch.manual_seed(0)
    config = dict(spec["config"], **({"num_hidden_layers": layers} if layers else {}))
    # masters float32 under bf16 (loading.weight_dtype)
    model = Qwen3ForCausalLM(Qwen3Config(**config)).float()
    if spec["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    vocab, rows = config["vocab_size"], spec["rows"]
    gen = torch.Generator().manual_seed(1)
    sampling = Sampling(temperature=1.0, top_k=20, top_p=0.9)  # the GPU examples' transform
    samples = [
        TrainSample(
            agent="a",
            prompt_ids=torch.randint(0, vocab, (spec["prompt"],), generator=gen).tolist(),
            response_ids=torch.randint(0, vocab, (spec["response"],), generator=gen).tolist(),
            old_logprobs=[-1.0] * spec["response"],
            advantage=1.0 if i % 2 else -1.0,
            sampling=sampling,
        )
        for i in range(2 * rows)
    ]
    cfg = UpdateConfig(loss=LossConfig(), mini_batch_size=rows)
    settings = TrainerUpdateSettings(
        micro_batch_tokens=spec["micro_batch_tokens"], autocast_bf16=spec["dtype"] == "bfloat16"
    )
    # two optimizer steps
    update(model, optimizer, samples, cfg, params=params, settings=settings, device="cpu")


def main(spec: dict) -> dict:
    torch.set_num_threads(1)
    _run(spec, layers=1)  # warm-up: code paged in, lazy state built
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    _run(spec)
    return {"peak": _status("VmHWM") - before}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
