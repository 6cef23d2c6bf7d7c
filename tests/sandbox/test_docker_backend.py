"""What is particular to the docker backend, against a real engine: a slot's warm container is
reused and nothing persists in it, only its idle pid 1 outlives a request, slots are separate users,
the image is small and built locally, and every failure to start names its fix. The hostile
programs run against every backend in test_hostile.py."""

import dataclasses
import os
import sys
import threading
import time

import pytest

from atgrpo.contract.sandbox import ExecRequest, Limits, Verdict
from sandbox_svc.backends import docker_image
from sandbox_svc.backends.base import BackendUnavailable
from sandbox_svc.backends.docker import DockerBackend
from sandbox_svc.policy import Policy, check_exec
from tests.sandbox import hostile

pytestmark = pytest.mark.docker

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


@pytest.fixture(scope="module")
def backend(docker_engine):
    b = DockerBackend(POLICY, client=docker_engine)
    b.check()
    yield b
    ids = [b.container_id(slot) for slot in (0, 1)]
    b.close()
    left = [c.id for c in docker_engine.containers.list(all=True) if c.id in ids]
    assert left == [], "closing the backend left its containers"


def run(backend, code, *, slot=0, limits=FAST, stdin=b"", files=(), cancel=None):
    return backend.run(
        check_exec(ExecRequest("python", code, stdin, files, limits), POLICY), slot, cancel
    )


def processes(backend, slot=0):
    """The processes in slot's container (docker top), as (user, command) pairs."""
    cid = backend.container_id(slot)
    if cid is None:
        return []
    top = backend.client.api.top(cid, ps_args="-o pid,user,stat,args")
    titles = top["Titles"]
    return [dict(zip(titles, p, strict=False)) for p in top["Processes"] or []]


def only_idle(backend, slot=0, wait_s=2.0):
    """Wait (for zombies to be reaped) until the container holds just its idle pid 1."""
    deadline = time.monotonic() + wait_s
    while True:
        procs = processes(backend, slot)
        if len(procs) <= 1 or time.monotonic() > deadline:
            return procs
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_stray_processes(backend):
    yield
    for slot in (0, 1):
        procs = only_idle(backend, slot)
        assert len(procs) <= 1, f"a sandboxed process outlived its request: {procs}"


def test_fork_bomb_is_contained(backend):
    r = run(backend, hostile.FORK_BOMB)
    assert r.verdict is not Verdict.OK
    assert r.wall_ms < FAST.wall_timeout_ms + 1000
    assert len(only_idle(backend)) <= 1
    assert run(backend, "print('after')").stdout == b"after\n"
    procs = only_idle(backend)
    assert len(procs) == 1 and procs[0]["USER"] in ("nobody", "65534"), procs


def test_server_environment_is_invisible(backend, monkeypatch):
    monkeypatch.setenv(hostile.SECRET_VAR, hostile.SECRET_VALUE)
    r = run(backend, hostile.ENV_DUMP)
    assert r.verdict is Verdict.OK
    assert (
        hostile.SECRET_VALUE.encode() not in r.stdout
        and hostile.SECRET_VAR.encode() not in r.stdout
    )
    assert r.stdout.startswith(b"[('HOME', '/tmp/run-") and b"('PATH', '/usr/bin:/bin')" in r.stdout


def test_host_files_are_invisible(backend):
    r = run(
        backend, f"import os\nprint(os.path.exists({os.path.abspath(__file__)!r}), os.listdir('/'))"
    )
    assert r.stdout.startswith(b"False "), r.stdout


def test_a_file_left_in_tmp_is_gone_next_time_in_the_same_container(backend):
    assert run(backend, "print('warm')").ok
    cid = backend.container_id(0)
    assert run(backend, hostile.LEAVE_FILE).stdout == b"wrote\n"
    assert run(backend, hostile.FIND_FILE).stdout == b"False\n"
    assert backend.container_id(0) == cid, "the container was not reused"


def test_a_background_process_does_not_survive(backend):
    assert run(backend, "print('warm')").ok
    cid = backend.container_id(0)
    assert run(backend, hostile.LEAVE_DAEMON).stdout == b"spawned\n"
    assert len(only_idle(backend)) == 1
    r = run(backend, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert r.stdout.count(b",") == 2, r.stdout  # pid 1, its launcher and itself
    assert backend.container_id(0) == cid


def test_the_idle_process_and_launcher_are_out_of_reach(backend):
    r = run(backend, hostile.TAMPER_WITH_PID1)
    assert r.stdout == b"refused 3\n", r.stderr
    # Killing its own launcher is possible (same uid); the container is then replaced.
    cid = backend.container_id(0)
    r = run(backend, hostile.KILL_PARENT)
    assert r.verdict is not Verdict.OK
    assert backend.container_id(0) != cid
    assert run(backend, "print('next')").stdout == b"next\n"


def test_ipc_objects_do_not_persist(backend):
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "print(libc.shmget(0, 4096, 0o1000 | 0o600) >= 0, libc.msgget(0, 0o1000 | 0o600) >= 0)\n"
    )
    assert run(backend, code).stdout == b"True False\n"  # no SysV message queues at all
    assert run(backend, "print(open('/proc/sysvipc/shm').read().count(chr(10)))").stdout == b"1\n"


def test_slots_run_at_once_in_separate_containers_as_separate_users(backend):
    results = {}

    # What is tested is that the two run at once, apart: a wall limit a loaded machine cannot
    # reach (two containers starting Python beside a test run took over FAST's 3 s once).
    roomy = dataclasses.replace(FAST, wall_timeout_ms=30_000)

    def go(slot):
        results[slot] = run(
            backend,
            "import os, time\ntime.sleep(0.3)\nprint(os.getuid())",
            slot=slot,
            limits=roomy,
        )

    threads = [threading.Thread(target=go, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[s].verdict for s in (0, 1)] == [Verdict.OK] * 2, results
    assert results[0].stdout != results[1].stdout
    assert {int(results[s].stdout) for s in (0, 1)} == {backend.uid_for(0), backend.uid_for(1)}
    assert backend.container_id(0) != backend.container_id(1)


def test_image_is_small_reproducible_and_holds_only_python(backend, docker_engine):
    assert backend.image == docker_image.image_tag()  # same host files, same tag: reused
    info = docker_engine.api.inspect_image(backend.image)
    assert info["Size"] < 64 * 2**20
    r = run(backend, "import os\nprint(sorted(os.listdir('/usr/bin')), os.path.exists('/bin/sh'))")
    assert r.stdout == b"['python3', 'python3.11'] False\n", r.stdout
    r = run(backend, "import ctypes, decimal, hashlib, json, lzma, sqlite3, ssl, zlib\nprint('ok')")
    assert r.stdout == b"ok\n", r.stderr


def test_unreachable_engine_names_the_fix(tmp_path, monkeypatch):
    import docker

    nowhere = f"unix://{tmp_path}/no-engine.sock"
    client = docker.DockerClient(base_url=nowhere, version="1.41")  # no version probe on creation
    with pytest.raises(BackendUnavailable, match="does not answer.*start the Docker engine"):
        DockerBackend(POLICY, client=client).check()
    monkeypatch.setenv("DOCKER_HOST", nowhere)  # the default client, from the environment
    with pytest.raises(BackendUnavailable, match=f"engine at {nowhere} does not answer"):
        DockerBackend(POLICY).check()


def test_missing_sdk_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "docker", None)  # import docker now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'atgrpo\[docker\]'"):
        DockerBackend(POLICY).check()


def test_unbuildable_image_names_the_fix(docker_engine, monkeypatch):
    monkeypatch.setattr(docker_image, "PYTHON", "/nonexistent/python3")
    with pytest.raises(
        BackendUnavailable, match="cannot build the docker backend's image.*--docker-image"
    ):
        DockerBackend(POLICY, client=docker_engine).check()


def test_missing_image_names_the_fix(docker_engine):
    with pytest.raises(BackendUnavailable, match="not in the engine"):
        DockerBackend(POLICY, image="atgrpo-no-such-image:0", client=docker_engine).check()
