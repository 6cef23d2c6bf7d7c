"""One rank of the FSDP start-up memory test: `torchrun --nproc-per-node 2 rss_worker.py MODEL OUT`.
Each rank sets up a sharded pool and writes how much its peak RSS grew while it did."""

import json
import os
import resource
import sys

import psutil
import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

from atgrpo.contract.trainer import PoolSpec
from trainer_svc.state import PoolState


def main(model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    # imports the model's code first: its memory is no copy of the weights
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    before = psutil.Process().memory_info().rss
    state = PoolState(
        PoolSpec(
            run_id="r", pool="p", model_path=model_dir, agents=("a",), device="cpu", dtype="float32"
        ),
        "fsdp",
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    held = sum(p.to_local().numel() * p.element_size() for p in state.model.parameters())
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump({"grew": peak - before, "shard_bytes": held}, f)
    dist.barrier()  # leave together (see dist_worker.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown of gloo objects (see dist_worker.py)
