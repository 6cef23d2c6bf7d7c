"""One rank of the data-parallel update test: `torchrun --nproc-per-node 2 dist_worker.py MODEL OUT`."""

import sys

import torch
import torch.distributed as dist

from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.update import UpdateConfig, update


def main(model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    model = load(model_dir)
    samples = on_policy_samples(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    metrics = update(model, opt, samples, UpdateConfig(mini_batch_size=8), params=params,
                     generator=torch.Generator().manual_seed(1))
    if dist.get_rank() == 0:
        torch.save({"state": model.state_dict(), "metrics": metrics}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
