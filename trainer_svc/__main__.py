"""python -m trainer_svc: serve one model pool's trainer until SIGTERM.

One process trains the pool on one device. `torchrun --nproc-per-node N -m trainer_svc ...`
spreads it over N ranks (GPUs): rank 0 serves gRPC and drives, the others follow it
(distributed.py); `--sharding` picks how the model is laid out over them (sharding.py).
"""

import logging
import os
import sys

# CUDA's caching allocator reads this once, when it starts: so before torch loads (below). Samples
# of varying lengths leave cached blocks of many sizes; with expandable segments the allocator grows
# one mapping instead, and reserved memory stays near allocated over a long run (on a GPU; nothing
# on a CPU). An operator's own setting wins.
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault(*ALLOC_CONF)

from atgrpo.malloc import keep_freed_memory  # noqa: E402
from atgrpo.rpc.main import parse, serve_service, skip_exit_collection  # noqa: E402
from trainer_svc import distributed  # noqa: E402
from trainer_svc.ops import PoolOps  # noqa: E402
from trainer_svc.server import bindings  # noqa: E402
from trainer_svc.settings import TrainerSettings  # noqa: E402


def main() -> int:
    serve, settings = parse("trainer", TrainerSettings)
    keep_freed_memory()  # an update's MB-sized activations: reused, not faulted in again
    ranks = distributed.init_from_env(settings.collective_timeout_s)
    if ranks is None:
        serve_service("trainer", serve, lambda: bindings(settings))
        return 0
    if ranks.rank != 0:
        logging.basicConfig(
            level=serve.log_level,
            format=f"%(asctime)s trainer[rank {ranks.rank}] %(levelname)s %(name)s: %(message)s",
        )
        try:
            return distributed.run_follower(
                ranks, PoolOps(settings.sharding, settings.micro_batch_tokens), serve.grace_s
            )
        finally:
            skip_exit_collection()
    try:
        serve_service("trainer", serve, lambda: bindings(settings, ranks=ranks))
    finally:
        stopped = distributed.stop_followers(ranks, serve.grace_s + 5.0)
    if not stopped:
        logging.shutdown()
        os._exit(1)  # a thread is stuck sending to a dead rank: the interpreter could not unwind it
    return 0


if __name__ == "__main__":
    sys.exit(main())
