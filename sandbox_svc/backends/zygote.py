"""The program that runs *inside* a warm sandbox as its pid 1 (standard library only).

It waits on a control socket for requests; each request is served by a fresh fork() of this
small interpreter, so a program starts without paying for an interpreter start-up, and never sees
another program's memory. Per request the child sets the rlimits and the syscall filter, writes the
program's files in a fresh working directory, wires stdin/stdout/stderr to the fds it was sent, and
runs the code as `python3 -I -B main.py` would. When the child ends, every other process in the
sandbox is killed (kill(-1) from pid 1 reaches all of them), /tmp and /dev/shm are wiped, and the
reply says whether anything could still carry over (SysV IPC objects, POSIX message queues, an
unwipeable file), in which case the server discards the whole sandbox.

Protocol (SOCK_SEQPACKET): request = b"run" + fds [payload memfd, stdin, stdout, stderr], the
payload being JSON {code, filename, files: {path: base64}, limits}; replies are JSON lines
{"started": pid} then {"status", "cpu_ms", "clean"}. b"kill" kills the running program.
"""

import array
import base64
import json
import os
import resource
import select
import shutil
import signal
import socket
import sys

WORK = "/tmp/run"

# Put before this source by warm.py (lockdown.py): lock_down(spec) installs the syscall filter.
SECCOMP = None  # set by main() from argv: sandbox_svc.syscalls.launcher_seccomp()


def _recv(sock):
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds)


def _limits(lim):
    cpu = max(1, -(-lim["cpu_time_ms"] // 1000))
    for res, value in (
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, lim["memory_bytes"]),
        (resource.RLIMIT_FSIZE, lim["max_file_bytes"]),
        (resource.RLIMIT_NOFILE, lim["max_open_files"]),
        (resource.RLIMIT_NPROC, lim["max_processes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(res, (value, value))


def _run_child(req, stdin_fd, out_fd, err_fd):
    """In the forked child: become the program. Never returns."""
    status = 1
    try:
        os.makedirs(WORK, exist_ok=True)
        for path, data in req["files"].items():
            full = os.path.join(WORK, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(base64.b64decode(data))
        main_path = os.path.join(WORK, req["filename"])
        with open(main_path, "w", encoding="utf-8") as f:
            f.write(req["code"])
        os.chdir(WORK)
        os.environ["PWD"] = WORK
        for target, fd in ((0, stdin_fd), (1, out_fd), (2, err_fd)):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start-up
        _limits(req["limits"])
        lock_down(SECCOMP)  # noqa: F821 - defined by lockdown.py, put before this source
        if req.get("argv"):
            os.execvp(req["argv"][0], req["argv"])
        status = _run_python(main_path, req["code"])
    finally:
        os._exit(status)


def _run_python(path, source):
    import atexit
    import io
    import traceback
    import types

    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=False
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [os.path.basename(path)]
    status = 0
    try:
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = e.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException as e:  # noqa: BLE001 - report as the interpreter would, exit 1
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # hide this harness's frame
        traceback.print_exception(type(e), e, tb)
        status = 1
    try:
        import threading

        threading._shutdown()  # wait for non-daemon threads, as interpreter exit does
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        status = status or 120  # the interpreter's exit code for a failed flush at exit
    return status


def _kill_all_but_me():
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _wipe(path):
    # The program may have made directories unreadable; it cannot have made them someone
    # else's, so making them ours again (top-down, before os.walk enters them) always works.
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            full = os.path.join(root, d)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    for entry in os.listdir(path):
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        else:
            os.unlink(full)


def _clean():
    """Whether nothing of the last program can reach the next one."""
    try:
        _wipe("/tmp")
        _wipe("/dev/shm")
        for table in ("shm", "sem", "msg"):
            with open(f"/proc/sysvipc/{table}") as f:
                if len(f.read().splitlines()) > 1:
                    return False
        return not os.listdir("/dev/mqueue")
    except OSError:
        return False


def _serve_one(ctl, fds):
    payload, stdin_fd, out_fd, err_fd = fds
    with os.fdopen(payload, "rb") as f:
        req = json.loads(f.read())
    pid = os.fork()
    if pid == 0:
        ctl.close()
        _run_child(req, stdin_fd, out_fd, err_fd)
    for fd in (stdin_fd, out_fd, err_fd):
        os.close(fd)
    ctl.send(json.dumps({"started": pid}).encode())
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([pidfd, ctl], [], [])
    if ctl in ready and ctl.recv(16) in (b"kill", b""):
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    os.close(pidfd)
    _kill_all_but_me()
    # The result first, then the wipe: a program that left a million files makes the wipe slow,
    # and the server must not mistake that for a sandbox that died while the program ran.
    ctl.send(
        json.dumps(
            {"status": status, "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000)}
        ).encode()
    )
    ctl.send(json.dumps({"clean": _clean()}).encode())


def main():
    # Not dumpable: programs (same uid) can neither ptrace this process nor open /proc/1/mem,
    # so none can tamper with the interpreter the next program is forked from.
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    global SECCOMP
    ctl = socket.socket(fileno=int(sys.argv[1]))
    SECCOMP = json.loads(sys.argv[2])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    ctl.send(b'{"ready": true}')
    while True:
        msg, fds = _recv(ctl)
        if not msg:  # the server closed the socket: the sandbox goes away
            return
        if msg == b"run":
            _serve_one(ctl, fds)
        # anything else (a b"kill" that crossed the final reply) is stale: ignore it


if __name__ == "__main__":
    main()
