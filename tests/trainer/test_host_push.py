"""A push from an FSDP pool over two gloo ranks brings the model onto rank 0's host tensor by
tensor, cast before it is gathered (sharding.host_state): rank 0's peak is the bf16 payload and
about one tensor more, never the float32 model, and the payload is the same bits as gathering the
float32 model first and casting it on the host (the path it replaced)."""

import json
import subprocess

from tests.conftest import ROOT
from tests.trainer.test_distributed import torchrun_args, torchrun_env

MiB = 2**20
# Chunks the payload keeps for slower streams (4 x 4 MiB), gloo's buffers, the allocator's slack.
SLACK = 32 * MiB


def test_rank_0_holds_the_cast_model_and_one_tensor_not_the_float32_one(tmp_path):
    out = tmp_path / "push.json"
    # 8 layers of hidden 512, vocabulary 8192, untied: 134 MB in float32, 67 MB in bf16, its
    # largest tensor (an embedding) 17 MB
    run = subprocess.run(
        [*torchrun_args(), str(ROOT / "bench" / "_host_push.py"), str(out), "512", "8", "8192"],
        env={**torchrun_env(), "MALLOC_MMAP_THRESHOLD_": "65536"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["dtypes"] == ["torch.bfloat16"]
    assert got["same_tensors"] and got["same_digest"]
    bound = got["bf16_bytes"] + got["largest_fp32_bytes"] + SLACK
    assert bound < got["fp32_bytes"]  # the bound excludes holding the float32 model at all
    assert got["device_peak"] <= bound, got
    # the baseline did hold it, and its cast on top
    assert got["host_peak"] >= got["fp32_bytes"] + got["bf16_bytes"] - SLACK, got
