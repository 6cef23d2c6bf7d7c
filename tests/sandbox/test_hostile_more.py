"""More hostile programs, through the real service: `python -m sandbox_svc` (bwrap backend) on
loopback, with a secret auth token in its environment, driven by SandboxClient. Every program is
contained, gets a verdict within its limits, leaves no process behind, and the service keeps
answering a normal request quickly afterwards."""

import asyncio
import json
import os
import platform
import subprocess
import sys
import time

import psutil
import pytest

from atgrpo import errors
from atgrpo.contract.sandbox import Limits, Verdict
from sandbox_svc.client import SandboxClient

TOKEN = "tok-planted-by-test-hostile-more-0123456789abcdef"
SECRET = "s3cr3t-env-of-the-sandbox-service"
# Not 61000: the docker backend's programs run as 61000 + slot (backends/docker_image.py) and show
# on this host; a docker test on the other pytest worker read as this service's strays.
UID_BASE = 61500

# One worker for the hostile-program modules (--dist loadgroup): their services take fixed host
# uids, and each checks that no process of its uids outlives a request.
pytestmark = pytest.mark.xdist_group("hostile-sandbox")
WORKERS = 2
FAST = Limits(
    wall_timeout_ms=2000,
    cpu_time_ms=1000,
    memory_bytes=256 * 2**20,
    max_output_bytes=2**16,
    max_processes=32,
    max_file_bytes=2**20,
    max_open_files=64,
)


def limits(**kw) -> Limits:
    return Limits(**{**FAST.__dict__, **kw})


@pytest.fixture(scope="module")
def service(tmp_path_factory, request):
    port_file = tmp_path_factory.mktemp("sandbox") / "port.json"
    root = str(request.config.rootpath)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        "ATGRPO_LOG_LEVEL": "WARNING",
        "ATGRPO_AUTH_TOKEN": TOKEN,
        "ATGRPO_TEST_SECRET": SECRET,
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_svc",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--workers",
            str(WORKERS),
            "--uid-base",
            str(UID_BASE),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sandbox service did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    proc.address = f"127.0.0.1:{json.loads(port_file.read_text())['port']}"
    proc.port = json.loads(port_file.read_text())["port"]
    yield proc
    proc.terminate()
    try:
        proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    deadline = time.monotonic() + 5  # the sandboxes die with the server; the host's init reaps them
    while [p for p in program_processes(all_of_them=True) if _alive(p)]:
        assert time.monotonic() < deadline, "stopping the service left sandboxed processes"
        time.sleep(0.1)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def program_processes(all_of_them: bool = False) -> list[psutil.Process]:
    """Processes of the slots' uids other than each slot's warm bwrap and its pid-1 zygote."""
    slot_uids = range(UID_BASE, UID_BASE + WORKERS) if os.geteuid() == 0 else ()
    procs = [
        p
        for p in psutil.process_iter(["uids", "ppid", "name"])
        if p.info["uids"] and p.info["uids"].real in slot_uids
    ]
    if all_of_them:
        return procs
    bwraps = {p.pid for p in procs if p.info["name"] == "bwrap"}
    return [p for p in procs if p.pid not in bwraps and p.info["ppid"] not in bwraps]


def call(service, fn):
    async def go():
        async with SandboxClient(service.address) as client:
            return await fn(client)

    return asyncio.run(go())


def execute(service, code, **kw):
    kw.setdefault("limits", FAST)
    return call(service, lambda c: c.execute(code, **kw))


@pytest.fixture(autouse=True)
def stays_healthy(service):
    yield
    assert service.poll() is None, "the sandbox service died"
    start = time.monotonic()
    r = execute(service, "print('still fine')")
    assert (r.verdict, r.stdout) == (Verdict.OK, b"still fine\n")
    assert time.monotonic() - start < 3.0
    assert program_processes() == [], "a sandboxed process outlived its request"


# --- processes and time -------------------------------------------------------------------


def test_fork_bomb_that_swallows_errors_ends_at_the_wall(service):
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    r = execute(service, code)
    assert r.verdict is not Verdict.OK and r.wall_ms < FAST.wall_timeout_ms + 1500


def test_thread_bomb_hits_the_process_limit(service):
    code = (
        "import threading, time\nn = 0\ntry:\n    while True:\n"
        "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n    print('capped', n <= 32)\n"
    )
    r = execute(service, code)
    assert (r.verdict, r.stdout) == (Verdict.OK, b"capped True\n")


def test_sigterm_and_sigxcpu_ignored_busy_loop_times_out(service):
    code = (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n"
    )
    r = execute(service, code)
    assert r.verdict is Verdict.TIMEOUT and r.wall_ms < FAST.wall_timeout_ms + 1500


def test_sleeping_parent_holding_children_times_out_and_all_die(service):
    code = (
        "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nfor _ in "
        "range(8):\n    if os.fork() == 0:\n        time.sleep(100)\n        "
        "os._exit(0)\ntime.sleep(100)\n"
    )
    r = execute(service, code, limits=limits(wall_timeout_ms=800))
    # stays_healthy checks no strays
    assert r.verdict is Verdict.TIMEOUT and 800 <= r.wall_ms < 2500


def test_double_forked_daemon_dies_with_the_program(service):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        for fd in (0, 1, 2):\n            os.close(fd)\n"
        "        while True:\n            open('/tmp/daemon-alive', 'w').write('x'); "
        "time.sleep(0.05)\n    os._exit(0)\nprint('parent exits')\n"
    )
    r = execute(service, code)
    assert (r.verdict, r.stdout) == (Verdict.OK, b"parent exits\n") and r.wall_ms < 1500
    assert program_processes() == []
    for _ in range(WORKERS):  # whichever slot ran it: nothing of it is there now
        assert (
            execute(service, "import os\nprint(os.path.exists('/tmp/daemon-alive'))").stdout
            == b"False\n"
        )


def test_daemon_holding_stdout_does_not_delay_the_answer(service):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('bye')\n"
    )
    r = execute(service, code)
    assert (r.verdict, r.stdout) == (Verdict.OK, b"bye\n") and r.wall_ms < 1500


@pytest.mark.parametrize("then", ["while True:\n    pass\n", "import time\ntime.sleep(3600)\n"])
def test_closing_stdout_and_stderr_early_still_times_out(service, then):
    r = execute(service, "import os\nos.close(1)\nos.close(2)\n" + then)
    assert r.verdict is Verdict.TIMEOUT and r.wall_ms < FAST.wall_timeout_ms + 1500


def test_rlimits_cannot_be_raised(service):
    code = (
        "import resource\nfor name in ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_NOFILE', "
        "'RLIMIT_FSIZE'):\n    r = getattr(resource, name)\n    try:\n"
        "        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)); "
        "print('RAISED', name)\n    except (ValueError, OSError):\n        pass\nprint('done')\n"
    )
    assert execute(service, code).stdout == b"done\n"


def test_ptrace_is_refused(service):
    code = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\npid = os.fork()\n"
        "if pid == 0:\n    time.sleep(5)\n    os._exit(0)\n"
        "print(libc.ptrace(16, pid, 0, 0), libc.ptrace(16, 1, 0, 0))\nos.kill(pid, 9)\n"
    )
    assert execute(service, code).stdout == b"-1 -1\n"


# --- memory --------------------------------------------------------------------------------


def test_memory_hog_via_mmap_gets_memory_limit(service):
    code = (
        "import mmap\nm = []\nwhile True:\n"
        "    x = mmap.mmap(-1, 2**26); x.write(b'x' * 2**26); m.append(x)\n"
    )
    assert execute(service, code).verdict is Verdict.MEMORY_LIMIT


def test_sysv_shared_memory_cannot_be_mapped(service):
    # Detached SysV segments count against no rlimit: attach, fill, detach, repeat would fill the
    # host.
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = "
        "ctypes.c_void_p\nsid = libc.shmget(0, ctypes.c_size_t(2**20), 0o1000 | 0o600)\naddr = "
        "libc.shmat(sid, None, 0)\nprint(sid >= 0, addr == ctypes.c_void_p(-1).value)\n"
    )
    r = execute(service, code)
    assert (r.verdict, r.stdout) == (Verdict.OK, b"True True\n"), r.stderr


def test_memfd_files_cannot_be_made(service):
    # A memfd is memory no rlimit counts (up to the file-size limit, per open file, per process).
    code = (
        "import os\ntry:\n    os.memfd_create('x')\nexcept OSError as e:\n    print(e.errno)\n"
        "else:\n    print('made')\n"
    )
    assert execute(service, code).stdout == b"38\n"  # ENOSYS


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386 system calls from x86_64 code")
def test_foreign_abi_system_calls_are_refused(service):
    code = (
        "import ctypes, mmap\n"
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "m.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))  "
        "# mov eax, 20 (getpid); int 0x80; ret\n"
        "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
        "print(f())\n"
    )
    assert execute(service, code).stdout == b"-38\n"  # ENOSYS


# --- output and input ----------------------------------------------------------------------


@pytest.mark.parametrize("fd", [1, 2])
def test_gigabytes_of_output_are_cut_at_the_default_cap(service, fd):
    code = f"import os\nb = b'x' * 2**20\nwhile True:\n    os.write({fd}, b)\n"
    r = execute(service, code, limits=limits(max_output_bytes=0, wall_timeout_ms=5000))
    data, truncated = (r.stdout, r.stdout_truncated) if fd == 1 else (r.stderr, r.stderr_truncated)
    assert (
        r.verdict is Verdict.OUTPUT_LIMIT and truncated and len(data) == 2**20 and r.wall_ms < 3000
    )


def test_invalid_utf8_and_nul_bytes_come_back_exactly(service):
    code = (
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00abc\\x80\\n')\n"
        "sys.stderr.buffer.write(b'\\x00\\xc3\\x28')\n"
    )
    r = execute(service, code)
    assert (r.verdict, r.stdout, r.stderr) == (
        Verdict.OK,
        b"\xff\xfe\x00abc\x80\n",
        b"\x00\xc3\x28",
    )


def test_huge_stdin_echoed_is_cut_and_unread_stdin_is_harmless(service):
    stdin = b"z" * (16 * 2**20)
    r = execute(
        service, "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())", stdin=stdin
    )
    assert r.verdict is Verdict.OUTPUT_LIMIT and len(r.stdout) == FAST.max_output_bytes
    assert execute(service, "print('hi')", stdin=stdin).stdout == b"hi\n"
    with pytest.raises(errors.InvalidArgument, match="stdin"):
        execute(service, "print(1)", stdin=stdin + b"z")


# --- files and secrets ---------------------------------------------------------------------


def test_tmp_and_shm_are_capped_and_files_by_rlimit(service):
    code = (
        "import os\nfor d in ('/tmp', '/dev/shm'):\n    try:\n        with open(d + '/fill', 'wb') "
        "as f:\n            while True:\n                f.write(b'x' * 2**20); f.flush()\n    "
        "except OSError as e:\n        print(d, e.errno)\n"
    )
    r = execute(service, code, limits=limits(max_file_bytes=2**30))
    assert r.stdout == b"/tmp 28\n/dev/shm 28\n"  # ENOSPC at the tmpfs size
    r = execute(
        service, "f = open('/tmp/big', 'wb')\nwhile True:\n    f.write(b'x' * 2**20); f.flush()\n"
    )
    assert r.verdict is Verdict.RUNTIME_ERROR and b"File too large" in r.stderr


def test_service_environment_and_host_files_are_out_of_reach(service):
    code = (
        "import os\nprint(sorted(os.environ))\nfor p in ('/proc/1/environ', '/proc/self/environ', "
        "'/etc/shadow', '/etc/passwd', '/work', '/root', '/home', '/run', '/sys'):\n"
        "    try:\n        print(p, 'READ', open(p, 'rb').read()[:100] if os.path.isfile(p) else "
        "os.listdir(p))\n    except OSError as e:\n        print(p, e.errno)\n"
    )
    r = execute(service, code)
    assert r.verdict is Verdict.OK, r.stderr
    assert (
        TOKEN.encode() not in r.stdout
        and SECRET.encode() not in r.stdout
        and b"READ" not in r.stdout
    )
    assert r.stdout.splitlines()[0] == b"['HOME', 'LC_CTYPE', 'PATH', 'PWD']"


def test_the_service_itself_is_unreachable(service):
    code = (
        "import socket\nfor host in ('127.0.0.1', '::1'):\n    try:\n"
        f"        socket.create_connection((host, {service.port}), timeout=1); print('CONNECTED', "
        f"host)\n"
        "    except OSError as e:\n        print(host, e.errno)\n"
        "try:\n    socket.getaddrinfo('example.com', 80); print('RESOLVED')\nexcept OSError:\n    "
        "pass\nfor name in ('\\0grpc', '/tmp/.s'):\n    try:\n        "
        "socket.socket(socket.AF_UNIX).connect(name)\n    except OSError:\n        pass\n    "
        "else:\n        print('UNIX', name)\n"
    )
    r = execute(service, code)
    assert r.verdict is Verdict.OK and r.stdout == b"127.0.0.1 111\n::1 111\n", r.stdout + r.stderr


def test_concurrent_runs_see_neither_files_nor_stdin_of_each_other(service):
    victim = (
        "import sys, time\ndata = sys.stdin.read()\nopen('/tmp/run/secret', 'w').write(data)\n"
        "open('/dev/shm/secret', 'w').write(data)\ntime.sleep(1.0)\nprint('victim', len(data))\n"
    )
    spy = (
        "import os, time\nseen = set()\nend = time.monotonic() + 1.0\nwhile time.monotonic() < "
        "end:\n    for d in ('/tmp/run', '/dev/shm'):\n        seen.update(os.listdir(d))\n    "
        "seen.update(p for p in os.listdir('/proc') if p.isdigit())\n    "
        "time.sleep(0.01)\nprint(sorted(seen - {'main.py', '1', str(os.getpid())}))\n"
    )

    async def both(c):
        return await asyncio.gather(
            c.execute(victim, stdin=b"VICTIM-SECRET", limits=FAST), c.execute(spy, limits=FAST)
        )

    v, s = call(service, both)
    assert v.stdout == b"victim 13\n" and s.verdict is Verdict.OK
    assert s.stdout == b"[]\n", s.stdout


# --- RunTests -------------------------------------------------------------------------------

SQUARE_CASES = [(b"2", b"4"), (b"3", b"9"), (b"4", b"16")]


@pytest.mark.parametrize(
    "code, at_most",
    [
        ("import sys\nsys.exit(0)\n", 0),  # exits 0 early, no output
        ("print(4)\nprint(9)\nprint(16)\n", 0),  # every expected output at once
        # state carried across cases
        (
            "import os\np = '/tmp/n'\nn = int(open(p).read()) if os.path.exists(p) else 0\n"
            "open(p, 'w').write(str(n + 1))\nprint([4, 9, 16][n])\n",
            1,
        ),
        # answers after it exited
        (
            "import os, sys, time\nn = int(sys.stdin.read())\nif os.fork() == 0:\n"
            "    time.sleep(0.2); print(n * n); os._exit(0)\n",
            0,
        ),
        (
            "import os, sys\nprint(int(sys.stdin.read()) ** 2, flush=True)\nos.kill(os.getpid(), "
            "9)\n",
            0,
        ),
        # "monkeypatching" the judge
        (
            "import builtins\nbuiltins.len = lambda x: 0\nprint('x')\n",
            0,
        ),
    ],
    ids=["exit0", "all-expected", "state", "late-daemon", "then-killed", "monkeypatch"],
)
def test_run_tests_harness_cannot_be_gamed(service, code, at_most):
    r = call(service, lambda c: c.run_tests(code, SQUARE_CASES, limits=FAST))
    # the state case passes only its first case: /tmp is wiped between cases
    assert r.passed == at_most


def test_a_flood_of_files_is_not_run_twice_nor_left_for_the_next_program(service):
    """Directories made until the wall: wiping them can take longer than the program ran. The
    answer is the program's own (TIMEOUT, its output kept), not a sandbox failure after a second
    run, and the next program finds /tmp as a fresh one does."""
    listing = "import os\nprint(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))"
    fresh = execute(service, listing).stdout
    flood = (
        "import os, itertools\nprint('started', flush=True)\n"
        "for i in itertools.count():\n    os.mkdir(f'/tmp/d{i}')\n"
    )
    r = execute(service, flood, limits=limits(wall_timeout_ms=2000, cpu_time_ms=2000))
    assert r.verdict is Verdict.TIMEOUT, (r.verdict, r.stderr[-300:])
    assert r.stdout == b"started\n"
    assert execute(service, listing).stdout == fresh


def test_output_at_the_ceiling_gets_a_verdict(service):
    """Both streams over the largest per-stream cap a request may ask for: a verdict with the
    outputs cut, never an answer too large for one gRPC message."""
    code = (
        "import os\nb = b'x' * 2**20\nfor _ in range(17):\n    os.write(1, b)\n    os.write(2, b)\n"
    )
    ceiling = 16 * 2**20
    r = execute(
        service,
        code,
        limits=limits(max_output_bytes=ceiling, wall_timeout_ms=8000, cpu_time_ms=6000),
    )
    assert r.verdict is Verdict.OUTPUT_LIMIT
    assert r.stdout_truncated and len(r.stdout) <= ceiling and len(r.stderr) <= ceiling
    with pytest.raises(errors.InvalidArgument, match="over this server's ceiling"):
        execute(service, "print(1)", limits=limits(max_output_bytes=ceiling + 1))
