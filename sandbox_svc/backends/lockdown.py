"""Run inside a sandbox, in the forked child just before it becomes the program (standard library
only: its source is prepended to zygote.py and the docker launcher, which run there).

`spec` is sandbox_svc.syscalls.launcher_seccomp(): the compiled filter and the number of keyctl.
"""


def lock_down(spec):
    import base64
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if spec.get("keyctl") is not None:
        # KEYCTL_JOIN_SESSION_KEYRING (1) with no name: a fresh, empty session keyring, so nothing
        # an earlier program of this uid left in a keyring is in reach. (Where keyctl is already
        # refused, as under Docker's default profile, there is nothing to reach and this fails.)
        libc.syscall(spec["keyctl"], 1, None)
    code = base64.b64decode(spec["bpf"])
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(code) // 8, ctypes.addressof(buf))  # 8 bytes per struct sock_filter
    # PR_SET_NO_NEW_PRIVS (38) lets an unprivileged process install a filter; PR_SET_SECCOMP (22),
    # SECCOMP_MODE_FILTER (2).
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the sandbox's seccomp filter")
