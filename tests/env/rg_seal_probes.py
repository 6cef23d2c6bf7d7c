"""Answers that try to get out of a scorer call, scored by the `rg_probe` dataset (whose scorer
evals its answer: a stand-in for a scorer that runs what it is given). Each evaluates to HELD when
the seal held and to 1.0 (or 0.0 for an unexpected failure) when it did not.

Run as a script (`python -m tests.env.rg_seal_probes UID`, as root, in a mount namespace of its
own: `unshare --mount --propagation private`), it becomes the chart's non-root user first and
prints the probes' scores as JSON: an env service and its worker under one uid, the case where the
worker's uid alone protects nothing.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

HELD = 0.25
LIBC = "__import__('ctypes').CDLL(None, use_errno=True)"
EPERM = "(0.25 if __import__('ctypes').get_errno() == 1 else 0.0)"  # refused, not merely failed
SHM_KEY = 0x5EA1


def probes(secret: str, env_pid: int, unix_path: str, keyctl_nr: int) -> dict[str, str]:
    """name -> answer; every answer is HELD where the seal holds."""
    return {
        "environ": f"1.0 if {secret!r} in repr(dict(__import__('os').environ)) else 0.25",
        "proc_of_env": f"1.0 if __import__('os').path.exists('/proc/{env_pid}') else 0.25",
        "unix_path": f"1.0 if __import__('os').path.exists({unix_path!r}) else 0.25",
        "unix_socket": f"1.0 if {LIBC}.socket(1, 1, 0) >= 0 else {EPERM}",  # AF_UNIX, abstract too
        "tcp_socket": f"1.0 if {LIBC}.socket(2, 1, 0) >= 0 else {EPERM}",  # AF_INET
        "signal_env": f"1.0 if {LIBC}.kill({env_pid}, 0) == 0 else {EPERM}",
        "signal_all": f"1.0 if {LIBC}.kill(-1, 0) == 0 else {EPERM}",
        # KEYCTL_GET_KEYRING_ID of the session keyring, created if missing
        "keyring": f"1.0 if {LIBC}.syscall({keyctl_nr}, 0, -3, 1) >= 0 else {EPERM}",
        # SysV shared memory: made by one call (0.5), looked for by the next
        "shm_made": f"0.5 if {LIBC}.shmget({SHM_KEY}, 4096, 0o1600) >= 0 else 0.0",
        "shm_seen": f"1.0 if {LIBC}.shmget({SHM_KEY}, 0, 0o600) >= 0 else 0.25",
    }


def keyctl_nr() -> int:
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "keyctl")


def score_all(worker, answers: dict[str, str]) -> dict[str, float | str]:
    """Each answer's score from `worker`, or its JudgeError's reason."""
    import reasoning_gym as rg

    from atgrpo.sdk.judge import JudgeError
    from tests.env import rg_probe

    ds = rg.create_dataset(rg_probe.NAME, seed=0, size=10)
    entry = ds[0]
    out: dict[str, float | str] = {}
    for name, answer in {"reference": entry["answer"], **answers}.items():
        try:
            out[name] = worker.score(ds, rg_probe.NAME, "{}", answer, entry)
        except JudgeError as e:
            out[name] = e.reason
    return out


def run_probes(command_prefix: str = "") -> dict[str, float | str]:
    """The probes against a fresh worker (`command_prefix`: Python the worker runs before its
    main loop, importing rg_scorer: a patch), with a secret in this process's environment and a
    unix socket listening in a directory anyone may enter."""
    from env_svc.envs import rg_scorer

    secret = f"atgrpo-secret-{uuid.uuid4().hex}"
    os.environ["ATGRPO_TEST_SECRET"] = secret
    with tempfile.TemporaryDirectory() as tmp, socket.socket(socket.AF_UNIX) as server:
        path = str(Path(tmp) / "host.sock")
        server.bind(path)
        os.chmod(path, 0o777)  # DAC would let anyone connect: only the seal stands in the way
        server.listen()
        os.chmod(tmp, 0o755)
        patched = [sys.executable, "-c", f"{command_prefix}; rg_scorer.main()"]
        worker = rg_scorer.ScorerWorker(patched if command_prefix else None)
        try:
            return score_all(worker, probes(secret, os.getpid(), path, keyctl_nr()))
        finally:
            worker.stop()
            del os.environ["ATGRPO_TEST_SECRET"]


# A seal step made to fail, or to report success while nothing happened; the check after it must
# catch it. name -> (patch run in the call's child just before it seals itself, the step refused).
BREAKS = {
    "unshare reports success": ("rg_seal._unshare = lambda libc, flags: 0", "namespaces"),
    # what a container runtime's default seccomp profile does to an unprivileged process
    "unshare refused": (
        "import errno, pyseccomp; f = pyseccomp.SyscallFilter(pyseccomp.ALLOW); "
        "f.add_rule(pyseccomp.ERRNO(errno.EPERM), 'unshare'); f.load()",
        "namespaces",
    ),
    "mounts report success": ("rg_seal._mount = lambda *a: 0", "mounts"),
    "no Landlock": ("rg_seal._landlock_abi = lambda libc: 0", "landlock"),
    "Landlock reports success": ("rg_seal._restrict_self = lambda libc, fd: 0", "landlock"),
    "rlimits ignored": ("rg_seal.resource.setrlimit = lambda *a: None", "rlimits"),
    "filter reports success": ("rg_seal._install_filter = lambda libc, bpf: 0", "seccomp"),
    "uid kept": ("rg_seal.os.setresuid = lambda *a: None", "uid"),  # only where the worker is root
}


def broken_worker_main() -> None:
    """The scorer worker, whose child first applies BREAKS[its answer] (the answer is only a key:
    a broken seal scores nothing)."""
    from env_svc.envs import rg_scorer, rg_seal

    child = rg_scorer._child

    def breaking_child(dataset, answer, entry, timeout, w, plan):
        try:
            exec(BREAKS[answer][0], {"rg_seal": rg_seal})
        except BaseException:  # noqa: BLE001 - a child must never return into the worker's loop
            os._exit(1)
        child(dataset, answer, entry, timeout, w, plan)

    rg_scorer._child = breaking_child
    rg_scorer.main()


def _reachable(path: str) -> None:
    """Make `path` reachable for other uids in this mount namespace: a tmpfs (mode 755) over the
    first ancestor others cannot enter, with the one entry on the way bound back into it."""
    parts = Path(path).resolve().parts
    for i in range(2, len(parts)):
        closed = Path(*parts[:i])
        if os.stat(closed).st_mode & 0o001:
            continue
        keep = Path(*parts[: i + 1])
        hold = tempfile.mkdtemp()
        subprocess.run(["mount", "--bind", str(keep), hold], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(closed)], check=True)
        keep.mkdir()
        subprocess.run(["mount", "--move", hold, str(keep)], check=True)
        return


def _become(uid: int) -> None:
    """The chart's pod: runAsUser/runAsGroup `uid`, no groups, no capabilities, no privilege
    escalation (no_new_privs)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)


if __name__ == "__main__":
    _reachable(sys.base_prefix)
    uid = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as home:  # the pod's writable HOME (matplotlib's cache)
        os.chown(home, uid, uid)
        os.environ["HOME"] = home
        _become(uid)
        capped = "from env_svc.envs import rg_scorer, rg_seal; rg_seal._landlock_abi = lambda l: 1"
        print(json.dumps({"as_is": run_probes(), "landlock_abi_1": run_probes(capped)}))
