"""Which system calls a sandboxed program may not make: one policy, compiled by libseccomp.

A test program reads, writes, computes and forks. It never needs the kernel's rarer interfaces,
and each of those is attack surface (io_uring, bpf, userfaultfd and perf_event_open are where
recent kernel exploits start) or a channel out of the sandbox (keyrings outlive a program: a key
added to the user keyring is there for the next program on the same uid). The list follows what
Docker's default profile refuses a container without CAP_SYS_ADMIN, plus io_uring and the two
calls that make memory no rlimit counts (SysV shmat, memfd_create). Whether a call is refused
must not depend on the host's sysctls (kernel.unprivileged_bpf_disabled and the like): a
Kubernetes node need not share this machine's.

The filter is compiled here, in the server, with libseccomp (through pyseccomp, its ctypes
binding), and installed by the small launcher inside the sandbox just before it becomes the
program (zygote.py, docker_programs.py): the launcher itself stays standard library only.
"""

from __future__ import annotations

import base64
import errno
import functools
import tempfile

# Refused with EPERM, as container runtimes do: a program that probes gets "not permitted".
DENIED = (
    # kernel attack surface no test program needs
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "userfaultfd",
    "perf_event_open",
    # keyrings: persistent per-uid state a program could leave for the next
    "add_key",
    "request_key",
    "keyctl",
    # other processes' memory and control
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    # file systems, mounts and namespaces
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
    "quotactl",
    "quotactl_fd",
    "swapon",
    "swapoff",
    # the kernel itself and the machine
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "syslog",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "iopl",
    "ioperm",
    "vhangup",
    "lookup_dcookie",
    "uselib",
    "ustat",
    "sysfs",
    "nfsservctl",
    "get_kernel_syms",
    "query_module",
    "create_module",
    "_sysctl",
    "vm86",
    "vm86old",
    "set_mempolicy",
    "mbind",
    "move_pages",
    "migrate_pages",
)
# Memory no rlimit counts (a detached SysV segment's pages are in no address space; a memfd is
# sized up to the file-size limit per open file): refused with ENOSYS, as if the kernel lacked them.
NO_SUCH_CALL = ("shmat", "memfd_create", "memfd_secret")
# clone3 takes its flags in a struct seccomp cannot read: ENOSYS makes the C library fall back to
# clone, whose flags the rules below can see.
CLONE_FALLBACK = ("clone3",)
# New namespaces from clone: refused like unshare (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
# NEWPID, NEWNET; clone has no room for NEWTIME, whose bit is its exit signal's).
_NAMESPACE_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)


def _known(name: str) -> int | None:
    """The native number of a call, or None where this architecture has no such call."""
    import pyseccomp

    try:
        nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    except (OSError, ValueError):
        return None
    return nr if nr >= 0 else None


def build_filter():
    """The policy as a libseccomp filter for this machine's architecture. Calls of any other ABI
    (i386 via int 0x80, x32) are refused with ENOSYS."""
    import pyseccomp

    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    f.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.ERRNO(errno.ENOSYS))
    for names, action in (
        (DENIED, pyseccomp.ERRNO(errno.EPERM)),
        (NO_SUCH_CALL + CLONE_FALLBACK, pyseccomp.ERRNO(errno.ENOSYS)),
    ):
        for name in names:
            if _known(name) is not None:
                f.add_rule(action, name)
    for flag in _NAMESPACE_FLAGS:
        f.add_rule(
            pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag)
        )
    return f


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter: classic BPF, an array of struct sock_filter."""
    with tempfile.TemporaryFile() as out:
        build_filter().export_bpf(out)
        out.seek(0)
        return out.read()


def launcher_seccomp() -> dict:
    """What an in-sandbox launcher needs to lock a program down: the filter, base64, and the
    number of keyctl, to give the program a fresh, empty session keyring before the filter."""
    return {"bpf": base64.b64encode(filter_bpf()).decode(), "keyctl": _known("keyctl")}
