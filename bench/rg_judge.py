"""reasoning_gym judge throughput: scores per second of the env's judge against the dataset's own
scorer called in-process (how the env scored until the judge was hardened), in one run.

    python bench/rg_judge.py [--answers 200]

Per dataset, the same answers (its reference answers and wrong ones, alternately) are scored by
`asyncio.to_thread(dataset.score_answer, ...)` (the baseline) and by the env's `_score`: our safe
scorer in-process (countdown, n_queens), the exact scorer (basic_arithmetic), or the scorer worker,
a forked child per call (mini_sudoku; polynomial_multiplication after its math-text gate).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _report import parse_args, record  # noqa: E402

from env_svc.envs.reasoning_gym import ReasoningGymEnv  # noqa: E402
from env_svc.envs.rg_scorer import WORKER  # noqa: E402

DATASETS = {
    "countdown": "safe scorer",
    "n_queens": "safe scorer",
    "basic_arithmetic": "exact scorer",
    "mini_sudoku": "worker",
    "polynomial_multiplication": "gate + worker",
}


def episodes(name: str, count: int) -> list[ReasoningGymEnv]:
    envs = []
    for seed in range(count):
        env = ReasoningGymEnv({"dataset": name, "turn_order": ["reasoner"], "train_size": count})
        env.reset(f"train-{seed}", seed, "train")
        envs.append(env)
    return envs


def answers(envs: list[ReasoningGymEnv]) -> list[tuple[ReasoningGymEnv, str]]:
    """Each entry's reference answer, and every other one's swapped for its neighbour's (wrong)."""
    return [(env, envs[(i + i % 2) % len(envs)].entry["answer"]) for i, env in enumerate(envs)]


async def rate(score, pairs) -> float:
    start = time.perf_counter()
    for env, answer in pairs:
        await score(env, answer)
    return len(pairs) / (time.perf_counter() - start)


async def baseline(env: ReasoningGymEnv, answer: str) -> float:
    return float(await asyncio.to_thread(env.dataset.score_answer, answer, env.entry))


async def judge(env: ReasoningGymEnv, answer: str) -> float:
    return (await env._score(answer))[0]


async def main_async(count: int) -> None:
    print(f"{count} answers per dataset (half right, half wrong), sequential")
    print(f"{'dataset':<27} {'new path':<14} {'baseline/s':>11} {'new/s':>9} {'ratio':>7}")
    for name, path in DATASETS.items():
        pairs = answers(episodes(name, count))
        await judge(*pairs[0])  # the worker's start is not a score
        base, new = await rate(baseline, pairs), await rate(judge, pairs)
        print(f"{name:<27} {path:<14} {base:11.0f} {new:9.0f} {new / base:6.2f}x")
        record(
            "rg_judge",
            f"{name} scores/s, {path} vs the dataset's scorer in-process",
            new / base,
            f"{new:.0f} vs {base:.0f} scores/s",
        )
    WORKER.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=200)
    args = parse_args(ap, smoke={"answers": 6})
    asyncio.run(main_async(args.answers))


if __name__ == "__main__":
    main()
