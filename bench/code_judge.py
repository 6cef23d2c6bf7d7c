"""HumanEval judging throughput: the proxy judge (check() in the env, each call of the answer in
its own sandboxed process) against the judge it replaced, measured in the same run on the same
bwrap sandbox.

    python bench/code_judge.py [--problems 164] [--workers 2]

The baseline is the old shared-namespace program (prompt, answer, test and check(entry_point) in
one interpreter, one sandbox run per answer), kept here only to be measured: answers could fool
it (docs/environments.md, "What each judge guarantees"). Both judge the canonical solutions (all
pass) and `return None` bodies (all fail), answers judged concurrently as a rollout's branches are.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record, sandbox_uid_base  # noqa: E402

from env_svc.datasets import Source, load  # noqa: E402
from env_svc.envs.code import CodeEnv  # noqa: E402
from env_svc.envs.code_check import complete_function  # noqa: E402
from env_svc.envs.common import sandbox_call  # noqa: E402
from sandbox_svc.backends.bwrap import BwrapBackend  # noqa: E402
from sandbox_svc.executor import Executor  # noqa: E402
from sandbox_svc.inprocess import LocalSandbox  # noqa: E402
from sandbox_svc.policy import Policy  # noqa: E402

OLD = """\
import sys
real, sys.stdout = sys.stdout, sys.stderr
ns = {{"__name__": "solution"}}
exec(compile({source!r}, "solution.py", "exec"), ns)
exec(compile({test!r}, "test.py", "exec"), ns)
ns["check"](ns[{name!r}])
sys.stdout = real
print("PASSED")
"""


async def old_judge(sandbox, problems, answers) -> list[bool]:
    env = CodeEnv({"dataset": "humaneval"})

    async def one(p, a):
        program = OLD.format(
            source=complete_function(p.starter_code, a, p.fn_name), test=p.check, name=p.fn_name
        )
        res = await sandbox_call(
            sandbox.run_tests, program, [(b"", b"PASSED\n")], limits=env.limits
        )
        return bool(res.cases[0].passed)

    return list(await asyncio.gather(*(one(p, a) for p, a in zip(problems, answers, strict=True))))


async def new_judge(sandbox, problems, answers) -> list[bool]:
    async def one(p, a):
        env = CodeEnv({"dataset": "humaneval", "turn_order": ["coder"]})
        env.reset(p.id, 0, "eval")
        env.sandbox = sandbox
        return (await env.step("coder", f"```python\n{a}\n```")).success

    return list(await asyncio.gather(*(one(p, a) for p, a in zip(problems, answers, strict=True))))


async def measure(args) -> None:
    problems = load("code", Source("humaneval"), "eval")[: args.problems]
    backend = BwrapBackend(Policy(), uid_base=sandbox_uid_base(args.workers))
    executor = Executor(backend, workers=args.workers)
    sandbox = LocalSandbox(executor)
    try:
        print(f"{'answers':<22} {'judge':<10} {'answers/s':>10} {'passed':>8}")
        for label, answers, want in (
            ("canonical solutions", [p.solution for p in problems], True),
            ("`return None` bodies", ["    return None\n"] * len(problems), False),
        ):
            rates = {}
            for name, judge in (("old", old_judge), ("proxy", new_judge)):
                t = time.monotonic()
                verdicts = await judge(sandbox, problems, answers)
                rates[name] = len(problems) / (time.monotonic() - t)
                assert all(v is want for v in verdicts), (name, label, verdicts)
                print(f"{label:<22} {name:<10} {rates[name]:>10.1f} {sum(verdicts):>8}")
            ratio = rates["proxy"] / rates["old"]
            print(f"{label:<22} proxy/old: {ratio:.2f}x")
            record(
                "code_judge",
                f"HumanEval {label} judged/s, proxy vs shared-namespace judge",
                ratio,
                f"{rates['proxy']:.1f} vs {rates['old']:.1f} answers/s, {len(problems)} problems",
            )
    finally:
        executor.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=164)
    ap.add_argument("--workers", type=int, default=2)
    asyncio.run(measure(parse_args(ap, {"problems": 6})))


if __name__ == "__main__":
    main()
