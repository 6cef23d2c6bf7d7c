"""A checkpoint resumes on a machine other than the one that wrote it, without being read whole.

A checkpoint written on a GPU holds CUDA tensors; read without a map location it cannot be loaded
where there is no GPU, and on a torchrun pool every rank mapped it onto GPU 0. Read without mmap,
every rank of an 8B pool read ~98 GB into host memory. There is no GPU here: while `written_on_gpu`
is on, torch.save tags every CPU storage "cuda:0" exactly as a GPU's are tagged (a fake that pins
the rule: the file is what a GPU pool writes, as far as loading can tell)."""

import pytest
import torch

from atgrpo.contract.trainer import UpdateConfig
from tests.trainer.test_trainer_service import pool_spec
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.ops import PoolOps
from trainer_svc.state import TRAINER_STATE, read_trainer_state

CFG = UpdateConfig(mini_batch_size=4)


@pytest.fixture
def written_on_gpu():
    on = [False]

    def tag(storage):
        return "cuda:0" if on[0] and storage.device.type == "cpu" else None

    torch.serialization.register_package(0, tag, lambda storage, location: None)
    yield on
    torch.serialization._package_registry[:] = [
        e for e in torch.serialization._package_registry if e[1] is not tag
    ]


def trained(model_dir, *batches, resume_from=""):
    ops = PoolOps()
    ops.setup(pool_spec(model_dir), resume_from=resume_from)
    for samples in batches:
        ops.train(samples, CFG)
    return ops


def test_a_gpu_written_checkpoint_resumes_exactly_on_the_cpu(tiny_model, tmp_path, written_on_gpu):
    s1, s2 = (on_policy_samples(load(tiny_model), seed=s) for s in (1, 2))
    ops = trained(tiny_model, s1)
    written_on_gpu[0] = True
    ops.save(str(tmp_path / "ckpt"))
    written_on_gpu[0] = False
    # what the file is: GPU tensors, as a plain load sees them
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(tmp_path / "ckpt" / TRAINER_STATE, weights_only=True)

    ops.train(s2, CFG)
    resumed = trained(tiny_model, s2, resume_from=str(tmp_path / "ckpt"))
    assert resumed.state.version == ops.state.version == 2
    one, two = ops.state.model.state_dict(), resumed.state.model.state_dict()
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_trainer_state_is_read_on_the_cpu_mapped_from_its_file(tiny_model, tmp_path):
    trained(tiny_model, on_policy_samples(load(tiny_model), seed=1)).save(str(tmp_path / "ckpt"))
    state = read_trainer_state(tmp_path / "ckpt" / TRAINER_STATE)
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.numel() > 1]
    assert moments and all(t.device.type == "cpu" for t in moments)
    # mapped: every tensor's memory lies in a mapping of the file (its pages are read as touched)
    maps = file_mappings(tmp_path / "ckpt" / TRAINER_STATE)
    assert maps and all(any(lo <= t.data_ptr() < hi for lo, hi in maps) for t in moments)


def file_mappings(path) -> list[tuple[int, int]]:
    """The address ranges this process maps from `path` (Linux's /proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(path):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi))
    return out
