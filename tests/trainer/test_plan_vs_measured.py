"""atgrpo plan's trainer estimate against the peak memory one real update measures on CPU, at two
model sizes (issue 19: within 25%).

Each measurement runs in a fresh process (peak_worker.py: a randomly initialised Qwen3-shaped
model, float32 as a CPU pool runs by default, checkpointing off as on CPU by default, AdamW, two
optimizer steps so that the second forward and backward run with the optimizer state allocated);
its peak is the resident set's high-water mark less the resident set before the model was built.

What the measurements taught the formula (atgrpo/plan.py): the log-prob path scores response
positions only (the old estimate counted a pass of every micro-batch token, 25% over at the
larger size); with that, weights + gradients + AdamW moments + saved activations + one pass's
float32 temporaries, summed, measured (2 cores, torch 2.13): h256 158.0 MiB estimated against
196.5 measured (0.80x), h512 648.1 against 668.9 (0.97x). The small model's 38 MiB not counted
is not yet explained (the sampling transform's int64 sort indices and CPU SDPA's attention
temporaries are candidates; both weigh more at small sizes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from atgrpo.config import AlgorithmConfig, PoolConfig
from atgrpo.plan import ModelShape, trainer_components
from tests.conftest import ROOT

SIZES = {
    "h256-L2-v4096": {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 4096, "tie_word_embeddings": True},
    "h512-L4-v8192": {"hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 4,
                      "head_dim": 64, "num_hidden_layers": 4, "vocab_size": 8192, "tie_word_embeddings": False},
}
ROWS, PROMPT, RESPONSE = 4, 64, 192
TOKENS = ROWS * (PROMPT + RESPONSE)   # one micro-batch per optimizer step


def measure(config: dict) -> int:
    spec = {"config": config, "dtype": "float32", "rows": ROWS, "prompt": PROMPT, "response": RESPONSE,
            "micro_batch_tokens": TOKENS, "checkpointing": False}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "trainer" / "peak_worker.py"), json.dumps(spec)],
                         env=env, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])["peak"]


@pytest.mark.slow
@pytest.mark.parametrize("size", sorted(SIZES))
def test_trainer_estimate_within_25_percent_of_the_measured_peak(size):
    pool = PoolConfig(model_path="x", device="cpu", dtype="float32", micro_batch_tokens=TOKENS)
    parts = trainer_components(ModelShape.from_config(SIZES[size]), pool, AlgorithmConfig(), "cpu",
                               tokens=TOKENS, response_tokens=ROWS * RESPONSE)
    estimate = sum(parts.values())
    measured = measure(SIZES[size])
    print(f"{size}: estimated {estimate / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB "
          f"({estimate / measured:.2f}x); {({k: round(v / 2**20, 1) for k, v in parts.items() if v})}")
    assert abs(estimate - measured) <= 0.25 * measured
