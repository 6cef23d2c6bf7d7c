"""Host uids for worker slots, claimed so that no two sandboxes on one host ever share one.

As root, slot i of a bwrap (or subprocess) sandbox runs its programs as host uid base + i, and
after a program, or when a sandbox is discarded, every process of that uid on the host is killed
(the sweep: nothing a program forks may outlive it). Two servers on one uid would kill each
other's programs. So each uid is claimed with an exclusive flock on a file of its own under
LOCK_DIR, held until the process exits: the kernel releases it when the owner dies, however it
dies, so a crashed server's range is free again at once, and a file left behind means nothing.
The file names the owner's pid, for the message when a range is taken.

Docker sandboxes need none of this: a container's kill(-1) reaches only its own pid namespace.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

DEFAULT_FIRST = 60000
# Candidate ranges are tried from DEFAULT_FIRST on; past this many uids, something is wrong.
_SEARCH_SPAN = 1 << 16
LOCK_DIR = Path(os.environ.get("ATGRPO_SANDBOX_UID_DIR", "/run/atgrpo/sandbox-uids"))


class UidClaimError(RuntimeError):
    """No uids could be claimed: an asked-for range is held by another live process, or the lock
    directory cannot be made."""


class UidClaim:
    """Held uids base .. base + count - 1; released by close() or when the process exits."""

    def __init__(self, base: int, files: list):
        self.base, self._files = base, files

    def close(self) -> None:
        for f in self._files:
            f.close()  # closing the file drops its flock
        self._files = []


def _lock(uid: int):
    """The uid's lock file, locked by us; None when another live process holds it."""
    f = open(LOCK_DIR / f"{uid}.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _try(base: int, count: int) -> tuple[UidClaim | None, int]:
    """All of base .. base + count - 1, or None and the first uid that is taken."""
    files = []
    for uid in range(base, base + count):
        f = _lock(uid)
        if f is None:
            UidClaim(base, files).close()
            return None, uid
        files.append(f)
    return UidClaim(base, files), -1


def _holder(uid: int) -> str:
    try:
        return f"pid {(LOCK_DIR / f'{uid}.lock').read_text().strip()}"
    except OSError:
        return "another process"


def claim(count: int, base: int | None = None) -> UidClaim:
    """Claim `count` consecutive host uids: from `base` exactly, or the first free range from
    DEFAULT_FIRST. UidClaimError names the holder when an asked-for range is taken."""
    try:
        LOCK_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        raise UidClaimError(
            f"cannot make the uid lock directory {LOCK_DIR} ({err}); set ATGRPO_SANDBOX_UID_DIR "
            "to a writable directory every sandbox server on this host shares"
        ) from None
    if base is not None:
        held, taken = _try(base, count)
        if held is None:
            raise UidClaimError(
                f"host uid {taken} (of --uid-base {base} with {count} workers) is held by another "
                f"sandbox ({_holder(taken)}); leave out --uid-base to take a free range, or give "
                f"one that does not overlap"
            )
        return held
    start = DEFAULT_FIRST
    while start < DEFAULT_FIRST + _SEARCH_SPAN:
        held, taken = _try(start, count)
        if held is not None:
            return held
        start = taken + 1  # the next candidate begins past the uid that was taken
    raise UidClaimError(
        f"no {count} free consecutive host uids from {DEFAULT_FIRST} to "
        f"{DEFAULT_FIRST + _SEARCH_SPAN}: are that many sandboxes running here?"
    )
