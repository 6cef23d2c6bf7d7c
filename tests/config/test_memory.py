"""atgrpo.memory, atgrpo.memory_rollout and atgrpo.model_shape: a model's sizes and the memory and
disk figures, checked against numbers worked out by hand. A run's plan built from them, and the
pool settings `atgrpo plan` reads, are test_sizing.py's."""

from __future__ import annotations

import json
import re

from atgrpo.config import AlgorithmConfig, LoraConfig, PoolConfig
from atgrpo.contract.trainer import LossConfig, UpdateConfig
from atgrpo.memory import (
    GPU_RUNTIME_BYTES,
    HEAD_GRAD_ROWS,
    LOGPROB_CHUNK_ELEMENTS,
    LOGPROB_CHUNK_TOKENS,
    GiB,
    activation_bytes,
    activation_bytes_per_token_layer,
    checkpoint_bytes,
    logprob_pass_elements,
    matmul_params,
    push_bytes,
    trainer_components,
    trainer_host_bytes,
    trainer_peak,
    trainer_peak_bytes,
)
from atgrpo.memory_rollout import (
    ROLLOUT_RUNTIME_BYTES,
    rollout_components,
    rollout_full_kv_bytes,
)
from atgrpo.model_shape import ModelShape, find_model_config, load_shape
from tests.conftest import ROOT

# A small decoder whose figures are easy to work out by hand:
# h 64, i 128, 2 layers, 4 heads x 16 (a 64), 2 kv heads x 16 (kv 32), vocab 1000, tied.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "tie_word_embeddings": True,
}
# one layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + 3 MLP 64*128 = 36,864; norms 2*64 + 2*16 = 160
SMALL_LAYER = 37_024
SMALL_PARAMS = 2 * SMALL_LAYER + 1000 * 64 + 64  # layers + tied embedding + final norm = 138,112
# bf16 autocast over float32 masters: 26h + 10a + 10kv + 8i, and 48 B of rsqrt and log-sum-exp
SMALL_ACT = 26 * 64 + 10 * 64 + 10 * 32 + 8 * 128 + 48  # = 3,696
ALGO = AlgorithmConfig()
WITH_KL = AlgorithmConfig(update=UpdateConfig(LossConfig(kl_coef=0.1)))  # a reference model


def small_pool(**kw) -> PoolConfig:
    return PoolConfig(
        **{
            "model_path": "/nowhere/small",
            "device": "cuda",
            "dtype": "bfloat16",
            "micro_batch_tokens": 4096,
            **kw,
        }
    )


def test_small_shape_counts_by_hand():
    s = ModelShape.from_config(SMALL)
    assert (s.q_dim, s.kv_dim) == (64, 32)
    assert s.layer_params == SMALL_LAYER
    assert s.params == SMALL_PARAMS == 138_112
    assert s.kv_bytes_per_token(2) == 2 * 2 * 32 * 2 == 256
    # LoRA r=8 on q (64 -> 64) and v (64 -> 32): 8*(64+64) + 8*(64+32) per layer, 2 layers
    assert s.lora_params(8, ("q_proj", "v_proj")) == 2 * (1024 + 768) == 3584


def test_carried_qwen3_configs_match_their_published_sizes():
    """Qwen3-1.7B: 1.7B parameters, 1.4B without embeddings; Qwen3-8B: 8.2B and 6.95B."""
    small, big = load_shape("/models/Qwen3-1.7B"), load_shape("/models/Qwen3-8B")
    assert small is not None and big is not None
    assert (
        small.hidden,
        small.intermediate,
        small.layers,
        small.heads,
        small.kv_heads,
        small.head_dim,
        small.vocab,
        small.tied,
    ) == (2048, 6144, 28, 16, 8, 128, 151_936, True)
    assert (big.hidden, big.intermediate, big.layers, big.heads, big.kv_heads, big.tied) == (
        4096,
        12288,
        36,
        32,
        8,
        False,
    )
    assert small.params == 1_720_574_976 and small.layers * small.layer_params == 1_409_408_000
    assert big.params == 8_190_735_360 and big.layers * big.layer_params == 6_946_071_552
    for name in ("Qwen3-1.7B", "Qwen3-8B"):
        cfg = json.loads((ROOT / "atgrpo/models/configs" / name / "config.json").read_text())
        assert (cfg["max_position_embeddings"], cfg["rope_theta"], cfg["torch_dtype"]) == (
            40960,
            1000000,
            "bfloat16",
        )


def test_a_models_own_config_wins_over_the_carried_one(tmp_path):
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMALL))
    assert find_model_config(str(model)) == model / "config.json"
    assert load_shape(str(model)).params == SMALL_PARAMS
    # no folder: carried, any case
    assert find_model_config(str(tmp_path / "qwen3-8b")).parent.name == "Qwen3-8B"
    assert find_model_config(str(tmp_path / "Unknown-7B")) is None


def test_activation_bytes_per_token_per_layer():
    s = ModelShape.from_config(SMALL)
    assert activation_bytes_per_token_layer(s, 2, residual=4) == SMALL_ACT == 3696
    # float32: 24h + 16a + 16kv + 16i + 48
    assert activation_bytes_per_token_layer(s, 4) == 24 * 64 + 16 * 64 + 16 * 32 + 16 * 128 + 48
    # LoRA on q and v over a frozen bf16 base: norms 2*4h, q/k norms 4(a + kv), SDPA 2(2a + 2kv),
    # the MLP 3*2i, each adapter its input and its rank-wide middle 2(64 + 8)
    assert (
        activation_bytes_per_token_layer(s, 2, lora_targets=("q_proj", "v_proj"), lora_rank=8)
        == 2 * 4 * 64 + 4 * 96 + 2 * 192 + 3 * 2 * 128 + 2 * 2 * (64 + 8) + 48
    )
    # a GPU measured 134,312 B per token per layer at Qwen3-1.7B under bf16 autocast (float32
    # masters)
    assert (
        activation_bytes_per_token_layer(load_shape("/models/Qwen3-1.7B"), 2, residual=4) == 133_288
    )
    # with checkpointing: each layer's input (the float32 residual, 4h) plus one layer recomputed in
    # full
    assert activation_bytes(s, 100, 2, checkpointing=True, residual=4) == 100 * (
        2 * 4 * 64 + SMALL_ACT
    )
    assert activation_bytes(s, 100, 2, checkpointing=False, residual=4) == 100 * 2 * SMALL_ACT


def test_trainer_components_of_a_full_bf16_pool_by_hand():
    s = ModelShape.from_config(SMALL)
    got = trainer_components(s, small_pool(), ALGO, "cuda")
    p = SMALL_PARAMS
    linears = 2 * 36_864 + 1000 * 64  # the layers' linears and the (tied) output layer
    assert matmul_params(s) == linears
    assert got == {
        "weights": 4 * p,  # the float32 masters are the module's weights
        "casts": 2 * linears,  # autocast's bf16 copies, held through the forward
        "gradients": 4 * p,
        "optimizer": 8 * p,
        "step_temporaries": 4 * p,
        "fsdp_units": 0,
        "kl_reference": 0,
        "activations": 4096 * (2 * 4 * 64 + SMALL_ACT),  # checkpointing on by default on CUDA
        # one pass: 4 float32 (positions, vocab) tensors, 2**24 // 1000 positions at most; the bf16
        # product added into the float32 head's gradient (all 1000 rows: fewer than HEAD_GRAD_ROWS)
        "logprob": 4096 * 1000 * 4 * 4 + 1000 * 64 * 2,
        "runtime": GPU_RUNTIME_BYTES,
    }
    assert LOGPROB_CHUNK_ELEMENTS // 1000 > 4096
    # only the response positions are scored: fewer of them, a smaller pass
    assert (
        trainer_components(s, small_pool(), ALGO, "cuda", response_tokens=300)["logprob"]
        == 300 * 1000 * 16 + 1000 * 64 * 2
    )
    # top-p without top-k sorts the vocabulary: 8 tensors a pass
    assert (
        trainer_components(s, small_pool(), ALGO, "cuda", response_tokens=300, sorts=True)[
            "logprob"
        ]
        == 300 * 1000 * 32 + 1000 * 64 * 2
    )
    assert trainer_peak_bytes(SMALL, small_pool(), ALGO, "cuda") == trainer_peak(got)
    off = trainer_components(s, small_pool(gradient_checkpointing=False), ALGO, "cuda")
    assert off["activations"] == 4096 * 2 * SMALL_ACT


def test_trainer_host_memory_of_a_sharded_push_is_its_cast_and_one_tensor():
    s, p = ModelShape.from_config(SMALL), SMALL_PARAMS
    base = trainer_host_bytes(s, small_pool(), ranks=1) - 4 * p  # one process: its float32 masters
    # FSDP: rank 0 gathers a push or the model folder cast to bf16 tensor by tensor, with one
    # float32 tensor in flight at most (the embedding: 1000 x 64); the moments (8 bytes a
    # parameter) are each rank's to write, shard by shard, and never gathered. Loading the
    # float32 model at start-up is then the larger.
    assert trainer_host_bytes(s, small_pool(), ranks=4) == base + max(2 * p + 64_000 * 4, 4 * p)
    assert trainer_host_bytes(s, small_pool(), ranks=4) == base + 4 * p
    # bf16 base only
    assert trainer_host_bytes(s, small_pool(specialization="lora"), ranks=4) == base + 2 * p


def test_trainer_components_float32_cpu_sharded_kl_and_lora():
    s, p = ModelShape.from_config(SMALL), SMALL_PARAMS
    cpu = trainer_components(
        s, PoolConfig(model_path="x", device="cpu", micro_batch_tokens=100), ALGO, "cpu"
    )
    assert (cpu["weights"], cpu["gradients"], cpu["optimizer"], cpu["runtime"]) == (
        4 * p,
        4 * p,
        8 * p,
        0,
    )
    # no checkpointing on CPU
    assert cpu["activations"] == 100 * 2 * activation_bytes_per_token_layer(s, 4)
    assert cpu["logprob"] == 100 * 1000 * 4 * 4  # a pass of 100 positions
    assert cpu["casts"] == 0  # no autocast in float32

    four = trainer_components(
        s,
        small_pool(trainer_gpus=4),
        WITH_KL,
        "cuda",
    )
    # float32 masters / 4
    assert (four["weights"], four["gradients"], four["optimizer"]) == (
        p,
        p,
        2 * p,
    )
    # FSDP's mixed precision gathers each layer in bf16: no autocast cache
    assert four["casts"] == 0
    # embeddings + 2 layers, gathered + grads; the head gathered in float32 and its bf16 copy
    assert four["fsdp_units"] == (64_000 + 2 * SMALL_LAYER) * (4 + 4) + 64_000 * 2
    assert four["kl_reference"] == 2 * p // 4
    # the chunked head as in one process, its float32 gradient in place, a bf16 product added to
    # it (all 1000 rows: fewer than HEAD_GRAD_ROWS)
    assert four["logprob"] == 4096 * 1000 * 4 * 4 + 1000 * 64 * 2
    # the residual stream is bf16 (the gathered embeddings are): 2h kept per checkpointed layer
    assert four["activations"] == 4096 * (2 * 2 * 64 + activation_bytes_per_token_layer(s, 2))

    # trains the float16 weights themselves
    fp16 = trainer_components(s, small_pool(dtype="float16"), ALGO, "cuda")
    assert (fp16["weights"], fp16["casts"], fp16["gradients"], fp16["optimizer"]) == (
        2 * p,
        0,
        2 * p,
        4 * p,
    )

    lora = small_pool(
        specialization="lora", lora=LoraConfig(rank=8, target_modules=("q_proj", "v_proj"))
    )
    got = trainer_components(
        s,
        lora,
        WITH_KL,
        "cuda",
        agents=2,
        ranks=4,
    )
    t = 2 * 3584  # one adapter per agent
    # the frozen bf16 base and the float32 adapters; no casts of the base (it does not train)
    assert (got["weights"], got["casts"], got["gradients"], got["optimizer"]) == (
        2 * p + 4 * t,
        0,
        4 * t,
        8 * t,
    )
    # replicated; the reference is the base
    assert (got["fsdp_units"], got["kl_reference"]) == (
        0,
        0,
    )
    # the bf16 base's residual stream is bf16: each checkpointed layer keeps 2h
    per_layer = activation_bytes_per_token_layer(
        s, 2, lora_targets=("q_proj", "v_proj"), lora_rank=8
    )
    assert got["activations"] == 4096 * (2 * 2 * 64 + per_layer)


def test_rollout_and_disk_figures_by_hand():
    s, p = ModelShape.from_config(SMALL), SMALL_PARAMS
    got = rollout_components(s, small_pool(), agents=2, k=4, tasks=8, sample_tokens=300)
    assert got == {
        "weights": 2 * p,
        "packed_weights": 0,  # on a GPU: the hf engine packs its weights only on CPU
        "adapters": 0,
        "kv_cache": 4 * 300 * 256,
        "runtime": ROLLOUT_RUNTIME_BYTES,
    }
    # the hf engine on CPU: the packed copy of every layer's linears and the output layer
    cpu = dict(agents=2, k=4, tasks=8, sample_tokens=300, device="cpu")
    for dtype, width in (("bfloat16", 2), ("float32", 4), ("float16", 0)):
        got = rollout_components(s, small_pool(device="cpu", engine="hf", dtype=dtype), **cpu)
        assert got["packed_weights"] == (2 * 36_864 + 1000 * 64) * width
    assert (
        rollout_full_kv_bytes(s, small_pool(), k=4, tasks=8, sample_tokens=300) == 4 * 8 * 300 * 256
    )
    # model/ in bf16, trainer_state.pt's float32 masters and AdamW moments: 2 + 12 bytes a parameter
    assert checkpoint_bytes(s, small_pool(), agents=1) == 2 * p + 12 * p
    # no masters apart
    assert checkpoint_bytes(s, small_pool(dtype="float32"), agents=1) == 4 * p + 8 * p
    assert push_bytes(s, small_pool(), agents=1) == 2 * p  # cast to the pool's dtype
    lora = small_pool(
        specialization="lora", lora=LoraConfig(rank=8, target_modules=("q_proj", "v_proj"))
    )
    # float32 adapters and their moments
    assert checkpoint_bytes(s, lora, agents=2) == 2 * 3584 * (4 + 8)
    assert push_bytes(s, lora, agents=2) == 2 * 3584 * 4


def test_logprob_chunk_matches_the_trainers():
    """atgrpo may not import trainer_svc; the constants are read from its source instead."""
    text = (ROOT / "trainer_svc" / "logprobs.py").read_text()
    assert (
        int(re.search(r"^LOGPROB_CHUNK_TOKENS = (\d+)", text, re.M).group(1))
        == LOGPROB_CHUNK_TOKENS
    )
    # the pass size the trainer takes from atgrpo.memory itself: 2**24 on a CPU (and a small GPU),
    # 1/64 of a big GPU's memory in the pass's six float32 temporaries
    assert "from atgrpo.memory import LOGPROB_CHUNK_ELEMENTS, logprob_pass_elements" in text
    assert (
        logprob_pass_elements(None)
        == logprob_pass_elements(16 * GiB)
        == LOGPROB_CHUNK_ELEMENTS
        == 2**24
    )
    assert (
        logprob_pass_elements(80 * GiB) == 80 * GiB // 64 // 24
        and 80 * GiB // 64 // 24 // 151_936 == 368
    )
    assert logprob_pass_elements(2**40) == 2**27
    head = (ROOT / "trainer_svc" / "fused_head.py").read_text()
    assert int(re.search(r"^HEAD_GRAD_ROWS = (\d+)", head, re.M).group(1)) == HEAD_GRAD_ROWS


def test_the_trainer_peak_is_the_resident_parts_and_its_largest_phase():
    """Weights, casts and moments stay; the forward's log-prob pass and the backward's gradients
    never coexist with all the activations, and the optimizer step holds the gradients twice."""
    base = {"weights": 10, "casts": 1, "optimizer": 20, "runtime": 5}
    # forward
    assert trainer_peak({**base, "activations": 50, "logprob": 30, "gradients": 10}) == 36 + 80
    # backward
    assert trainer_peak({**base, "activations": 50, "logprob": 5, "gradients": 10}) == 36 + 60
    assert (
        trainer_peak(
            {**base, "activations": 2, "logprob": 5, "gradients": 10, "step_temporaries": 10}
        )
        == 36 + 20
    )
