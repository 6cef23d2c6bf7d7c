"""The seal around one call of a reasoning-gym scorer (rg_scorer.py forks a child per call; `seal`
shuts that child in before the dataset's `score_answer` sees the answer).

Each step is checked after it is taken, and a step that fails or does not take hold raises
`Unsealed(step)`: the call is refused ("isolation_failed"), never scored open. In order:

- fds: stdin, stdout and stderr on /dev/null, every other descriptor but the verdict pipe closed,
  a session of its own (checked: the session, the count of open descriptors).
- uid: uid/gid 65534 and no groups when the worker runs as root (checked: getresuid/getresgid).
- namespaces: new user, mount, network and IPC namespaces (checked: each /proc/self/ns link
  changed, the network holds only `lo`). So no network and none of the host's abstract unix
  sockets; SysV IPC and POSIX message queues of its own, gone with the call.
- mounts: the whole tree read-only, and an empty tmpfs over /proc and the places host sockets and
  scratch files live (/tmp, /var/tmp, /run, /dev/shm, /home, /root; one that holds the interpreter
  or the project stays) (checked: "/" read-only, each hidden place empty and a new mount).
- landlock: a domain that refuses every file write, execve, and ptrace outside it (ABI 6+: also
  signals and abstract sockets) (checked: /dev/null, open for writing just before, is refused).
- rlimits: CPU seconds, address space ~1 GiB beyond the worker's, file size 0, no new processes
  (checked: getrlimit).
- seccomp: a filter, compiled once in the worker by libseccomp, refusing sockets of any kind,
  signals to any process, the keyring calls, io_uring, ptrace and process_vm_*, mounts and
  namespaces, bpf, userfaultfd and perf_event_open (EPERM); SysV shmat and memfd_create (memory no
  rlimit counts) and every other ABI's calls get ENOSYS (checked: socket() and a signal to the
  worker are refused).

The namespaces and the filter each close what Landlock below ABI 6 leaves open (TCP, abstract
sockets, signals to the env service when it runs under the same uid), so the seal does not depend
on the kernel's Landlock version beyond ABI 1. Where user namespaces are refused (a container
runtime's default seccomp profile forbids unshare), every call is refused.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import math
import os
import resource
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
MEMORY_MARGIN = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
# CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC
NAMESPACES = 0x10000000 | 0x00020000 | 0x40000000 | 0x08000000
HIDE = ("/proc", "/tmp", "/var/tmp", "/run", "/dev/shm", "/home", "/root")
STEPS = ("fds", "uid", "namespaces", "mounts", "landlock", "rlimits", "seccomp", "prepare")

# Refused with EPERM: nothing a scorer (a function of two strings) needs, each a way out of the
# call (sockets, signals, keyrings that outlive it, other processes) or kernel attack surface.
DENIED = (
    "socket",
    "socketpair",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "add_key",
    "request_key",
    "keyctl",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "userfaultfd",
    "perf_event_open",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "name_to_handle_at",
    "open_by_handle_at",
    "fanotify_init",
)
NO_SUCH_CALL = ("shmat", "memfd_create", "memfd_secret")


class Unsealed(Exception):
    """A step of the seal failed or did not take hold; `step` is one of STEPS."""

    def __init__(self, step: str):
        super().__init__(step)
        self.step = step


@dataclass(frozen=True)
class Plan:
    """What the worker works out once, before it forks: the places to hide, the compiled filter."""

    hidden: tuple[str, ...]
    bpf: bytes
    # inside a hidden place, what the child still reads (a checkout or a venv under /tmp or
    # /root): mounted back, read-only, on the empty tmpfs
    kept: tuple[str, ...] = ()


@functools.lru_cache(maxsize=1)
def prepare() -> Plan:
    """The worker's half of the seal; Unsealed("prepare") where libseccomp is missing or /proc
    could not be hidden."""
    try:
        hidden, kept = _hidden()
        return Plan(hidden, _compile_filter(), kept)
    except Exception:  # noqa: BLE001 - no filter, no scoring
        raise Unsealed("prepare") from None


def _hidden() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(HIDE resolved, the places inside them that hold something the child still reads: the
    interpreter, its libraries, the project). A place that is itself needed is not hidden."""
    needed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, ROOT)}
    needed |= {os.path.realpath(p) for p in sys.path if os.path.isabs(p)}
    needed = {n for n in needed if os.path.isdir(n)}
    hidden: list[str] = []
    for place in HIDE:
        real = os.path.realpath(place)
        if os.path.isdir(real) and real not in needed and real not in hidden and real != "/":
            hidden.append(real)
    inside = {n for n in needed for h in hidden if n.startswith(h.rstrip("/") + "/")}
    # the outermost only: a kept place brings what is below it
    kept = sorted(n for n in inside if not any(n.startswith(o + "/") for o in inside if o != n))
    if "/proc" not in hidden or any(k.startswith("/proc/") for k in kept):
        raise Unsealed("prepare")  # the checks below read /proc before hiding it
    return tuple(hidden), tuple(kept)


def _compile_filter() -> bytes:
    import pyseccomp

    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    f.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.ERRNO(errno.ENOSYS))
    for names, action in ((DENIED, errno.EPERM), (NO_SUCH_CALL, errno.ENOSYS)):
        for name in names:
            if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) >= 0:
                f.add_rule(pyseccomp.ERRNO(action), name)
    fd = os.memfd_create("scorer-seccomp")
    with open(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


# ---- in the child ----------------------------------------------------------------------------


def seal(keep_fd: int, timeout: float, plan: Plan) -> None:
    """Shut this child in (the module docstring), or Unsealed(step)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    steps = (
        ("fds", lambda: _fds(keep_fd)),
        ("uid", _drop_uid),
        ("namespaces", lambda: _namespaces(libc)),
        ("mounts", lambda: _mounts(libc, plan.hidden, plan.kept)),
        ("landlock", lambda: _landlock(libc)),
        ("rlimits", lambda: _rlimits(timeout, mapped)),
        ("seccomp", lambda: _seccomp(libc, plan.bpf)),
    )
    try:  # the worker's size, read before /proc is hidden: the address-space limit builds on it
        mapped = os.sysconf("SC_PAGE_SIZE") * int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError):
        raise Unsealed("rlimits") from None
    for step, take in steps:
        try:
            held = take()
        except Exception:  # noqa: BLE001 - a step that raised did not take hold
            held = False
        if not held:
            raise Unsealed(step)


def _fds(keep_fd: int) -> bool:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, hard if 0 < hard < 1 << 20 else 1 << 20)
    os.setsid()  # kill(0) and a terminal's signals reach only this child
    # left open: 0, 1, 2, keep_fd, and the descriptor listdir reads /proc/self/fd with
    return os.getsid(0) == os.getpid() and len(os.listdir("/proc/self/fd")) == 5


def _drop_uid() -> bool:
    if os.getuid() != 0 and os.geteuid() != 0:
        return True
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    return (
        os.getresuid() == (NOBODY,) * 3 and os.getresgid() == (NOBODY,) * 3 and not os.getgroups()
    )


def _unshare(libc, flags: int) -> int:
    return libc.unshare(flags)


def _namespaces(libc) -> bool:
    kinds = ("user", "mnt", "net", "ipc")
    before = [os.readlink(f"/proc/self/ns/{k}") for k in kinds]
    uid, gid = os.getuid(), os.getgid()
    if _unshare(libc, NAMESPACES) != 0:
        return False
    # its own ids mapped to themselves and nothing else: the mounts step can then make the kept
    # places' mount points on its tmpfs (an unmapped id creates no file)
    # (after a change of uid the process is not dumpable, and /proc/self is root's to write: made
    # dumpable for the three writes, and not again at once)
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    finally:
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    after = [os.readlink(f"/proc/self/ns/{k}") for k in kinds]
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    links = [line.split(":")[0].strip() for line in lines]
    return all(a != b for a, b in zip(after, before, strict=True)) and links == ["lo"]


_PR_SET_DUMPABLE = 4

# mount(2) and mount_setattr(2) flags
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _AT_RECURSIVE, _AT_FDCWD = 0x1, 0x2, 0x8000, -100
_SYS_MOUNT_SETATTR, _SYS_OPEN_TREE, _SYS_MOVE_MOUNT = 442, 428, 429  # one number on every arch
_OPEN_TREE_CLONE, _MOVE_EMPTY = 0x1, 0x4  # MOVE_MOUNT_F_EMPTY_PATH
_TMPFS = b"size=64k,nr_inodes=64,mode=0755"


def _mount(libc, source, target, fstype, flags, data) -> int:
    return libc.mount(source, target, fstype, flags, data)


def _mounts(libc, hidden: tuple[str, ...], kept: tuple[str, ...] = ()) -> bool:
    """Read-only everywhere, then an empty read-only tmpfs over each hidden place, with only the
    kept places inside it mounted back (read-only clones taken before it is covered)."""
    if _mount(libc, None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    attr = struct.pack("=QQQQ", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0, 0, 0)
    if libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, attr, len(attr)) != 0:
        return False
    was = {p: os.stat(p) for p in hidden}
    shown: dict[str, set[str]] = {}
    for place in hidden:
        # (one this child's uid cannot reach, it could not read anyway: it stays hidden)
        inner = [k for k in kept if k.startswith(place.rstrip("/") + "/") and os.access(k, os.X_OK)]
        shown[place] = {os.path.relpath(k, place).split("/")[0] for k in inner}
        clones = [(k, _open_tree(libc, k)) for k in inner]
        if any(fd < 0 for _, fd in clones):
            return False
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | (0 if inner else _MS_RDONLY)
        if _mount(libc, b"tmpfs", place.encode(), b"tmpfs", flags, _TMPFS) != 0:
            return False
        for k, fd in clones:
            os.makedirs(k, mode=0o755)
            moved = libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, k.encode(), _MOVE_EMPTY)
            os.close(fd)
            if moved != 0:
                return False
        ro = libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, place.encode(), 0, attr, len(attr))
        if inner and ro != 0:
            return False
    fresh = all(
        set(os.listdir(p)) == shown[p]
        and os.stat(p).st_dev != was[p].st_dev
        and os.statvfs(p).f_flag & os.ST_RDONLY
        for p in hidden
    )
    return fresh and bool(os.statvfs("/").f_flag & os.ST_RDONLY)


def _open_tree(libc, path: str) -> int:
    """A detached read-only clone of the mounts at `path` and below (open_tree(2)), or -1."""
    return libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, path.encode(), _OPEN_TREE_CLONE | _AT_RECURSIVE)


# Landlock (linux/landlock.h): every filesystem right but reading files and directories is handled
# and none is granted (ABI 1: bits 0-12; 2: refer; 3: truncate; 5: ioctl on devices), TCP bind and
# connect (ABI 4) likewise; ABI 6 also scopes abstract unix sockets and signals to the domain.
_LANDLOCK_FS = {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 5: 0xFFFF}
_READ = (1 << 2) | (1 << 3)
_SYS_CREATE_RULESET, _SYS_RESTRICT_SELF = 444, 446


def _landlock_abi(libc) -> int:
    return libc.syscall(_SYS_CREATE_RULESET, None, 0, 1)  # (NULL, 0, VERSION)


def _restrict_self(libc, ruleset: int) -> int:
    return libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0)


def _landlock(libc) -> bool:
    abi = _landlock_abi(libc)
    if abi < 1:
        return False
    fs = _LANDLOCK_FS[max(v for v in _LANDLOCK_FS if v <= abi)] & ~_READ
    attr = struct.pack("=QQQ", fs, 0x3 if abi >= 4 else 0, 0x3 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return False
    os.close(os.open(os.devnull, os.O_WRONLY))  # allowed now: the refusal below is Landlock's
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, which Landlock needs
        return False
    restricted = _restrict_self(libc, ruleset) == 0
    os.close(ruleset)
    try:
        os.close(os.open(os.devnull, os.O_WRONLY))
    except PermissionError:
        return restricted
    return False


def _rlimits(timeout: float, mapped: int) -> bool:
    cpu = math.ceil(timeout)
    memory = mapped + MEMORY_MARGIN
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_FSIZE: (0, 0),
        resource.RLIMIT_NPROC: (0, 0),
        resource.RLIMIT_AS: (memory, memory),
    }
    for kind, limit in limits.items():
        resource.setrlimit(kind, limit)
    return all(resource.getrlimit(kind) == limit for kind, limit in limits.items())


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_filter(libc, bpf: bytes) -> int:
    code = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(code))  # 8 bytes per sock_filter
    return libc.prctl(22, 2, ctypes.byref(prog), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _seccomp(libc, bpf: bytes) -> bool:
    if _install_filter(libc, bpf) != 0:
        return False
    refused = libc.socket(1, 1, 0) == -1 and ctypes.get_errno() == errno.EPERM  # AF_UNIX
    return refused and libc.kill(os.getppid(), 0) == -1 and ctypes.get_errno() == errno.EPERM
