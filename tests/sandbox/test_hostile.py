"""The sandbox issue's hostile programs against every isolated backend (bwrap and docker): each is
contained with the right verdict, and no process of a program outlives its request."""

import socket
import threading

import pytest

from atgrpo.contract.sandbox import ExecRequest, Limits, Verdict
from sandbox_svc.backends.bwrap import BwrapBackend
from sandbox_svc.backends.docker import DockerBackend
from sandbox_svc.policy import Policy, check_exec
from tests.sandbox import hostile
from tests.sandbox.test_bwrap_backend import uid_processes
from tests.sandbox.test_docker_backend import only_idle

# One worker for the hostile-program modules (--dist loadgroup): their services take fixed host
# uids, and each checks that no process of its uids outlives a request.
pytestmark = pytest.mark.xdist_group("hostile-sandbox")

POLICY = Policy()
FAST = Limits(
    wall_timeout_ms=3000,
    cpu_time_ms=2000,
    memory_bytes=256 * 2**20,
    max_output_bytes=2**16,
    max_processes=32,
    max_file_bytes=2**20,
    max_open_files=64,
)


@pytest.fixture(scope="module", params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    if request.param == "bwrap":
        b, strays = BwrapBackend(POLICY), lambda b: uid_processes(b)
    else:
        b = DockerBackend(POLICY, client=request.getfixturevalue("docker_engine"))
        strays = lambda b: [p for p in only_idle(b)][1:]  # noqa: E731 - all but the idle pid 1
    b.check()
    b.strays = strays
    yield b
    b.close()


@pytest.fixture(autouse=True)
def no_stray_processes(backend):
    yield
    assert backend.strays(backend) == [], "a sandboxed process outlived its request"


def run(backend, code, *, limits=FAST, stdin=b"", files=(), cancel=None):
    return backend.run(
        check_exec(ExecRequest("python", code, stdin, files, limits), POLICY), 0, cancel
    )


def test_hello_with_stdin_and_files(backend):
    r = run(
        backend,
        "import sys\nprint(sys.stdin.read().upper(), open('data/in.txt').read())",
        stdin=b"abc",
        files=(("data/in.txt", b"file!"),),
    )
    assert r.verdict is Verdict.OK, r.stderr
    assert r.stdout == b"ABC file!\n" and r.wall_ms > 0 and r.cpu_ms > 0


def test_runtime_error_keeps_exit_code_and_stderr(backend):
    r = run(backend, "import sys\nprint('partial')\nsys.exit(3)")
    assert (r.verdict, r.exit_code, r.stdout) == (Verdict.RUNTIME_ERROR, 3, b"partial\n")
    r = run(backend, "raise ValueError('bad')")
    assert r.verdict is Verdict.RUNTIME_ERROR and b"ValueError: bad" in r.stderr


def test_fork_bomb_is_contained(backend):
    r = run(backend, hostile.FORK_BOMB)
    assert r.verdict is not Verdict.OK and r.wall_ms < FAST.wall_timeout_ms + 1000
    assert run(backend, "print('after')").stdout == b"after\n"


def test_memory_bomb_gets_memory_limit(backend):
    assert run(backend, hostile.MEMORY_BOMB).verdict is Verdict.MEMORY_LIMIT


def test_infinite_loop_gets_timeout_at_the_cpu_limit(backend):
    # A wall clock far off, so the CPU limit stops it even where a loaded host gives the loop
    # under 2 s of CPU in FAST's 3 s (measured: 1.4 s beside a learning run).
    r = run(
        backend,
        hostile.INFINITE_LOOP,
        limits=Limits(**{**FAST.__dict__, "wall_timeout_ms": 30_000}),
    )
    # stopped well before the wall clock: by the CPU limit, whose kill the rusage reads at 80-100%
    # of it on a loaded host (process.verdict)
    assert r.verdict is Verdict.TIMEOUT and r.wall_ms < 20_000, r
    assert FAST.cpu_time_ms * 0.5 <= r.cpu_ms <= FAST.cpu_time_ms + 1000


def test_output_flood_is_cut_at_the_cap(backend):
    r = run(backend, hostile.OUTPUT_FLOOD)
    assert r.verdict is Verdict.OUTPUT_LIMIT
    assert r.stdout_truncated and len(r.stdout) == FAST.max_output_bytes


def test_host_secrets_are_invisible(backend, monkeypatch):
    monkeypatch.setenv(hostile.SECRET_VAR, hostile.SECRET_VALUE)
    r = run(backend, hostile.READ_SHADOW)
    assert r.verdict is Verdict.RUNTIME_ERROR and (
        b"No such file" in r.stderr or b"Permission denied" in r.stderr
    )
    r = run(backend, hostile.ENV_DUMP)
    assert r.verdict is Verdict.OK
    assert (
        hostile.SECRET_VALUE.encode() not in r.stdout
        and hostile.SECRET_VAR.encode() not in r.stdout
    )


def test_nothing_outside_tmp_is_writable(backend):
    assert run(backend, hostile.WRITE_OUTSIDE_TMP).stdout == b"fails 5\n"


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
    assert r.verdict is Verdict.RUNTIME_ERROR and b"connected" not in r.stdout and got == []


def test_sleep_past_the_wall_limit_is_a_timeout(backend):
    r = run(
        backend, hostile.SLEEP_FOREVER, limits=Limits(**{**FAST.__dict__, "wall_timeout_ms": 500})
    )
    assert r.verdict is Verdict.TIMEOUT and 500 <= r.wall_ms < 1500


def test_closing_the_output_does_not_escape_the_wall_clock(backend):
    # Both pipes end at once; the program sleeps on. Before: the warm sandbox waited for it past
    # the wall limit, gave up after 5 s and restarted the sandbox ("sandbox failure", KILLED).
    r = run(
        backend,
        hostile.CLOSE_OUTPUT_AND_SLEEP,
        limits=Limits(**{**FAST.__dict__, "wall_timeout_ms": 500}),
    )
    assert r.verdict is Verdict.TIMEOUT and 500 <= r.wall_ms < 1500, r
    assert run(backend, "print('next')").stdout == b"next\n"


def test_nothing_persists_between_executions(backend):
    assert run(backend, hostile.LEAVE_FILE).stdout == b"wrote\n"
    assert run(backend, hostile.FIND_FILE).stdout == b"False\n"
    # the autouse fixture checks it died
    assert run(backend, hostile.LEAVE_DAEMON).stdout == b"spawned\n"


def test_cancel_stops_the_program(backend):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    r = run(backend, hostile.SLEEP_FOREVER, cancel=cancel)
    assert r.verdict is Verdict.KILLED and r.wall_ms < 2000


def test_kernel_attack_surface_is_refused(backend):
    # io_uring, bpf, userfaultfd, perf_event_open, keyrings, ptrace, mounts, namespaces, kexec,
    # modules
    r = run(backend, hostile.kernel_surface_probe())
    got = dict(line.split() for line in r.stdout.decode().splitlines())
    assert got == {name: "1" for name in hostile.KERNEL_CALLS}, r.stderr  # EPERM, every one


def test_no_key_is_left_for_the_next_program(backend):
    # Before the filter, a key added to the user keyring was read back by later programs on the
    # slot.
    assert run(backend, hostile.LEAVE_KEY).stdout == b"False\n"
    for _ in range(2):
        assert run(backend, hostile.FIND_KEY).stdout == b"b'none'\n"
