"""One rank of the GPU check's two_gpu part (gpu_check_parts.check_two_gpu runs it under
`torchrun --standalone --nproc-per-node 2`): the trainer's own code over two ranks (FSDP2, NCCL on
GPUs, gloo on the CPU), as a pool over two GPUs runs it. One update; the full weights gathered to
rank 0 and pushed into an hf-engine replica there; a DCP checkpoint; a fresh pool resumed from it,
whose weights must equal the saved ones. Rank 0 writes the figures to the JSON file named in its
argument."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def main(cfg: dict) -> None:
    import gpu_check_fixtures as g
    import torch
    from gpu_check_wheels import imported_wheels

    from trainer_svc import distributed
    from trainer_svc.ops import PoolOps
    from trainer_svc.sharding import host_state

    args = argparse.Namespace(**cfg)
    ranks = distributed.init_from_env()
    cuda = args.device.startswith("cuda")
    run, name, pool = g.example_pool(args)
    path = Path(cfg["model"])
    ops = g.setup_pool(args, path, name, pool)
    out: dict = {"ranks": ranks.world_size, "layout": ops.state.layout}
    per_sample = min(args.sample_tokens, pool.micro_batch_tokens)
    vocab = g.model_config(args.size)["vocab_size"]
    samples = g.samples_for(per_sample, 2 * max(1, pool.micro_batch_tokens // per_sample), vocab)
    update = dataclasses.replace(run.update_for(name), mini_batch_size=len(samples))

    def timed(fn, *a):
        t0 = time.monotonic()
        result = fn(*a)
        if cuda:
            torch.cuda.synchronize()
        return result, round(time.monotonic() - t0, 3)

    metrics, out["update_s"] = timed(ops.train, samples, update)
    out["loss"] = metrics.get("loss")
    out["tokens_per_s"] = round(sum(len(s.response_ids) for s in samples) / out["update_s"], 1)
    weights, out["gather_s"] = timed(ops.weights, ("a",))
    if ranks.rank == 0:
        from rollout_svc.engines.hf import HFEngine

        engine = HFEngine(
            str(path), device=ops.state.device, dtype="float32" if not cuda else "bfloat16"
        )
        out["push"] = g.push_state(engine, weights[0][1])
        del engine
    del weights
    saved, out["save_s"] = timed(ops.save, str(Path(cfg["work"]) / "two_gpu_ckpt"))
    before = host_state(ops.state.model, None)
    resumed = PoolOps()
    _, out["resume_s"] = timed(resumed.setup, ops.state.spec, str(saved))
    after = host_state(resumed.state.model, None)
    if ranks.rank == 0:
        out["resumed_version"] = resumed.state.version
        out["resume_max_abs_diff"] = max(
            float((after[k].float() - before[k].float()).abs().max()) for k in before
        )
        Path(cfg["out"]).write_text(json.dumps({**out, "wheels": imported_wheels()}))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # skip torch's gloo teardown at exit (see tests/trainer/dist_worker.py)
