"""The hostile programs of the sandbox issue, with what containment looks like for each.

Shared by the backend tests (bwrap, docker) and the end-to-end tests through env_svc later.
"""

SECRET_VAR = "ATGRPO_TEST_SECRET"
SECRET_VALUE = "s3cr3t-planted-by-the-test"

FORK_BOMB = "import os\nwhile True:\n    os.fork()\n"
MEMORY_BOMB = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 1024 * 1024))\n"
INFINITE_LOOP = "while True:\n    pass\n"
OUTPUT_FLOOD = "import sys\nblock = 'x' * 65536\nwhile True:\n    sys.stdout.write(block)\n"
READ_SHADOW = "print(open('/etc/shadow').read())\n"
ENV_DUMP = "import os\nprint(sorted(os.environ.items()))\n"
WRITE_OUTSIDE_TMP = (
    "import os\nfails = 0\n"
    "for path in ('/x', '/usr/x', '/etc/x', '/home/x', '/root/x'):\n"
    "    try:\n        open(path, 'w').write('pwned')\n    except OSError:\n        fails += 1\n"
    "print('fails', fails)\n"
)
SLEEP_FOREVER = "import time\ntime.sleep(3600)\n"
# Closes its output early, so the pipes end while it runs on: the wall clock must still stop it.
CLOSE_OUTPUT_AND_SLEEP = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(3600)\n"
# A child of its own that sleeps past any limit, its pid printed first, then the program sleeps.
CHILD_AND_SLEEP = (
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
    "print(c.pid, flush=True)\ntime.sleep(3600)\n"
)
KILL_PARENT = (
    "import os, signal\n"
    "for pid in (os.getppid(), 1):\n"
    "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        "
    "print('refused', pid, e.errno)\nprint('still here')\n"
)


def connect_to(port: int) -> str:
    return (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'pwned')\nprint('connected')\n"
    )


LEAVE_FILE = "open('/tmp/left-behind', 'w').write('x')\nprint('wrote')\n"
FIND_FILE = "import os\nprint(os.path.exists('/tmp/left-behind'))\n"
LEAVE_DAEMON = (
    "import subprocess\n"
    "subprocess.Popen(['python3', '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
    "print('spawned')\n"
)

# Warm sandboxes fork every program from one pid-1 interpreter: it must be out of reach.
TAMPER_WITH_PID1 = (
    "import os, signal\nrefused = 0\n"
    "for attempt in (lambda: os.kill(1, signal.SIGKILL), lambda: open('/proc/1/mem', 'wb'),\n"
    "                lambda: open('/proc/1/environ').read()):\n"
    "    try:\n        attempt()\n    except OSError:\n        refused += 1\n"
    "print('refused', refused)\n"
)


# Kernel interfaces no test program needs (sandbox_svc/syscalls.py). Each call is made with
# arguments that succeed, or fail with another errno than EPERM, where the call is allowed, so
# EPERM here means the filter refused it (bpf, userfaultfd and perf_event_open can also be refused
# by a host's sysctls; syscalls.py's own test checks the filter names them).
def _nr(name: str) -> int:
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


KERNEL_CALLS = {
    "io_uring_setup": "1, ctypes.create_string_buffer(120)",
    "io_uring_enter": "-1, 0, 0, 0, None, 0",
    "io_uring_register": "-1, 0, None, 0",
    "bpf": "0, ctypes.create_string_buffer(128), 128",
    "userfaultfd": "0",
    "perf_event_open": "ctypes.create_string_buffer(128), 0, -1, -1, 0",
    "add_key": "b'user', b'carry', b'payload', 7, -4",
    "request_key": "b'user', b'carry', None, 0",
    "keyctl": "0, -3, 0",  # KEYCTL_GET_KEYRING_ID of the session keyring
    "ptrace": "0, 0, 0, 0",  # PTRACE_TRACEME
    "process_vm_readv": "os.getpid(), None, 0, None, 0, 0",
    "kcmp": "os.getpid(), os.getpid(), 0, 0, 0",
    "unshare": "0",  # a no-op success where allowed
    "setns": "-1, 0",
    "mount": "b'none', b'/tmp', b'tmpfs', 0, None",
    "kexec_load": "0, 0, None, 0",
    "finit_module": "-1, b'', 0",
}


def kernel_surface_probe() -> str:
    """A program printing `name errno` for each call of KERNEL_CALLS (errno 0: it worked)."""
    lines = [
        "import ctypes, os",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "def call(name, nr, *args):",
        "    ctypes.set_errno(0)",
        "    r = libc.syscall(nr, *args)",
        "    print(name, 0 if r >= 0 else ctypes.get_errno())",
    ]
    lines += [f"call({name!r}, {_nr(name)}, {args})" for name, args in KERNEL_CALLS.items()]
    return "\n".join(lines) + "\n"


# A key added to the user keyring outlives its program on the same uid (until the sandbox goes).
LEAVE_KEY = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    f"print(libc.syscall({_nr('add_key')}, b'user', b'carry', b'payload', 7, -4) >= 0)\n"
)
FIND_KEY = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = "
    "ctypes.create_string_buffer(64)\n"
    f"key = libc.syscall({_nr('keyctl')}, 10, -4, b'user', b'carry', 0)   # KEYCTL_SEARCH\n"
    f"n = libc.syscall({_nr('keyctl')}, 11, key, buf, 64) if key >= 0 else -1   # KEYCTL_READ\n"
    "print(buf.raw[:n] if n > 0 else b'none')\n"
)
