"""The hf engine's continuous batch (rollout_svc/engines/hf_batch.py) and the pool over it
(rollout_svc/pool_continuous.py): requests that join mid-decode get what a fixed batch gives them
(greedy tokens, texts, finish reasons; log-probs equal to a full-sequence forward), a seeded
request draws the same whatever runs beside it, and a request that leaves or fails takes no other
with it."""

import asyncio

import pytest
import torch

import rollout_svc.engines.hf_batch as hf_batch
from atgrpo import errors
from atgrpo.algo.sampling import transform_logits
from atgrpo.contract.sampling import Sampling
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime


@pytest.fixture(scope="module")
def engine(tiny_model):
    e = HFEngine(tiny_model, device="cpu", dtype="float32")
    assert e.continuous
    return e


def prompts_of(*lengths, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]


def forward_logprobs(engine, prompt, response, s):
    """The log-probs the trainer recomputes: one forward over prompt + response."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + response])).logits[0]
    lp = torch.log_softmax(transform_logits(logits[len(prompt) - 1 : -1].float(), s), dim=-1)
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def run(batch, arrivals):
    """Step `batch` until it is idle; `arrivals[step]` are the (key, prompt, n, sampling) added
    before that step. Returns {key: completions}."""
    out, step = {}, 0
    while step <= max(arrivals) or not batch.idle:
        for key, prompt, n, s in arrivals.get(step, []):
            batch.add(key, prompt, n, s)
        for o in batch.step():
            if isinstance(o.result, BaseException):
                raise o.result
            out[o.key] = o.result
        step += 1
    return out


def assert_same(mine, want, atol=1e-5):
    assert len(mine) == len(want)
    for m, w in zip(mine, want, strict=True):
        assert (m.token_ids, m.text, m.finish_reason) == (w.token_ids, w.text, w.finish_reason)
        torch.testing.assert_close(
            torch.tensor(m.logprobs), torch.tensor(w.logprobs), rtol=0, atol=atol
        )


def test_requests_joining_mid_decode_get_what_a_fixed_batch_gives_them(engine):
    """Four requests of unlike prompt lengths, max_tokens, n and stop strings: two start, one
    joins after 3 steps (its 30-token prompt prefilled 8 tokens a step while the others decode),
    one after 6; each gets its fixed batch's greedy tokens, and log-probs a full forward gives."""
    a, b, c, d = prompts_of(10, 3, 30, 9)
    plain = Sampling(temperature=0.0, max_tokens=12)
    short = Sampling(temperature=0.0, max_tokens=5)
    free = engine.generate([d], [2], plain)[0][0]
    stopped = Sampling(
        temperature=0.0, max_tokens=12, stop=(engine.tokenizer.decode(free.token_ids[3:5]),)
    )
    want = {
        "a": engine.generate([a, c], [2, 3], plain)[0],
        "b": engine.generate([b], [1], short)[0],
        "c": engine.generate([a, c], [2, 3], plain)[1],
        "d": engine.generate([d], [2], stopped)[0],
    }
    got = run(
        hf_batch.ContinuousBatch(engine, chunk=8),
        {
            0: [("a", a, 2, plain), ("b", b, 1, short)],
            3: [("c", c, 3, plain)],
            6: [("d", d, 2, stopped)],
        },
    )
    prompts = {"a": a, "b": b, "c": c, "d": d}
    sampling = {"a": plain, "b": short, "c": plain, "d": stopped}
    for key in want:
        assert_same(got[key], want[key])
        for comp in got[key]:
            ref = forward_logprobs(engine, prompts[key], comp.token_ids, sampling[key])
            assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)
    assert got["d"][0].finish_reason == "stop" and len(got["d"][0].token_ids) < 12
    assert got["b"][0].finish_reason == "length" and len(got["b"][0].token_ids) == 5


def test_a_seeded_request_draws_the_same_beside_any_companions(engine):
    """Temperature 1 with top-k and top-p: a seeded request's samples alone, and with requests
    of other settings joining and leaving around it, are the same; log-probs are the transform's."""
    p, q, r = prompts_of(12, 7, 20, seed=5)
    seeded = Sampling(temperature=1.0, top_k=30, top_p=0.9, max_tokens=10, seed=11)
    other = Sampling(temperature=0.7, max_tokens=4)
    alone = run(hf_batch.ContinuousBatch(engine), {0: [("s", p, 3, seeded)]})["s"]
    crowded = run(
        hf_batch.ContinuousBatch(engine, chunk=6),
        {0: [("o1", q, 4, other)], 1: [("s", p, 3, seeded)], 4: [("o2", r, 2, other)]},
    )["s"]
    assert_same(crowded, alone)
    for comp in alone:
        ref = forward_logprobs(engine, p, comp.token_ids, seeded)
        assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)


def _pool(engine, name):
    return PoolRuntime(name, engine)


async def until(holds, seconds=60.0):
    """Wait for `holds()` (the pool works in its thread meanwhile); fail past `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not holds():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.005)


def test_a_request_joins_one_that_is_decoding_and_both_get_their_own_output(engine):
    """The pool hands the second request to the batch while the first decodes: it ends first
    (it is short), and each output is what it gets alone."""
    long_p, short_p = prompts_of(14, 6, seed=7)
    long_s = Sampling(temperature=0.0, max_tokens=40)
    short_s = Sampling(temperature=0.0, max_tokens=3)
    want_long = engine.generate([long_p], [2], long_s)[0]
    want_short = engine.generate([short_p], [2], short_s)[0]

    async def go():
        pool = _pool(engine, "cb-join")
        ended = []
        first = asyncio.ensure_future(pool.generate("", long_p, long_s, 2))
        first.add_done_callback(lambda _: ended.append("long"))
        await until(lambda: engine.stats()["sequences_running"] > 0)  # the long one decodes
        second = asyncio.ensure_future(pool.generate("", short_p, short_s, 2))
        second.add_done_callback(lambda _: ended.append("short"))
        return await first, await second, ended

    g_long, g_short, ended = asyncio.run(go())
    assert ended == ["short", "long"]
    assert_same(g_long.completions, want_long)
    assert_same(g_short.completions, want_short)
    for g in (g_long, g_short):
        t = g.timing
        assert t["prefill_s"] > 0 and t["decode_s"] > 0
        assert t["decode_tokens"] == sum(len(c.token_ids) for c in g.completions)
        assert t["prefill_tokens"] == len(g.prompt_ids)
    assert engine.stats() == {"sequences_running": 0, "sequences_waiting": 0}


def test_a_cancelled_request_leaves_and_a_failing_one_fails_alone(engine):
    """While two requests decode, one's caller goes away and a third request has a token id past
    the vocabulary: the cancelled one's rows leave, the bad one is INVALID_ARGUMENT, and the
    remaining request's output is what it gets alone."""
    keep_p, gone_p = prompts_of(11, 8, seed=9)
    s = Sampling(temperature=0.0, max_tokens=60)
    want = engine.generate([keep_p], [3], s)[0]

    async def go():
        pool = _pool(engine, "cb-cancel")
        keep = asyncio.ensure_future(pool.generate("", keep_p, s, 3))
        gone = asyncio.ensure_future(pool.generate("", gone_p, s, 2))
        await until(lambda: engine.stats()["sequences_running"] == 5)
        gone.cancel()
        bad = asyncio.ensure_future(pool.generate("", [5, engine.vocab_size + 7], s, 1))
        with pytest.raises(errors.InvalidArgument):
            await bad
        await until(lambda: engine.stats()["sequences_running"] == 3)  # the cancelled rows left
        assert not keep.done()  # while the other still decodes
        return await keep

    assert_same(asyncio.run(go()).completions, want)


def test_a_failed_decode_step_fails_its_requests_and_the_pool_serves_on(engine, monkeypatch):
    p = prompts_of(9, seed=4)[0]
    s = Sampling(temperature=0.0, max_tokens=6)
    want = engine.generate([p], [2], s)[0]
    real, calls = hf_batch.ContinuousBatch._forward, []

    def broken_once(self):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a kernel failed")
        return real(self)

    monkeypatch.setattr(hf_batch.ContinuousBatch, "_forward", broken_once)

    async def go():
        pool = _pool(engine, "cb-broken")
        with pytest.raises(errors.Unavailable, match="a kernel failed"):
            await pool.generate("", p, s, 2)
        return await pool.generate("", p, s, 2)

    assert_same(asyncio.run(go()).completions, want)


def test_out_of_memory_in_a_step_runs_the_request_again_as_a_fixed_batch(engine, monkeypatch):
    p = prompts_of(9, seed=6)[0]
    s = Sampling(temperature=0.0, max_tokens=6)
    want = engine.generate([p], [2], s)[0]
    real, calls = hf_batch.ContinuousBatch._forward, []

    def short_of_memory_once(self):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CPU out of memory")
        return real(self)

    monkeypatch.setattr(hf_batch.ContinuousBatch, "_forward", short_of_memory_once)
    gen = asyncio.run(_pool(engine, "cb-oom").generate("", p, s, 2))
    assert_same(gen.completions, want)


def test_requests_for_two_adapters_each_run_with_their_own(tiny_model):
    """A LoRA adapter is the model's state for a whole forward: requests for two adapters, sent
    together, each get what they get alone (the second waits for the first's rows)."""
    from tests.rollout.served import _adapter

    engine = HFEngine(tiny_model, device="cpu", dtype="float32")
    for name, seed in (("tool", 1), ("reasoner", 2)):
        state, cfg = _adapter(tiny_model, seed)
        engine.load_adapter(name, cfg, state)
    p, q = prompts_of(8, 12, seed=8)
    s = Sampling(temperature=0.0, max_tokens=8)
    want = {a: engine.generate([p, q], [2, 2], s, a) for a in ("tool", "reasoner", "")}
    batch = hf_batch.ContinuousBatch(engine)
    for a in ("tool", "reasoner", ""):
        batch.add((a, 0), p, 2, s, a)
    got, steps = {}, 0
    while not batch.idle:
        if steps == 2:
            batch.add(("tool", 1), q, 2, s, "tool")
            batch.add(("reasoner", 1), q, 2, s, "reasoner")
            batch.add(("", 1), q, 2, s, "")
        got.update((o.key, o.result) for o in batch.step())
        steps += 1
    for (a, i), comps in got.items():
        assert_same(comps, want[a][i])
    assert want["tool"][0][0].token_ids != want["reasoner"][0][0].token_ids


def test_the_engine_counts_rows_waiting_for_their_prefill_and_rows_decoding(engine):
    batch = engine.batcher()
    a, b = prompts_of(6, 40, seed=10)
    s = Sampling(temperature=0.0, max_tokens=4)
    batch.add("a", a, 2, s)
    assert engine.stats() == {"sequences_running": 0, "sequences_waiting": 2}
    batch.step()  # nothing decoded yet: all of a's prompt at once
    batch.add("b", b, 3, s)
    batch.chunk = 16
    batch.step()  # a decodes while b's 40 tokens are prefilled 16 a step
    assert engine.stats() == {"sequences_running": 2, "sequences_waiting": 3}
    while not batch.idle:
        batch.step()
    assert engine.stats() == {"sequences_running": 0, "sequences_waiting": 0}


def test_a_short_prompt_in_a_long_ones_slot_and_a_row_ended_by_its_first_token(engine, monkeypatch):
    """A 30-token prompt ends after 2 tokens and its slot goes to a 4-token prompt that joins
    later (the old keys past 4 are masked, not read); a max_tokens 1 request ends at its join."""
    placed, place = [], hf_batch.SlotCache.place

    def recorded(self, slot, prefill, rows, own):
        placed.append((slot, prefill.layers[0].keys.shape[-2]))
        return place(self, slot, prefill, rows, own)

    monkeypatch.setattr(hf_batch.SlotCache, "place", recorded)
    long_p, mid_p, short_p, one_p = prompts_of(30, 5, 4, 7, seed=12)
    greedy = Sampling(temperature=0.0, max_tokens=12)
    two, one = (Sampling(temperature=0.0, max_tokens=m) for m in (2, 1))
    got = run(
        hf_batch.ContinuousBatch(engine),
        {
            0: [("long", long_p, 2, two), ("mid", mid_p, 2, greedy)],
            4: [("short", short_p, 3, greedy), ("one", one_p, 2, one)],
        },
    )
    assert placed == [(0, 30), (1, 5), (0, 4)]  # "one" ended at its join: placed nowhere
    assert_same(got["short"], engine.generate([short_p], [3], greedy)[0])
    assert_same(got["mid"], engine.generate([mid_p], [2], greedy)[0])
    assert_same(got["one"], engine.generate([one_p], [2], one)[0])
    assert [len(c.token_ids) for c in got["one"]] == [1, 1]
