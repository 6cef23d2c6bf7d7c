"""The transformers engine: the CPU default (also usable on a GPU).

One prefill per prompt, shared by its n samples (the KV cache is duplicated after prefill, not
recomputed), a batch of prompts at once, and per-token log-probs under the exact sampling
transform (sampling.transform_logits), so the trainer can recompute them.

`generate` runs one fixed batch; `batcher()` makes a continuous one (hf_batch.py), which the pool
uses when `continuous` is on: requests join and leave one decode loop as they come and end.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Sequence

import torch

from atgrpo.algo.sampling import sample_tokens
from atgrpo.attention import NAME as ATTENTION
from atgrpo.attention import use_gqa_sdpa
from atgrpo.contract.rollout import Completion
from atgrpo.contract.sampling import Sampling
from atgrpo.perf import ModelSize, matmul_rate, model_size
from rollout_svc.engines.hf_packed import pack_linears
from rollout_svc.engines.render import chat_tokens, fit_prompt

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# A decode step computes every row of the batch; once the rows still going are at most this share
# of it, the batch (and its cache) is cut to them. A cut copies the cache once, so not at every
# finished row: at 3/4, a batch whose rows end one by one is cut about log(N)/log(4/3) times.
COMPACT_AT = 0.75
# The share of padded positions a prefill group may compute beyond its prompts' own.
PREFILL_WASTE = 0.1


def left_padded(
    prompts: Sequence[Sequence[int]], pad_id: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), each (B, width): every prompt ends at the last column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def prefill_groups(lengths: Sequence[int], waste: float = PREFILL_WASTE) -> list[list[int]]:
    """The prompts' indices in prefill groups, longest first: a group takes the next prompt while
    its padded positions stay within (1 + waste) of its real ones, so prompts of one length (one
    template, one task) share a forward and unlike ones do not pay for each other's padding."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if groups:
            g = groups[-1]
            real = sum(lengths[j] for j in g) + lengths[i]
            if lengths[g[0]] * (len(g) + 1) <= (1 + waste) * real:
                g.append(i)
                continue
        groups.append([i])
    return groups


def pick_device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return (
            torch.bfloat16
            if device.startswith("cuda") and torch.cuda.is_bf16_supported()
            else torch.float32
        )
    return _DTYPES[dtype]


class HFEngine:
    def __init__(
        self,
        model_path: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        continuous: bool = True,
        pack_weights: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = model_path
        self.device = pick_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=pick_dtype(dtype, self.device)
        )
        self.model.to(self.device).eval()
        # on CPU: weights packed once for oneDNN (hf_packed.py; off: a bench's baseline)
        self.pack_weights = pack_weights
        if pack_weights:
            pack_linears(self.model)
        # Prompts of different lengths are left-padded, so every decode step has a mask: on CPU,
        # attend without copying the keys per query head (2x a SmolLM2 decode step,
        # atgrpo.attention).
        use_gqa_sdpa(self.model)
        # The cache holds keys and values in the weights' dtype. With 16-bit weights on CPU it was
        # float32, because torch's bf16 sdpa kernel decoded 4.4x slower than float32's; the decode
        # now attends by atgrpo.attention's shared-prefix matmuls, which bf16 runs 2.2x faster than
        # float32 (SmolLM2's prompt scores at 32 rows: 59 us against 146). Its log-probs are as
        # close to a whole-sequence forward's (the trainer's) as float32's were: a mean 0.055
        # against 0.066 over each row's top 8 tokens (docs/results.md).
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_ids.discard(None)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else min(self.eos_ids)
        )
        # What a request may ask of this model (rollout_svc.replica.check_prompt).
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.max_model_len = getattr(self.model.config, "max_position_embeddings", None)
        self._sequences = 0  # in the generate call running now (stats)
        # The last generate's prefill seconds (the prompts' forward): the pool reads it right after
        # the call, in the same worker, and counts the rest of the call as decode.
        self.last_timing: dict[str, float] = {}
        self._size: ModelSize | None = None
        # Continuous batching (hf_batch.py, what the pool uses when this is on): off, the pool runs
        # one fixed batch at a time through `generate` (kept: a bench compares the two).
        self.continuous = continuous and self.can_batch_continuously()
        self._batches: weakref.WeakSet = weakref.WeakSet()  # continuous batches (stats)

    def can_batch_continuously(self) -> bool:
        """Whether hf_batch.py can serve this model: it needs atgrpo.attention's own attention
        (prompts' keys shared by their rows) and a cache it can reserve (full attention layers).
        On CPU only for now: on a GPU, a step's python bookkeeping and host copies would want
        measuring first."""
        from rollout_svc.engines.hf_cache import reserved_cache

        return (
            self.device == "cpu"
            and self.model.config._attn_implementation == ATTENTION
            and reserved_cache(self.model.config, 0) is not None
        )

    def batcher(self):
        """A new continuous batch over this engine (rollout_svc.engines.hf_batch): the pool adds
        requests to it and runs its steps on the model's thread."""
        from rollout_svc.engines.hf_batch import ContinuousBatch

        batch = ContinuousBatch(self)
        self._batches.add(batch)
        return batch

    def warm_up(self) -> None:
        """One tiny generation: the first call pays seconds of lazy initialisation."""
        self.generate([[self.pad_id]], [1], Sampling(max_tokens=2))

    @property
    def model_size(self) -> ModelSize:
        """The served model's matmul weights, for the FLOPs of a generation (atgrpo.perf); counted
        again after an adapter is added."""
        if self._size is None:
            self._size = model_size(self.model)
        return self._size

    def matmul_rate(self) -> float:
        """This process's matmul FLOP/s on the engine's device in the weights' dtype (measured
        once)."""
        return matmul_rate(self.device, self.model.dtype)

    # --- weights ---------------------------------------------------------------------------

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.model.dtype

    def load_full(self, state: dict[str, torch.Tensor]) -> None:
        """Replace every weight (strict: the same names and shapes as the served model). A tied
        head may be left out, as safetensors files of tied models leave it out (vLLM's path too).

        Received tensors already where and as the model holds them (a CPU engine, the push cast
        to its dtype) become the weights themselves: copying them in would be one more pass over
        every byte of the push, and the old weights are freed either way."""
        embed = "model.embed_tokens.weight"
        if embed in state and self.model.config.tie_word_embeddings:
            state = {**state, "lm_head.weight": state[embed]}  # one tensor for both, as served
        held = self.model.state_dict()
        adopt = all(
            name in held
            and t.device == held[name].device
            and t.dtype == held[name].dtype
            and t.shape == held[name].shape
            for name, t in state.items()
        )
        self.model.load_state_dict(state, strict=True, assign=adopt)

    def load_adapter(self, name: str, config: dict, state: dict[str, torch.Tensor]) -> None:
        """Add or replace the LoRA adapter `name` (PEFT's format) on the frozen base."""
        from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        cfg = LoraConfig(
            **{k: v for k, v in config.items() if k in LoraConfig.__dataclass_fields__}
        )
        if not isinstance(self.model, PeftModel):
            self.model = get_peft_model(self.model, cfg, adapter_name=name).eval()
        elif name not in self.model.peft_config:
            self.model.add_adapter(name, cfg)
        if self.pack_weights:
            pack_linears(self.model)  # the adapter's own layers
        self._size = None
        result = set_peft_model_state_dict(self.model, state, adapter_name=name)
        missing = [k for k in result.missing_keys if f".{name}." in k and "lora_" in k]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"adapter {name!r}: missing {missing[:3]}, unexpected "
                f"{list(result.unexpected_keys)[:3]}"
            )

    def adapters(self) -> list[str]:
        return list(getattr(self.model, "peft_config", {}))

    def _with_adapter(self, adapter: str):
        """Context: generate with `adapter` ("" = the bare base model)."""
        import contextlib

        if not self.adapters():
            if adapter:
                raise KeyError(adapter)
            return contextlib.nullcontext()
        if not adapter:
            return self.model.disable_adapter()
        if adapter not in self.adapters():
            raise KeyError(adapter)
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()

    # --- generation ------------------------------------------------------------------------

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

    def _stopped(self, ids: list[int], stops: Sequence[str]) -> str | None:
        """The decoded text cut at the first stop string, or None when none occurred."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in stops if s in text]
        return text[: min(cuts)] if cuts else None

    def generate(
        self, prompts: Sequence[Sequence[int]], ns: Sequence[int], s: Sampling, adapter: str = ""
    ) -> list[list[Completion]]:
        """`ns[i]` samples of `prompts[i]`, all in one batch; returns completions per prompt."""
        self._sequences = sum(ns)
        self.last_timing = {}
        try:
            with self._with_adapter(adapter):
                return self._generate(prompts, ns, s)
        finally:
            self._sequences = 0

    def stats(self) -> dict[str, float]:
        """What rollout_svc.metrics reads at each scrape: in a fixed batch every sequence runs at
        once; in a continuous one a request's rows wait until its prompt is prefilled. The KV
        cache is allocated as needed, so it has no usage share to report."""
        return {
            "sequences_running": self._sequences + sum(b.running_rows for b in self._batches),
            "sequences_waiting": sum(b.waiting_rows for b in self._batches),
        }

    def _prefill(
        self, prompts: Sequence[Sequence[int]], capacity: int
    ) -> tuple[torch.Tensor, torch.Tensor, object]:
        """The prompts' forward: (each prompt's last logits (B, V), the batch's left-padded mask
        (B, width), the cache holding every prompt's keys and values, ending at `width`).

        With a reserved cache, prompts of unlike lengths run in separate groups (prefill_groups)
        and each group's keys and values are placed into the batch's cache: one padded batch
        computed a third more positions than it kept for 8 prompts spread from 100 to 300
        tokens. A model whose cache cannot be reserved runs one padded batch."""
        # Here, not at the top: it imports transformers, which the engine loads with its model.
        from rollout_svc.engines.hf_cache import reserved_cache

        width = max(len(p) for p in prompts)
        _, mask = left_padded(prompts, self.pad_id, self.device)
        cache = reserved_cache(self.model.config, capacity)
        if cache is None:
            last, cache = self._forward(prompts, None)
            return last, mask, cache
        last = None
        for group in prefill_groups([len(p) for p in prompts]):
            own = reserved_cache(self.model.config, 0)
            logits, own = self._forward([prompts[i] for i in group], own)
            if last is None:
                last = logits.new_empty((len(prompts), logits.shape[-1]))
            rows = torch.tensor(group, device=self.device)
            last[rows] = logits
            cache.place(rows, own, len(prompts), width)
        return last, mask, cache

    def _forward(self, prompts: Sequence[Sequence[int]], cache) -> tuple[torch.Tensor, object]:
        """One left-padded batch's forward: (its last positions' logits (B, V), its cache)."""
        ids, mask = left_padded(prompts, self.pad_id, self.device)
        # Only the last position's logits: the prefill's others are never read, and with a real
        # vocabulary they are most of its memory (8 prompts of 600 tokens x 49,152: 0.9 GB in
        # float32).
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
            past_key_values=cache,
        )
        return out.logits[:, -1, :], out.past_key_values

    @torch.inference_mode()
    def _generate(
        self, prompts: Sequence[Sequence[int]], ns: Sequence[int], s: Sampling
    ) -> list[list[Completion]]:
        # Here, not at the top: they import transformers, which the engine loads with its model.
        from rollout_svc.engines.hf_cache import ReservedCache
        from rollout_svc.engines.hf_shared import SharedPrefixCache

        dev = self.device
        start = time.perf_counter()
        # Sharing each prompt's cache among its rows needs atgrpo.attention's own attention (a
        # bench may switch the model to transformers' to compare), and pays on CPU, where the
        # attention was a fifth (float32) to a third (bf16 weights) of a decode step.
        share = dev == "cpu" and self.model.config._attn_implementation == ATTENTION
        width = max(map(len, prompts))
        last, mask, cache = self._prefill(prompts, width if share else width + s.max_tokens)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
        if mask.is_cuda:  # the forward's kernels are queued: wait for them, so the split is true
            torch.cuda.synchronize(mask.device)
        self.last_timing = {"prefill_s": time.perf_counter() - start}
        # (N,)
        rows = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(list(ns))).to(dev)
        if share and isinstance(cache, ReservedCache):  # each prompt's keys held once
            cache = SharedPrefixCache(cache, rows, mask, s.max_tokens)
        else:
            cache.batch_select_indices(rows)  # the prefill is shared: copy the cache n ways
        # (N, V) ...
        logits, mask, next_pos = (
            last[rows],
            mask[rows],
            pos[rows, -1] + 1,
        )
        gen = torch.Generator(device=dev).manual_seed(s.seed) if s.seed is not None else None
        n_rows = rows.shape[0]
        tokens_out: list[list[int]] = [[] for _ in range(n_rows)]
        logps_out: list[list[float]] = [[] for _ in range(n_rows)]
        texts: list[str | None] = [None] * n_rows
        finished = [False] * n_rows
        live = list(range(n_rows))  # the row of each position in the batch that decodes
        for _ in range(s.max_tokens):
            tokens, logps = sample_tokens(logits, s, gen)  # (live,), (live,)
            for r, t, lp in zip(live, tokens.tolist(), logps.tolist(), strict=True):
                if finished[r]:
                    continue
                tokens_out[r].append(t)
                logps_out[r].append(lp)
                if t in self.eos_ids:
                    finished[r] = True
                elif s.stop and (cut := self._stopped(tokens_out[r], s.stop)) is not None:
                    finished[r], texts[r] = True, cut
            if all(finished):
                break
            going = [j for j, r in enumerate(live) if not finished[r]]
            if len(going) <= COMPACT_AT * len(live):  # stop computing rows that are done
                keep = torch.tensor(going, device=dev)
                cache.batch_select_indices(keep)
                tokens, mask, next_pos, live = (
                    tokens[keep],
                    mask[keep],
                    next_pos[keep],
                    [live[j] for j in going],
                )
            tokens = torch.where(
                torch.tensor([finished[r] for r in live], device=dev), self.pad_id, tokens
            )
            mask = torch.cat(
                [mask, torch.ones((len(live), 1), dtype=mask.dtype, device=dev)], dim=1
            )
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits, next_pos = out.past_key_values, out.logits[:, -1, :], next_pos + 1
        completions = [
            Completion(
                tokens_out[r],
                logps_out[r],
                texts[r]
                if texts[r] is not None
                else self.tokenizer.decode(tokens_out[r], skip_special_tokens=True),
                "stop" if finished[r] else "length",
            )
            for r in range(n_rows)
        ]
        per_prompt, start = [], 0
        for n in ns:
            per_prompt.append(completions[start : start + n])
            start += n
        return per_prompt
