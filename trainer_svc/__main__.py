"""python -m trainer_svc: serve one model pool's trainer until SIGTERM."""

from atgrpo.rpc.main import base_parser, run_service
from trainer_svc.server import bindings

if __name__ == "__main__":
    parser = base_parser("trainer")
    parser.add_argument("--pool", default="", help="the model pool this trainer owns")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192,
                        help="token budget of one forward/backward micro-batch")
    run_service("trainer", bindings, parser=parser)
