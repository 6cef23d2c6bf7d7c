"""The subprocess backend: NO isolation. Only for local development, behind --unsafe-no-isolation.

The program runs as a plain child process with rlimits, a cleared environment and a temporary
working directory, but it can read the host's files and reach its network. The server says so
at start and on every metrics scrape.
"""

from __future__ import annotations

import os
import tempfile
import threading

from atgrpo.contract.sandbox import ExecRequest, ExecResult
from sandbox_svc.backends.bwrap import sweep_uid
from sandbox_svc.backends.process import (
    Launch,
    become_subreaper,
    memfd_with,
    run_launch,
)
from sandbox_svc.languages import LANGUAGES

_PATH = "/usr/local/bin:/usr/bin:/bin"


class SubprocessBackend:
    name = "subprocess"
    isolated = False

    def __init__(self, uid_base: int = 60000):
        self.uid_base = uid_base if os.geteuid() == 0 else None
        become_subreaper()

    def check(self) -> None:
        pass

    def run(self, req: ExecRequest, slot: int, cancel: threading.Event | None = None) -> ExecResult:
        language = LANGUAGES[req.language]
        uid = None if self.uid_base is None else self.uid_base + slot
        stdin_fd = memfd_with("stdin", req.stdin)
        try:
            with tempfile.TemporaryDirectory(prefix="atgrpo-unsafe-") as work:
                for name, content in ((language.filename, req.code.encode()), *req.files):
                    path = os.path.join(work, name)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as f:
                        f.write(content)
                if uid is not None:
                    for root, dirs, files in os.walk(work):
                        for n in (root, *(os.path.join(root, x) for x in dirs + files)):
                            os.chown(n, uid, uid)
                launch = Launch(
                    argv=list(language.argv),
                    stdin_fd=stdin_fd,
                    limits=req.limits,
                    language=language,
                    cwd=work,
                    uid=uid,
                    env={"PATH": _PATH, "HOME": work},
                )
                result = run_launch(launch, cancel)
                if uid is not None:
                    sweep_uid(uid)  # nothing stops a daemonised child here but this sweep
                return result
        finally:
            os.close(stdin_fd)

    def close(self) -> None:
        pass
