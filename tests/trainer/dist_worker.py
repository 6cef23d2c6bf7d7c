"""One rank of the multi-rank update tests:
`torchrun --nproc-per-node 2 dist_worker.py MODEL OUT {ddp,fsdp,hsdp} MINI_BATCH
MICRO_BATCH_TOKENS [ckpt] [stale] [bf16]`
(ckpt: gradient checkpointing on, set before FSDP wraps the layers, as PoolState does; stale:
max_staleness 1 on samples of mixed staleness, so the proximal pass runs on every rank; bf16: mixed
precision, FSDP's own policy under fsdp, autocast otherwise).
Rank 0 saves the full parameters (gathered from the shards under fsdp) and the metrics."""

import os
import sys

import torch
import torch.distributed as dist

from atgrpo.contract.trainer import UpdateConfig
from tests.trainer.test_update import load, on_policy_samples
from tests.trainer.test_update_async import mixed_staleness
from trainer_svc.loading import enable_checkpointing
from trainer_svc.logprobs import chunked_head_available
from trainer_svc.sharding import SHARDED, host_state, shard
from trainer_svc.update import update
from trainer_svc.update_context import TrainerUpdateSettings

SIMULATED_PER_NODE = "ATGRPO_TEST_RANKS_PER_NODE"
NO_CLIP = 1e9  # clipping would normalise a wrongly scaled gradient back to the right update


def main(
    model_dir: str,
    out: str,
    sharding: str,
    mini_batch: int,
    micro_tokens: int,
    ckpt: bool,
    stale: bool,
    bf16: bool,
) -> None:
    dist.init_process_group("gloo")
    # torchrun on one machine makes one node; the hsdp tests split its ranks into simulated nodes
    if SIMULATED_PER_NODE in os.environ:
        os.environ["LOCAL_WORLD_SIZE"] = os.environ[SIMULATED_PER_NODE]
    model = load(model_dir)
    samples = mixed_staleness(on_policy_samples(model)) if stale else on_policy_samples(model)
    if ckpt:
        enable_checkpointing(model)
    sharded = sharding in SHARDED
    if sharded:  # hsdp: "nodes" of LOCAL_WORLD_SIZE ranks (the test sets it; one machine)
        shard(model, "cpu", mixed_bf16=bf16, layout=sharding)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1)
    cfg = UpdateConfig(mini_batch_size=mini_batch, max_staleness=int(stale))
    settings = TrainerUpdateSettings(
        micro_batch_tokens=micro_tokens,
        grad_clip=NO_CLIP,
        autocast_bf16=bf16 and not sharded,
    )
    g = torch.Generator().manual_seed(1)
    metrics = update(model, opt, samples, cfg, params=params, settings=settings, generator=g)
    state = host_state(model, None)
    weight = model.model.embed_tokens.weight  # a DTensor when sharded: its mesh and placements
    mesh = (tuple(weight.device_mesh.shape), [str(p) for p in weight.placements]) if sharded else ()
    if dist.get_rank() == 0:
        chunked = chunked_head_available(model)
        torch.save({"state": state, "metrics": metrics, "chunked": chunked, "mesh": mesh}, out)
    # leave together: a rank tearing down its gloo pairs while another still uses them aborts it
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        int(sys.argv[5]),
        "ckpt" in sys.argv[6:],
        "stale" in sys.argv[6:],
        "bf16" in sys.argv[6:],
    )
    # Skip the interpreter's teardown: torch's gloo objects destroyed there aborted a rank now and
    # then under load ("terminate called without an active exception", SIGABRT) after its work was
    # done. Everything this rank had to do is written and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
