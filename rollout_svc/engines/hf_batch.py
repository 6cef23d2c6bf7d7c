"""Continuous batching for the hf engine: one decode loop over every running row, whatever request
it came from.

A fixed batch (HFEngine.generate) runs until its last row ends, and requests that arrive meanwhile
wait for all of it: in the learning bench a step's rollout waited more than it decoded, and its
decode steps ran with few rows as rows finished. Here a request joins as soon as its prompt is
prefilled and a row leaves as soon as it ends:

- `add` queues a request; each `step` prefills queued prompts, at most `chunk` prompt tokens
  while rows decode (a long prompt is prefilled over several steps instead of stalling the
  decode for all of its length), then runs one decode step over every row;
- a prompt's n samples share its keys and values (hf_slots.SlotCache), as in a fixed batch;
- each request samples with its own settings, and with its own torch.Generator when it has a
  seed, so what a seeded request draws does not depend on its companions;
- one adapter at a time: a LoRA adapter is the model's state for a whole forward. Requests are
  taken in arrival order, and one for another adapter waits (and holds those behind it) until
  the running rows end.

The caller (rollout_svc.pool) calls `step` on the model's thread, again and again, adding and
cancelling requests between steps; a step returns the requests that ended in it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from atgrpo.algo.sampling import sample_tokens
from atgrpo.contract.rollout import Completion
from atgrpo.contract.sampling import Sampling
from rollout_svc.engines.hf_cache import reserved_cache
from rollout_svc.engines.hf_slots import SlotCache

# Prompt tokens prefilled a step while rows decode: a SmolLM2 prefill of 256 tokens on CPU takes
# several decode steps' time, so a longer prompt is split rather than stall every running row.
PREFILL_CHUNK = 256


@dataclass(eq=False)  # hashed by identity: a step groups its rows by request
class Job:
    """One request in the loop: its prefill's progress, then its rows' outputs."""

    key: Any
    prompt: list[int]
    n: int
    sampling: Sampling
    adapter: str
    gen: torch.Generator | None
    done: int = 0  # prompt tokens prefilled
    cache: Any = None  # the prompt's own cache while it is prefilled
    slot: int = -1
    tokens: list[list[int]] = field(default_factory=list)
    logps: list[list[float]] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    live: int = 0  # rows still decoding
    timing: dict[str, float] = field(default_factory=dict)

    def add_time(self, key: str, seconds: float) -> None:
        self.timing[key] = self.timing.get(key, 0.0) + seconds


@dataclass
class Outcome:
    """A request that ended in a step: its completions, or the exception it failed with; its
    timing (prefill_s, decode_s: its share of the steps that served it; prefill_tokens,
    decode_tokens)."""

    key: Any
    result: list[Completion] | BaseException
    timing: dict[str, float]


class ContinuousBatch:
    def __init__(self, engine, chunk: int = PREFILL_CHUNK):
        self.engine, self.chunk = engine, chunk
        self.waiting: deque[Job] = deque()
        self.jobs: dict[Any, Job] = {}
        self.adapter = ""
        self._reset()

    def _reset(self) -> None:
        """Drop every row and the cache (after a failed decode step, whose rows all fail)."""
        cfg = self.engine.model.config.get_text_config(decoder=True)
        self.cache = SlotCache(cfg.num_hidden_layers, self.engine.device)
        self.row_job: list[Job] = []  # per decoding row
        self.row_sample: list[int] = []
        self.row_token: list[int] = []  # the token each row feeds next
        self.row_own: list[int] = []  # its own keys held

    # --- what the pool reads and does between steps -----------------------------------------

    @property
    def idle(self) -> bool:
        return not self.jobs

    @property
    def running_rows(self) -> int:
        return len(self.row_job)

    @property
    def waiting_rows(self) -> int:
        return sum(j.n for j in self.waiting)

    def add(self, key: Any, prompt: list[int], n: int, s: Sampling, adapter: str = "") -> None:
        gen = None
        if s.seed is not None:
            gen = torch.Generator(device=self.engine.device).manual_seed(s.seed)
        job = Job(key, list(prompt), n, s, adapter, gen)
        job.tokens, job.logps = [[] for _ in range(n)], [[] for _ in range(n)]
        job.texts, job.ended = [None] * n, [False] * n
        self.jobs[key] = job
        self.waiting.append(job)

    def cancel(self, key: Any) -> None:
        """Forget a request (its caller is gone): its rows leave before the next step."""
        job = self.jobs.pop(key, None)
        if job is None:
            return
        if job in self.waiting:
            self.waiting.remove(job)
            return
        self._drop_rows([i for i, j in enumerate(self.row_job) if j is job])
        self.cache.slots.free_slot(job.slot)

    # --- a step ----------------------------------------------------------------------------

    def step(self) -> list[Outcome]:
        """Prefill what the budget allows, then one decode step; the requests that ended."""
        if not self.row_job and self.waiting:
            self.adapter = self.waiting[0].adapter  # nothing runs: the next request's adapter
        out: list[Outcome] = []
        with torch.inference_mode(), self.engine._with_adapter(self.adapter):
            self._prefill(out)
            if self.row_job:
                self._decode(out)
        if not self.jobs:  # idle: its buffers (sized for the largest rows seen) go back
            self._reset()
        return out

    def _prefill(self, out: list[Outcome]) -> None:
        # With no row decoding nothing stalls: prefill every queued prompt before the first step,
        # so they all start together.
        budget = self.chunk if self.row_job else float("inf")
        while self.waiting and budget > 0 and self.waiting[0].adapter == self.adapter:
            job = self.waiting[0]
            take = int(min(budget, len(job.prompt) - job.done))
            budget -= take
            start = time.perf_counter()
            try:
                logits = self._prefill_chunk(job, take)
                if logits is not None:
                    self.waiting.popleft()
                    self._join(job, logits, out)
            except Exception as err:  # noqa: BLE001 - this request fails, the others go on
                if self.waiting and self.waiting[0] is job:
                    self.waiting.popleft()
                if job.slot >= 0:
                    self.cache.slots.free_slot(job.slot)
                self.jobs.pop(job.key, None)
                out.append(Outcome(job.key, err, job.timing))
                continue
            finally:
                job.add_time("prefill_s", self._since(start))

    def _since(self, start: float) -> float:
        if str(self.engine.device).startswith("cuda"):  # queued kernels: wait, so the time is true
            torch.cuda.synchronize(self.engine.device)
        return time.perf_counter() - start

    def _prefill_chunk(self, job: Job, take: int) -> torch.Tensor | None:
        """Prefill `take` more of the job's prompt tokens; its last logits (V,) once all are."""
        if job.cache is None:
            job.cache = reserved_cache(self.engine.model.config, len(job.prompt))
        dev, end = self.engine.device, job.done + take
        ids = torch.tensor([job.prompt[job.done : end]], device=dev)
        out = self.engine.model(
            input_ids=ids,
            attention_mask=torch.ones((1, end), dtype=torch.long, device=dev),
            position_ids=torch.arange(job.done, end, device=dev)[None, :],
            past_key_values=job.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        job.done = end
        return out.logits[0, -1] if end == len(job.prompt) else None

    def _join(self, job: Job, logits: torch.Tensor, out: list[Outcome]) -> None:
        """The prompt's first tokens (one per sample, from its last logits), then its rows join
        the decode unless they already ended."""
        job.timing["prefill_tokens"] = float(len(job.prompt))
        tokens, logps = sample_tokens(logits.expand(job.n, -1), job.sampling, job.gen)
        slots = self.cache.slots
        job.slot = slots.take_slot(len(job.prompt))
        going = [i for i in range(job.n) if not self._record(job, i, tokens[i], logps[i])]
        if going:
            self.cache.place(
                job.slot, job.cache, len(self.row_job) + len(going), job.sampling.max_tokens
            )
        job.cache = None
        for i in going:
            self.row_job.append(job)
            self.row_sample.append(i)
            self.row_token.append(job.tokens[i][-1])
            self.row_own.append(0)
        job.live = len(going)
        if not going:
            self._finish(job, out)

    def _record(self, job: Job, i: int, token: torch.Tensor, logp: torch.Tensor) -> bool:
        """Append sample i's token; whether the sample ended (EOS, a stop string, max_tokens)."""
        t = int(token)
        job.tokens[i].append(t)
        job.logps[i].append(float(logp))
        s = job.sampling
        if t in self.engine.eos_ids:
            job.ended[i] = True
        elif s.stop and (cut := self.engine._stopped(job.tokens[i], s.stop)) is not None:
            job.ended[i], job.texts[i] = True, cut
        return job.ended[i] or len(job.tokens[i]) >= s.max_tokens

    def _decode(self, out: list[Outcome]) -> None:
        start = time.perf_counter()
        try:
            logits = self._forward()
        except Exception as err:  # noqa: BLE001 - every running request fails; the rest go on
            failed = list(dict.fromkeys(self.row_job))
            for job in failed:
                self.jobs.pop(job.key, None)
                out.append(Outcome(job.key, err, job.timing))
            for job in failed:
                self.cache.slots.free_slot(job.slot)
            self._reset()
            return
        ended = self._sample(logits)
        self._drop_rows(ended)
        seconds = self._since(start)
        rows = len(self.row_job) + len(ended)
        for job, share in self._step_shares.items():
            job.add_time("decode_s", seconds * share / rows)
        for job in self._step_shares:
            if job.live == 0:
                self._finish(job, out)

    def _forward(self) -> torch.Tensor:
        """One decode step over every row: (rows, V) logits."""
        dev = self.engine.device
        slots = self.cache.slots
        slots.prepare([j.slot for j in self.row_job], self.row_own)
        rows = zip(self.row_job, self.row_own, strict=True)
        positions = [slots.prompt_len[j.slot] + own for j, own in rows]
        result = self.engine.model(
            input_ids=torch.tensor(self.row_token, device=dev)[:, None],
            position_ids=torch.tensor(positions, device=dev)[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.row_own = [own + 1 for own in self.row_own]
        return result.logits[:, -1, :]

    def _sample(self, logits: torch.Tensor) -> list[int]:
        """Each request's rows sampled with its own settings (its rows in sample order, so a
        seeded one draws the same whatever runs beside it); the rows that ended."""
        by_job: dict[Job, list[int]] = {}
        for r, job in enumerate(self.row_job):
            by_job.setdefault(job, []).append(r)
        self._step_shares = {job: len(rows) for job, rows in by_job.items()}
        ended = []
        for job, rows in by_job.items():
            rows.sort(key=lambda r: self.row_sample[r])
            idx = torch.tensor(rows, device=logits.device)
            tokens, logps = sample_tokens(logits[idx], job.sampling, job.gen)
            for r, t, lp in zip(rows, tokens.tolist(), logps.tolist(), strict=True):
                if self._record(job, self.row_sample[r], t, lp):
                    ended.append(r)
                    job.live -= 1
                else:
                    self.row_token[r] = t
        return ended

    def _drop_rows(self, gone: list[int]) -> None:
        """Rows `gone` leave: rows from the end fill their places (only those rows' keys move)."""
        if not gone:
            return
        n, gone_set = len(self.row_job), set(gone)
        keep = n - len(gone_set)
        holes = sorted(r for r in gone_set if r < keep)
        movers = [r for r in range(keep, n) if r not in gone_set]
        self.cache.move(holes, movers)
        for lst in (self.row_job, self.row_sample, self.row_token, self.row_own):
            for h, m in zip(holes, movers, strict=True):
                lst[h] = lst[m]
            del lst[keep:]

    def _finish(self, job: Job, out: list[Outcome]) -> None:
        self.cache.slots.free_slot(job.slot)
        self.jobs.pop(job.key, None)
        job.timing["decode_tokens"] = float(sum(len(t) for t in job.tokens))
        out.append(Outcome(job.key, self._completions(job), job.timing))

    def _completions(self, job: Job) -> list[Completion]:
        decode = self.engine.tokenizer.decode
        return [
            Completion(
                job.tokens[i],
                job.logps[i],
                job.texts[i]
                if job.texts[i] is not None
                else decode(job.tokens[i], skip_special_tokens=True),
                "stop" if job.ended[i] else "length",
            )
            for i in range(job.n)
        ]
