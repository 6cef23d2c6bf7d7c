"""SandboxService over real gRPC on loopback: codes for bad input, a flood shed at the door with
every accepted request completed, deadlines honoured, and the server serving throughout."""

import asyncio
import subprocess
import sys
import time
import urllib.request

import pytest

from atgrpo import errors
from atgrpo.contract.sandbox import Compare, Limits, Verdict
from atgrpo.rpc.server import create_server
from sandbox_svc.backends.bwrap import BwrapBackend
from sandbox_svc.client import SandboxClient
from sandbox_svc.executor import Executor
from sandbox_svc.policy import Policy
from sandbox_svc.server import bindings
from tests.sandbox import hostile

SQUARE = "n = int(input())\nprint(n * n)\n"


def serve(coro_fn, *, workers=2, queue=4, policy=None):
    """Run `coro_fn(client)` against a fresh in-process server with the bwrap backend."""

    async def go():
        executor = Executor(
            BwrapBackend(policy or Policy()), workers=workers, queue=queue, policy=policy
        )
        running = await create_server(bindings(executor))
        try:
            async with SandboxClient(f"127.0.0.1:{running.port}") as client:
                return await coro_fn(client)
        finally:
            await running.stop(0)
            executor.close()

    return asyncio.run(go())


def test_execute_and_run_tests_round_trip():
    async def go(c):
        r = await c.execute(SQUARE, stdin=b"7\n")
        assert (r.verdict, r.stdout) == (Verdict.OK, b"49\n")
        t = await c.run_tests(SQUARE, [(b"2", b"4"), (b"3", b"9\n"), (b"4", b"15")])
        assert [x.passed for x in t.cases] == [True, True, False]
        assert t.passed == 2 and t.pass_ratio == pytest.approx(2 / 3)
        f = await c.run_tests("print(1/3)", [(b"", b"0.3333333")], compare=Compare.FLOAT)
        assert f.passed == 1
        s = await c.run_tests(SQUARE, [(b"x", b"1"), (b"2", b"4")], stop_on_first_failure=True)
        assert s.cases[0].execution.verdict is Verdict.RUNTIME_ERROR
        assert s.cases[1].skipped and s.cases[1].execution is None

    serve(go)


def test_run_tests_answers_fit_one_message_and_cases_are_judged_on_their_whole_output():
    """All cases' outputs together are cut at the policy's budget (here 12 bytes: two of three
    `hello\n`); every case is still judged on its whole output."""

    async def go(c):
        t = await c.run_tests("print('hello')", [(b"", b"hello")] * 3)
        assert [r.passed for r in t.cases] == [True, True, True]
        assert [r.execution.stdout for r in t.cases] == [b"hello\n", b"hello\n", b""]
        assert [r.execution.stdout_truncated for r in t.cases] == [False, False, True]

    serve(go, policy=Policy(max_tests_output_bytes=12))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"code": ""}, "code is empty"),
        ({"code": "x" * (10 * 2**20)}, "over the limit"),
        ({"code": "print(1)", "language": "brainfuck"}, "not supported"),
        ({"code": "\x00\x01\x02garbage"}, "NUL byte"),
        ({"code": "print(1)", "limits": Limits(wall_timeout_ms=10**12)}, "ceiling"),
        ({"code": "print(1)", "files": {"../escape": b"x"}}, "must be relative"),
    ],
)
def test_bad_input_gets_invalid_argument_and_the_server_keeps_serving(kwargs, message):
    async def go(c):
        with pytest.raises(errors.InvalidArgument, match=None) as err:
            await c.execute(**kwargs)
        assert message in err.value.message
        assert (await c.execute("print('fine')")).stdout == b"fine\n"

    serve(go)


def test_hostile_programs_do_not_disturb_the_server():
    async def go(c):
        fast = Limits(
            wall_timeout_ms=2000,
            cpu_time_ms=1000,
            memory_bytes=256 * 2**20,
            max_output_bytes=2**16,
            max_processes=32,
            max_file_bytes=2**20,
            max_open_files=64,
        )
        for code in (
            hostile.FORK_BOMB,
            hostile.MEMORY_BOMB,
            hostile.INFINITE_LOOP,
            hostile.OUTPUT_FLOOD,
            hostile.KILL_PARENT,
            hostile.SLEEP_FOREVER,
        ):
            r = await c.execute(code, limits=fast)
            assert r.wall_ms < 3500
        assert (await c.execute(SQUARE, stdin=b"5")).stdout == b"25\n"
        assert await c.health() == "SERVING"

    serve(go)


def test_flood_is_shed_and_every_accepted_request_completes():
    async def go(c):
        c.retry = False  # see the shedding itself, not the client's backoff
        calls = [c.execute("import time\ntime.sleep(0.2)\nprint('done')") for _ in range(24)]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = serve(go, workers=2, queue=2)
    rejected = [r for r in results if isinstance(r, errors.ResourceExhausted)]
    accepted = [r for r in results if not isinstance(r, Exception)]
    assert len(rejected) + len(accepted) == 24, [r for r in results if isinstance(r, Exception)]
    assert rejected and all(r.retry_after_ms and r.retry_after_ms > 0 for r in rejected)
    assert len(accepted) >= 4
    assert all(r.verdict is Verdict.OK and r.stdout == b"done\n" for r in accepted)


def test_the_call_deadline_bounds_the_program():
    async def go(c):
        start = asyncio.get_running_loop().time()
        try:
            r = await c.execute(
                hostile.SLEEP_FOREVER, limits=Limits(wall_timeout_ms=60_000), timeout_s=1.0
            )
            assert r.verdict is Verdict.TIMEOUT
        except errors.DeadlineExceeded:
            pass
        assert asyncio.get_running_loop().time() - start < 2.0
        # The slot is free again right away.
        assert (await c.execute("print(2)")).stdout == b"2\n"

    serve(go, workers=1, queue=0)


def _start(args, env):
    return subprocess.run(
        [sys.executable, "-m", "sandbox_svc", "--port", "0", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_unsafe_backend_needs_the_explicit_flag(subprocess_env):
    out = _start(["--backend", "subprocess"], subprocess_env)
    assert out.returncode != 0
    assert "--unsafe-no-isolation" in out.stderr and "NO isolation" in out.stderr


def test_unsafe_backend_says_so_at_start_and_on_every_scrape(tmp_path, subprocess_env):
    port_file = tmp_path / "port.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_svc",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--port-file",
            str(port_file),
            "--backend",
            "subprocess",
            "--unsafe-no-isolation",
        ],
        env=subprocess_env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(300):
            if port_file.exists():
                break
            asyncio.run(asyncio.sleep(0.05))
        import json

        metrics_port = json.loads(port_file.read_text())["metrics_port"]
        for _ in range(2):
            body = (
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
                .read()
                .decode()
            )
            assert "atgrpo_sandbox_isolation_disabled 1.0" in body
            assert "SANDBOX ISOLATION IS OFF" in body
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert stderr.count("SANDBOX ISOLATION IS OFF") >= 3  # at start, and once per scrape


def test_unsafe_backend_keeps_the_wall_clock_after_the_output_closes():
    # The program ends both pipes and sleeps on: run_launch must not wait for it past the wall.
    from atgrpo.contract.sandbox import ExecRequest
    from sandbox_svc.backends.unsafe import SubprocessBackend

    limits = Limits(wall_timeout_ms=500, cpu_time_ms=2000)
    r = SubprocessBackend().run(
        ExecRequest("python", hostile.CLOSE_OUTPUT_AND_SLEEP, b"", (), limits), 0
    )
    assert r.verdict is Verdict.TIMEOUT and 500 <= r.wall_ms < 1500, r


def test_unsafe_backend_kills_a_program_with_a_child_at_its_wall_clock():
    # The kill took the child first, then waited a second for the program to exit by itself.
    import psutil

    from atgrpo.contract.sandbox import ExecRequest
    from sandbox_svc.backends.unsafe import SubprocessBackend

    limits = Limits(wall_timeout_ms=1000, cpu_time_ms=4000)
    r = SubprocessBackend().run(ExecRequest("python", hostile.CHILD_AND_SLEEP, b"", (), limits), 0)
    assert r.verdict is Verdict.TIMEOUT and 1000 <= r.wall_ms < 1900, r
    child = int(r.stdout.split()[0])
    # SIGKILL reaches the child in its own time: dead (a zombie, or reaped) within a few seconds
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"the program's child {child} still runs after its kill")


@pytest.mark.parametrize(
    ("cpu_ms", "expected"),
    [(2000, Verdict.TIMEOUT), (1600, Verdict.TIMEOUT), (900, Verdict.KILLED)],
)
def test_a_sigkill_near_the_cpu_limit_is_the_limit(cpu_ms, expected):
    # RLIMIT_CPU kills with SIGKILL; on a loaded host the killed program's rusage read as low as
    # 80% of the limit. Under half of it, the SIGKILL came from elsewhere.
    import signal

    from sandbox_svc.backends.process import verdict
    from sandbox_svc.languages import LANGUAGES

    limits = Limits(wall_timeout_ms=3000, cpu_time_ms=1500)  # enforced as RLIMIT_CPU = 2 s
    assert verdict(None, 0, signal.SIGKILL, cpu_ms, b"", limits, LANGUAGES["python"]) is expected
