"""The two programs that run inside a docker sandbox container (kept apart from the backend
for length): the idle pid 1, and the launcher every execution starts."""

from pathlib import Path

# pid 1 of every warm container: reap orphans, ignore signals, exit on EOF of the attached stdin.
IDLE = """
import os, signal
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
          signal.SIGUSR2, signal.SIGPIPE, signal.SIGALRM):
    signal.signal(s, signal.SIG_IGN)
while os.read(0, 4096):
    pass
"""

# Runs as the slot's uid for one execution (see the module docstring). Protocol on its stdin: a
# 4-byte big-endian length, a JSON header, the files' bytes in header order, stdin's bytes; then
# b"K" (or EOF) means kill. On its stdout: frames of kind (1 byte) + length (4 bytes) + data, kinds
# b"o" (program stdout), b"e" (program stderr), b"r" (the JSON report, last).
LAUNCHER = (
    (Path(__file__).with_name("lockdown.py")).read_text()
    + r"""
import ctypes, json, os, resource, select, signal, struct, sys, time

def frame(kind, data):
    view = memoryview(kind + struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(1, view):]

def readn(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, min(n - len(buf), 1 << 20))
        if not chunk:
            os._exit(3)
        buf += chunk
    return bytes(buf)

def others():
    me, alive = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(int(name))
    return alive

def kill_all():
    deadline = time.monotonic() + 2
    while True:
        try:
            os.kill(-1, signal.SIGKILL)   # all this uid may signal in the container but us and pid 1
        except ProcessLookupError:
            pass
        left = others()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.002)

def rm(path):
    st = os.lstat(path)
    if (st.st_mode & 0o170000) == 0o040000:
        if st.st_mode & 0o700 != 0o700:
            os.chmod(path, 0o700)
        for name in os.listdir(path):
            rm(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)

def wipe(problems):
    for top in ("/tmp", "/dev/shm", "/dev/mqueue"):
        try:
            names = os.listdir(top)
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append("cannot list %s: %s" % (top, e))
            continue
        for name in names:
            try:
                rm(os.path.join(top, name))
            except Exception as e:
                problems.append("cannot remove %s/%s: %s" % (top, name, e))
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                if len(f.read().splitlines()) > 1:
                    problems.append("SysV IPC %s objects left" % kind)
        except OSError:
            pass

def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:   # PR_SET_DUMPABLE 0: no ptrace, no /proc/<us>/fd or mem
        sys.exit("launcher: prctl(PR_SET_DUMPABLE) failed")
    h = json.loads(readn(struct.unpack(">I", readn(4))[0]))
    problems, status, usage, killed = [], None, None, False
    pid = None
    try:
        os.mkdir(h["dir"], 0o700)
        for rel, size in h["files"]:
            path = os.path.join(h["dir"], rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(readn(size))
        stdin = os.memfd_create("stdin")
        left = h["stdin"]
        while left:
            chunk = readn(min(left, 1 << 20))
            view = memoryview(chunk)
            while view:
                view = view[os.write(stdin, view):]
            left -= len(chunk)
        os.lseek(stdin, 0, 0)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
    except Exception as e:
        frame(b"e", ("sandbox: cannot set up the program's files: %s\n" % e).encode())
        status = 126 << 8
    if status is None:
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                os.dup2(stdin, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.chdir(h["dir"])
                for name, value in h["rlimits"]:
                    resource.setrlimit(getattr(resource, name), (value, value))
                lock_down(h["seccomp"])
                os.execvpe(h["argv"][0], h["argv"], h["env"])
            except BaseException as e:
                os.write(2, ("sandbox: cannot start the program: %s\n" % e).encode())
            os._exit(127)
        for fd in (stdin, out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        streams = {out_r: b"o", err_r: b"e"}
        watch = [0, pidfd, out_r, err_r]
        drain_until = None
        while streams or pidfd in watch:
            timeout = None if drain_until is None else max(0, drain_until - time.monotonic())
            ready = select.select(watch, [], [], timeout)[0]
            if not ready and drain_until is not None:
                problems.append("output pipes held open after the kill")
                break
            if 0 in ready:
                watch.remove(0)
                os.read(0, 1)            # b"K" or EOF: either way, stop the program
                killed = True
                kill_all()
            if pidfd in ready:
                watch.remove(pidfd)
                _, status, usage = os.wait4(pid, 0)
                kill_all()               # whatever the program left running
                drain_until = time.monotonic() + 1
            for fd in [fd for fd in ready if fd in streams]:
                chunk = os.read(fd, 65536)
                if chunk:
                    frame(streams[fd], chunk)
                else:
                    del streams[fd]
                    watch.remove(fd)
    left = kill_all()
    if left:
        problems.append("processes survive the kill: %s" % left)
    wipe(problems)
    cpu_ms = int((usage.ru_utime + usage.ru_stime) * 1000) if usage else 0
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else 0
    sig = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else 0
    frame(b"r", json.dumps({"code": code, "sig": sig, "cpu_ms": cpu_ms, "killed": killed,
                            "clean": not problems, "problems": problems}).encode())

main()
"""  # noqa: E501
)
