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
KILL_PARENT = (
    "import os, signal\n"
    "for pid in (os.getppid(), 1):\n"
    "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print('refused', pid, e.errno)\n"
    "print('still here')\n"
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
