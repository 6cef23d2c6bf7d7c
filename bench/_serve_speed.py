"""Service-level generation speed in the learning bench's mix (a section of bench/real_speed.py):
the pool's tokens/s with the hf engine's continuous batch, with one fixed batch at a time (the
pool's path before it, kept as `HFEngine.continuous = False`), and the engine's fixed-batch rate.

The requests come as the tree driver sends them in bench/real_learning.py's config (two agents,
one turn each, K samples a turn): every task sends its tool request (n=K, max_tokens 96), the
tasks a few tens of ms apart (each its env reset and render first); when a task's tool answers
come back, its env step runs (a program in the sandbox: 50-500 ms here, told apart per task) and
then its reasoner request (n=K, max_tokens 64) goes. Tokens/s: every decoded token over the wall
time from the first request to the last answer. The fixed-batch rate is the engine's own with
every row of an agent's requests in one call (each agent once): no arrival ever waits.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch

from atgrpo.contract.sampling import Sampling


@dataclass(frozen=True)
class Mix:
    tasks: int = 8
    k: int = 4
    tool_tokens: int = 96
    reasoner_tokens: int = 64
    prompt: int = 200  # mean tool prompt tokens; a reasoner's prompt holds the tool's turn too
    arrive_gap_s: float = 0.03
    env_s: tuple[float, float] = (0.05, 0.5)

    def env_seconds(self, task: int) -> float:
        lo, hi = self.env_s
        return lo + (hi - lo) * ((task * 5) % self.tasks) / max(1, self.tasks - 1)

    def sampling(self, agent: str, task: int) -> Sampling:
        tokens = self.tool_tokens if agent == "tool" else self.reasoner_tokens
        return Sampling(
            temperature=1.0, max_tokens=tokens, seed=task + (0 if agent == "tool" else 1000)
        )


def prompts(mix: Mix, vocab: int) -> list[tuple[list[int], list[int]]]:
    """(tool prompt, reasoner prompt) per task, lengths spread from half to 1.5x the mean."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(mix.tasks):
        n = round(mix.prompt * (0.5 + i / max(1, mix.tasks - 1)))
        tool = torch.randint(10, vocab, (n,), generator=g).tolist()
        out.append((tool, tool + torch.randint(10, vocab, (n // 2,), generator=g).tolist()))
    return out


def service_rate(engine, mix: Mix, continuous: bool, name: str) -> tuple[int, float]:
    """(decoded tokens, wall seconds) of the mix through a pool over `engine`."""
    from rollout_svc.pool import PoolRuntime

    was, engine.continuous = engine.continuous, continuous
    try:
        pool = PoolRuntime(name, engine)
        assert pool.continuous == continuous
        ps = prompts(mix, engine.vocab_size)

        async def task(i: int) -> int:
            await asyncio.sleep(i * mix.arrive_gap_s)
            tool = await pool.generate("", ps[i][0], mix.sampling("tool", i), mix.k)
            await asyncio.sleep(mix.env_seconds(i))
            reasoner = await pool.generate("", ps[i][1], mix.sampling("reasoner", i), mix.k)
            return sum(len(c.token_ids) for g in (tool, reasoner) for c in g.completions)

        async def go() -> int:
            return sum(await asyncio.gather(*(task(i) for i in range(mix.tasks))))

        start = time.perf_counter()
        tokens = asyncio.run(go())
        return tokens, time.perf_counter() - start
    finally:
        engine.continuous = was


def fixed_rate(engine, mix: Mix) -> tuple[int, float]:
    """(decoded tokens, seconds) of each agent's requests as one fixed batch, back to back."""
    ps = prompts(mix, engine.vocab_size)
    tokens, seconds = 0, 0.0
    for agent, which in (("tool", 0), ("reasoner", 1)):
        start = time.perf_counter()
        out = engine.generate([p[which] for p in ps], [mix.k] * mix.tasks, mix.sampling(agent, 0))
        seconds += time.perf_counter() - start
        tokens += sum(len(c.token_ids) for per in out for c in per)
    return tokens, seconds


def measure(engine, mix: Mix, rounds: int = 2) -> dict[str, float]:
    """Tokens/s of the three, in one run on one engine: `rounds` rounds of all three in turn (a
    busy machine's load falls on each alike), the best round of each kept (the first forwards of
    a shape pay for setting up its kernels, no part of a rate)."""
    paths = {
        "fixed_batch": lambda: fixed_rate(engine, mix),
        "one_at_a_time": lambda: service_rate(engine, mix, False, "serve-fixed"),
        "continuous": lambda: service_rate(engine, mix, True, "serve-continuous"),
    }
    best: dict[str, tuple[int, float]] = {}
    for _ in range(rounds):
        for name, run in paths.items():
            tokens, seconds = run()
            if name not in best or tokens / seconds > best[name][0] / best[name][1]:
                best[name] = (tokens, seconds)
    for name, (tokens, seconds) in best.items():
        print(
            f"  {name:>14}: {tokens} tokens in {seconds:6.2f} s, {tokens / seconds:7.1f} tokens/s"
        )
    return {name: tokens / seconds for name, (tokens, seconds) in best.items()}
