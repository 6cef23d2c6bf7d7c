"""The bwrap backend against hostile programs: each is contained with the right verdict, nothing
persists between executions, and no process of a sandbox uid outlives its request."""

import os
import socket
import threading

import psutil
import pytest

from sandbox_svc.backends.base import BackendUnavailable
from sandbox_svc.backends.bwrap import BwrapBackend
from sandbox_svc.model import ExecRequest, Limits, Verdict
from sandbox_svc.policy import Policy, check_exec
from tests.sandbox import hostile

POLICY = Policy()
FAST = Limits(wall_timeout_ms=3000, cpu_time_ms=2000, memory_bytes=256 * 2**20, max_output_bytes=2**16,
              max_processes=32, max_file_bytes=2**20, max_open_files=64)


@pytest.fixture(scope="module")
def backend():
    b = BwrapBackend(POLICY)
    b.check()
    yield b
    b.close()
    assert uid_processes(b) == [], "closing the backend left its sandbox running"


def run(backend, code, *, slot=0, limits=FAST, stdin=b"", files=()):
    return backend.run(check_exec(ExecRequest("python", code, stdin, files, limits), POLICY), slot)


def uid_processes(backend, slot=0):
    uid = backend.uid_for(slot)
    if uid is None:
        return []
    keep = backend.sandbox_pids(slot)
    return [p for p in psutil.process_iter(["uids"])
            if p.info["uids"] and p.info["uids"].real == uid and p.pid not in keep]


@pytest.fixture(autouse=True)
def no_stray_processes(backend):
    yield
    assert uid_processes(backend) == [], "a sandboxed process outlived its request"


def test_hello_with_stdin_and_files(backend):
    r = run(backend, "import sys\nprint(sys.stdin.read().upper(), open('data/in.txt').read())",
            stdin=b"abc", files=(("data/in.txt", b"file!"),))
    assert r.verdict is Verdict.OK, r.stderr
    assert r.stdout == b"ABC file!\n"
    assert r.wall_ms > 0 and r.cpu_ms > 0


def test_runtime_error_keeps_exit_code_and_stderr(backend):
    r = run(backend, "import sys\nprint('partial')\nsys.exit(3)")
    assert (r.verdict, r.exit_code, r.stdout) == (Verdict.RUNTIME_ERROR, 3, b"partial\n")
    r = run(backend, "raise ValueError('bad')")
    assert r.verdict is Verdict.RUNTIME_ERROR and b"ValueError: bad" in r.stderr


def test_fork_bomb_is_contained(backend):
    r = run(backend, hostile.FORK_BOMB)
    assert r.verdict is not Verdict.OK
    assert r.wall_ms < FAST.wall_timeout_ms + 1000


def test_memory_bomb_gets_memory_limit(backend):
    r = run(backend, hostile.MEMORY_BOMB)
    assert r.verdict is Verdict.MEMORY_LIMIT, r.stderr


def test_infinite_loop_gets_timeout_at_the_cpu_limit(backend):
    r = run(backend, hostile.INFINITE_LOOP)
    assert r.verdict is Verdict.TIMEOUT
    assert FAST.cpu_time_ms * 0.9 <= r.cpu_ms <= FAST.cpu_time_ms + 1000


def test_output_flood_is_cut_at_the_cap(backend):
    r = run(backend, hostile.OUTPUT_FLOOD)
    assert r.verdict is Verdict.OUTPUT_LIMIT
    assert r.stdout_truncated and len(r.stdout) == FAST.max_output_bytes


def test_host_secrets_are_invisible(backend, monkeypatch):
    monkeypatch.setenv(hostile.SECRET_VAR, hostile.SECRET_VALUE)
    r = run(backend, hostile.READ_SHADOW)
    assert r.verdict is Verdict.RUNTIME_ERROR and b"No such file" in r.stderr
    r = run(backend, hostile.ENV_DUMP)
    assert r.verdict is Verdict.OK
    assert hostile.SECRET_VALUE.encode() not in r.stdout and hostile.SECRET_VAR.encode() not in r.stdout


def test_nothing_outside_tmp_is_writable(backend):
    r = run(backend, hostile.WRITE_OUTSIDE_TMP)
    assert r.stdout == b"fails 5\n"
    assert not os.path.exists("/x")


def test_host_loopback_is_unreachable(backend):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    got = []

    def accept():
        try:
            got.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    r = run(backend, hostile.connect_to(server.getsockname()[1]))
    t.join()
    server.close()
    assert r.verdict is Verdict.RUNTIME_ERROR and b"connected" not in r.stdout
    assert got == []


def test_the_parent_cannot_be_killed(backend):
    r = run(backend, hostile.KILL_PARENT)
    assert psutil.Process().is_running()
    assert b"still here" in r.stdout or r.verdict is Verdict.KILLED


def test_sleep_past_the_wall_limit_is_a_timeout(backend):
    r = run(backend, hostile.SLEEP_FOREVER, limits=Limits(**{**FAST.__dict__, "wall_timeout_ms": 500}))
    assert r.verdict is Verdict.TIMEOUT
    assert 500 <= r.wall_ms < 1500


def test_nothing_persists_between_executions(backend):
    assert run(backend, hostile.LEAVE_FILE).stdout == b"wrote\n"
    assert run(backend, hostile.FIND_FILE).stdout == b"False\n"
    assert run(backend, hostile.LEAVE_DAEMON).stdout == b"spawned\n"
    # The autouse fixture then checks that the daemon did not survive.


def test_the_warm_interpreter_is_out_of_reach(backend):
    r = run(backend, hostile.TAMPER_WITH_PID1)
    assert r.stdout in (b"refused 2\n", b"refused 3\n"), r.stderr   # kill(1) is ignored, not refused
    assert run(backend, "print('next')").stdout == b"next\n"


def test_tracebacks_look_like_a_plain_interpreter(backend):
    r = run(backend, "def f():\n    raise KeyError('k')\nf()\n")
    assert r.stderr.startswith(b"Traceback (most recent call last):\n  File \"/tmp/run/main.py\", line 3")
    assert b"<string>" not in r.stderr


def test_ipc_left_behind_discards_the_sandbox(backend):
    code = ("import ctypes\nlibc = ctypes.CDLL(None)\n"
            "print(libc.shmget(0, 4096, 0o1000 | 0o600) >= 0)\n")  # IPC_PRIVATE, IPC_CREAT
    assert run(backend, code).stdout == b"True\n"
    assert run(backend, "print(open('/proc/sysvipc/shm').read().count(chr(10)))").stdout == b"1\n"


def test_cancel_stops_the_program(backend):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    req = check_exec(ExecRequest("python", hostile.SLEEP_FOREVER, limits=FAST), POLICY)
    r = backend.run(req, 0, cancel)
    assert r.verdict is Verdict.KILLED and r.wall_ms < 2000


def test_missing_bubblewrap_names_the_fix():
    with pytest.raises(BackendUnavailable, match="apt-get install bubblewrap"):
        BwrapBackend(POLICY, bwrap="/nonexistent/bwrap").check()
