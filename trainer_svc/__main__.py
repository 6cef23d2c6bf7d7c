"""python -m trainer_svc: serve one model pool's trainer until SIGTERM.

One process trains the pool on one device. `torchrun --nproc-per-node N -m trainer_svc ...`
spreads it over N ranks (GPUs): rank 0 serves gRPC and drives, the others follow it
(distributed.py); `--sharding` picks how the model is laid out over them (sharding.py).
"""

import logging
import os
import sys

from atgrpo.rpc.main import base_parser, run_service
from trainer_svc import distributed
from trainer_svc.server import bindings
from trainer_svc.sharding import SHARDINGS
from trainer_svc.trainer import PoolOps


def parser():
    ap = base_parser("trainer")
    ap.add_argument("--pool", default="", help="the model pool this trainer owns")
    ap.add_argument("--micro-batch-tokens", type=int, default=8192,
                    help="token budget of one forward/backward micro-batch")
    ap.add_argument("--sharding", choices=SHARDINGS, default=os.environ.get("ATGRPO_TRAINER_SHARDING", "auto"),
                    help="layout over torchrun ranks: fsdp shards a full fine-tuning model, ddp replicates it; "
                         "auto = fsdp for full fine-tuning, ddp for LoRA pools (one rank: no sharding)")
    return ap


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    ranks = distributed.init_from_env()
    if ranks is None:
        run_service("trainer", bindings, parser=ap)
        return 0
    if ranks.rank != 0:
        logging.basicConfig(level=args.log_level.upper(),
                            format=f"%(asctime)s trainer[rank {ranks.rank}] %(levelname)s %(name)s: %(message)s")
        return distributed.run_follower(ranks, PoolOps(args.sharding), args.grace_s)
    try:
        run_service("trainer", lambda a: bindings(a, ranks=ranks), parser=ap)
    finally:
        stopped = distributed.stop_followers(ranks, args.grace_s + 5.0)
    if not stopped:
        logging.shutdown()
        os._exit(1)   # a thread is stuck sending to a dead rank: the interpreter could not unwind it
    return 0


if __name__ == "__main__":
    sys.exit(main())
