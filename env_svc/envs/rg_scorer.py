"""The reasoning-gym scorer worker: a dataset's own `score_answer`, run where model text cannot
reach the env service (DESIGN.md 4b).

One long-lived process per env service (`python -m env_svc.envs.rg_scorer`, started on the first
score and again if it dies) imports reasoning-gym and builds each dataset once. It reads requests
on stdin and answers on stdout, each a 4-byte big-endian length and a body: the request a pickle
(the env's entry as it is, tuples and all; only the env writes it), the reply JSON
{"score": x} or {"error": reason, "message": ...}. Each score runs in a child forked for that one
call, so nothing a scorer does to itself outlives the call, and the child seals itself in first
(rg_seal.py: no uid of the env, no network, no host sockets, no IPC or keyring state shared with
another call, no file writes, no exec, no signals, rlimits), checking that each step took hold; a
step that did not is "isolation_failed" and nothing is scored. The worker starts with an
environment of its own (paths, locale, thread counts: `_PASSED`): no other variable of the env
service's reaches a scorer, and no text a scorer wrote reaches the env but a builtin exception's
name.

The worker kills a child still running after SCORE_TIMEOUT_S; the env gives the worker
REQUEST_TIMEOUT_S (a dataset's first build included) before it kills and later restarts it. A
crash, timeout or anything but a number in [0, 1] is a JudgeError (the step's format failure).

The worker is defence in depth: the datasets whose scorer evaluates text are scored by rg_safe.py
or pass its math_text gate first, since a child running the answer as code could still fake its
own call's verdict.
"""

from __future__ import annotations

import builtins
import ctypes
import functools
import importlib
import json
import math
import numbers
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from atgrpo.sdk.judge import MAX_LITERAL_CHARS, JudgeError
from env_svc.envs import rg_seal

SCORE_TIMEOUT_S = 5.0  # one score_answer call (sympy's slowest honest answers take well under 1 s)
REQUEST_TIMEOUT_S = 60.0  # one request: the worker's start and a dataset's first build included
ANSWER_CHARS = MAX_LITERAL_CHARS
MAX_FRAME = 64 << 20  # a request carries one entry; an ARC grid entry is tens of KiB
ROOT = Path(__file__).resolve().parents[2]

# ---- framing ---------------------------------------------------------------------------------


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """n bytes from `fd`, or EOFError/TimeoutError (the deadline is time.monotonic())."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, n - got)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    """All of `data` to the non-blocking `fd`, or TimeoutError: a hung reader cannot hang us."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fd], [], left)[1]:
            raise TimeoutError
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


def _read_frame(fd: int, deadline: float | None = None) -> bytes:
    (size,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if size > MAX_FRAME:
        raise EOFError(f"a frame of {size} bytes")
    return _read_exact(fd, size, deadline)


# ---- the worker process ----------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _dataset(module: str, name: str, config_json: str, seed: int, size: int) -> Any:
    importlib.import_module(module)  # registers a dataset defined outside reasoning-gym itself
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def _serve(request: dict[str, Any]) -> dict[str, Any]:
    key = (request["module"], request["name"], request["config"], request["seed"], request["size"])
    try:
        dataset = _dataset(*key)
    except Exception as e:  # noqa: BLE001 - reported to the env, which could build it itself
        return {
            "error": "scorer_error",
            "message": f"building the dataset failed: {type(e).__name__}: {e}"[:300],
        }
    try:
        plan = rg_seal.prepare()
    except rg_seal.Unsealed:
        return _verdict(b"Iprepare")
    if key not in _warm:
        _warm.add(key)
        _warm_up(dataset, request["entry"], request["timeout"])
    try:
        return _score_in_child(
            dataset, request["answer"][:ANSWER_CHARS], request["entry"], request["timeout"], plan
        )
    except OSError as e:  # fork or pipe refused (no memory, no pids)
        return {"error": "scorer_error", "message": f"could not start the scorer: {e}"}


_warm: set[tuple] = set()


def _warm_up(dataset: Any, entry: dict, timeout: float) -> None:
    """Score the entry's own reference answer here, once per dataset, so that what a scorer loads
    or caches on its first call (sympy's parser: ~50 ms) is in every child forked after. The
    reference is the dataset's text, not the model's; an alarm stops a scorer slow even on it."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        dataset.score_answer(entry["answer"], entry)
    except Exception:  # noqa: BLE001 - only a warm-up; the real call reports its own failure
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("the warm-up ran over its time")


def _score_in_child(
    dataset: Any, answer: str, entry: dict, timeout: float, plan: rg_seal.Plan
) -> dict[str, Any]:
    """score_answer in a child forked for this call; its verdict comes back as one short line."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        _child(dataset, answer, entry, timeout, w, plan)
    os.close(w)
    try:
        data = _read_child(r, time.monotonic() + timeout)
    finally:
        os.close(r)
        _reap(pid)
    if data is None:
        return {"error": "scorer_timeout", "message": f"the scorer ran over {timeout:g} s"}
    return _verdict(data)


def _read_child(fd: int, deadline: float) -> bytes | None:
    """What the child wrote until it closed the pipe (at most 1 KiB), or None at the deadline."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1024)
        if not chunk or len(data) >= 1024:
            return data
        data += chunk


def _reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # done or not, it has nothing left to say
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _verdict(data: bytes) -> dict[str, Any]:
    """The child's line: "S<score>", "E<exception type>" or "I<seal step>"; anything else (it
    crashed, was killed by a limit, or wrote junk) is a scorer error. The child ran the answer, so
    its line is hostile: no text of it reaches the reply but a builtin exception's name or a step's
    (an exception's message, even its class's name, could carry whatever the answer read)."""
    text = data[:1024].decode("utf-8", "replace")
    if text.startswith("I"):
        step = text[1:] if text[1:] in rg_seal.STEPS else "unknown"
        return {
            "error": "isolation_failed",
            "message": f"the scorer's isolation did not take hold ({step}); nothing was scored",
        }
    if text.startswith("E"):
        return {"error": "scorer_error", "message": f"the scorer raised {_builtin_name(text[1:])}"}
    try:
        score = float(text[1:]) if text.startswith("S") else math.nan
    except ValueError:
        score = math.nan
    if not 0.0 <= score <= 1.0:
        return {
            "error": "scorer_error",
            "message": "the scorer died or returned no score in [0, 1]",
        }
    return {"score": score}


def _builtin_name(name: str) -> str:
    """`name` if it names a builtin exception, else a fixed word."""
    known = getattr(builtins, name, None) if name.isidentifier() else None
    return name if isinstance(known, type) and issubclass(known, BaseException) else "an exception"


def _child(
    dataset: Any, answer: str, entry: dict, timeout: float, w: int, plan: rg_seal.Plan
) -> None:
    try:
        rg_seal.seal(w, timeout, plan)
        score = dataset.score_answer(answer, entry)
        line = f"S{float(score)!r}" if isinstance(score, numbers.Real) else "ETypeError"
    except rg_seal.Unsealed as e:
        line = f"I{e.step}"
    except BaseException as e:  # noqa: BLE001 - whatever the scorer raises is the answer's failure
        line = f"E{type(e).__name__}"
    try:
        os.write(w, line[:1000].encode("utf-8", "replace"))
    finally:
        os._exit(0)


def main() -> None:
    """Serve requests on stdin until it closes. Nothing else may write to the reply pipe, so the
    worker keeps it on its own descriptor and points stdout at stderr."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children cannot open /proc/<worker>
    while True:
        try:
            request = pickle.loads(_read_frame(0))
        except EOFError:
            return
        os.write(out_fd, _frame(json.dumps(_serve(request)).encode()))


# ---- the env's side --------------------------------------------------------------------------


class ScorerWorker:
    """The env service's handle on the worker: started on first use, restarted after it dies or
    misses a deadline; one request at a time (threads share it; the env calls it off its loop)."""

    def __init__(self, command: list[str] | None = None):
        self.command = command or [sys.executable, "-m", "env_svc.envs.rg_scorer"]
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def score(self, dataset: Any, name: str, config_json: str, answer: str, entry: dict) -> float:
        """The dataset's own score of `answer` for `entry`, or JudgeError."""
        if len(answer) > ANSWER_CHARS:
            raise JudgeError(
                "too_large", f"the answer is {len(answer)} characters, over {ANSWER_CHARS}"
            )
        request = {
            "module": type(dataset).__module__,
            "name": name,
            "config": config_json,
            "seed": dataset.seed,
            "size": dataset.size,
            "answer": answer,
            "entry": entry,
            "timeout": SCORE_TIMEOUT_S,
        }
        try:
            body = pickle.dumps(request)
        except Exception as e:  # noqa: BLE001 - an entry holding something pickle cannot carry
            raise JudgeError(
                "scorer_error", f"the entry cannot be sent to the scorer worker: {e}"
            ) from None
        deadline = time.monotonic() + REQUEST_TIMEOUT_S  # waiting for the lock counts: a hung
        if not self.lock.acquire(timeout=REQUEST_TIMEOUT_S):  # worker fails its queue in time too
            raise JudgeError(
                "scorer_timeout", f"the scorer worker was busy for {REQUEST_TIMEOUT_S:g} s"
            )
        try:
            reply = self._call(body, deadline)
        finally:
            self.lock.release()
        if "error" in reply:
            raise JudgeError(
                str(reply["error"]), f"the dataset's scorer failed: {reply.get('message', '')}"
            )
        return float(reply["score"])

    def _call(self, body: bytes, deadline: float) -> dict[str, Any]:
        proc = self._running()
        try:
            _write_all(proc.stdin.fileno(), _frame(body), deadline)
            return json.loads(_read_frame(proc.stdout.fileno(), deadline))
        except TimeoutError:
            self.stop()
            raise JudgeError(
                "scorer_timeout", f"the scorer worker gave no reply in {REQUEST_TIMEOUT_S:g} s"
            ) from None
        except (OSError, EOFError, ValueError) as e:
            self.stop()
            raise JudgeError(
                "scorer_error",
                f"the scorer worker failed ({type(e).__name__}); it restarts on the next answer",
            ) from None

    def _running(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            env = _worker_environment()
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT
            )
            os.set_blocking(self.proc.stdin.fileno(), False)
        return self.proc

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()
            self.proc = None


# What the worker takes of the env service's environment: where things are and the locale, never
# a credential. (HOME and the cache directories: matplotlib, imported by reasoning-gym, writes its
# font cache there, or leaves a temporary directory behind at every worker start.)
_PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "MPLCONFIGDIR", "XDG_CACHE_HOME")


def _worker_environment() -> dict[str, str]:
    """The worker's whole environment: _PASSED, never the env service's other variables, which a
    scorer running an answer could otherwise read and echo. No thread pools in a process that
    forks."""
    return {
        **{name: os.environ[name] for name in _PASSED if name in os.environ},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }


WORKER = ScorerWorker()


if __name__ == "__main__":
    main()
