"""The docker backend's image: a minimal root filesystem holding the host's Python, imported
locally.

Nothing can be pulled here, so the image is not built FROM a registry base: it is a tarball of the
host's own `/usr/bin/python3` (Debian's python3.11), the shared libraries it and its extension
modules load, the dynamic loader, the standard library, an `/etc/passwd` and an empty `/tmp`,
loaded with the engine's `docker import`. There is no shell and no other program in it: the
backend drives everything (launcher, cleanup) with `python3 -c`.

The tag is a hash of the tarball's content, so the same host files give the same tag, and a tag
already present in the engine is reused without building anything. The archive is deterministic:
entries sorted, owner root, and host files keep their own mtimes (which the compiled `.pyc` files
next to the sources check, see INCLUDE_PYC); files this module writes get mtime 0.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

PYTHON = "/usr/bin/python3"
STDLIB = "/usr/lib/python3.11"
REPOSITORY = "atgrpo-sandbox-python"
# Bump when the recipe changes in a way the content hash would not see.
RECIPE_VERSION = 1

# The user the idle process (pid 1) of each warm container runs as, and the first of the per-slot
# users the programs run as (slot n runs as SANDBOX_UID_BASE + n; see docker.py).
IDLE_UID = 65534
SANDBOX_UID_BASE = 61000
PASSWD_SLOTS = 256

# Directory names left out of the standard library (tests, GUI, packaging and docs: nothing a
# sandboxed program needs). `config-3.11-*` holds the 25 MB static libpython for C builds.
_SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "distutils",
}
_SKIP_PREFIXES = ("config-3",)
# Extensions left out with the libraries only they load: tests, and terminal, audio, NIS and
# Berkeley DB modules a program without a tty, sound or network has no use for (4 MB of libraries).
_SKIP_EXTENSIONS = (
    "_test",
    "xxlimited",
    "_xxtestfuzz",
    "_ctypes_test",
    "nis.",
    "_dbm.",
    "readline.",
    "_curses",
    "ossaudiodev.",
)
# The host's compiled bytecode for the modules included, so that every execution does not
# recompile the imports it uses from source (about 30 ms for collections/re/json). Timestamp-based
# .pyc files stay valid because the archive keeps the sources' mtimes.
INCLUDE_PYC = True


class ImageError(RuntimeError):
    """The image could not be built or imported; the message says why."""


@dataclass(frozen=True)
class _Entry:
    name: str  # path inside the image, no leading slash
    kind: str  # "dir" | "file" | "symlink"
    mode: int
    mtime: int = 0
    source: str | None = None  # host path of a file's content
    data: bytes | None = None  # or the content itself
    linkname: str = ""


class _Rootfs:
    """The set of entries of the image, collected from host paths with their symlinks."""

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}

    def _dir(self, name: str, mode: int = 0o755) -> None:
        if name and name not in self.entries:
            self.entries[name] = _Entry(name, "dir", mode)

    def _parents(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self._dir("/".join(parts[:i]))

    def add_host_path(self, path: str, _depth: int = 0) -> None:
        """Add the host file or directory entry at `path`, with every symlink on the way to it."""
        if _depth > 40:
            raise ImageError(f"too many levels of symbolic links resolving {path}")
        parts = [p for p in os.path.normpath(path).split("/") if p]
        for i in range(len(parts)):
            cur = "/" + "/".join(parts[: i + 1])
            name = cur[1:]
            st = os.lstat(cur)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(cur)
                self._parents(name)
                self.entries.setdefault(name, _Entry(name, "symlink", 0o777, linkname=target))
                resolved = os.path.normpath(os.path.join(os.path.dirname(cur), target))
                rest = parts[i + 1 :]
                self.add_host_path(os.path.join(resolved, *rest) if rest else resolved, _depth + 1)
                return
            if stat.S_ISDIR(st.st_mode):
                self._dir(name, stat.S_IMODE(st.st_mode))
            elif i == len(parts) - 1 and stat.S_ISREG(st.st_mode):
                self._parents(name)
                self.entries[name] = _Entry(
                    name, "file", stat.S_IMODE(st.st_mode), int(st.st_mtime), source=cur
                )
            else:
                raise ImageError(f"{cur} is neither a file, a directory nor a symlink")

    def add_file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(name)
        self.entries[name] = _Entry(name, "file", mode, data=data)

    def add_dir(self, name: str, mode: int) -> None:
        self._parents(name)
        self.entries[name] = _Entry(name, "dir", mode)

    def add_symlink(self, name: str, target: str) -> None:
        self._parents(name)
        self.entries.setdefault(name, _Entry(name, "symlink", 0o777, linkname=target))

    def sorted(self) -> list[_Entry]:
        return [self.entries[k] for k in sorted(self.entries, key=lambda n: n.split("/"))]


def _ldd(paths: list[str]) -> set[str]:
    """The shared libraries (and the loader) that `paths` load, as ldd resolves them on the host."""
    if not paths:
        return set()
    out = subprocess.run(["ldd", *paths], capture_output=True, text=True, env={"LC_ALL": "C"})
    libs = set()
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
            if target.startswith("/"):
                libs.add(target)
        elif line.startswith("/") and not line.endswith(":"):  # not the "file:" header
            libs.add(line.split(" (", 1)[0].strip())
    if out.returncode != 0 and not libs:
        raise ImageError(f"ldd failed on {paths[0]}: {out.stderr.strip()}")
    return libs


def _stdlib_files() -> Iterator[str]:
    for root, dirs, files in os.walk(STDLIB):
        keep = []
        for d in dirs:
            if d in _SKIP_DIRS or d.startswith(_SKIP_PREFIXES):
                continue
            keep.append(d)
        dirs[:] = sorted(keep)
        rel = os.path.relpath(root, STDLIB)
        for f in sorted(files):
            if f.endswith((".pyc", ".pyo")):
                continue
            if rel == "lib-dynload" and f.startswith(_SKIP_EXTENSIONS):
                continue
            yield os.path.join(root, f)
            if INCLUDE_PYC and f.endswith(".py"):
                pyc = os.path.join(root, "__pycache__", f[:-3] + ".cpython-311.pyc")
                if os.path.isfile(pyc):
                    yield pyc


def _passwd() -> tuple[bytes, bytes]:
    users = [
        "root:x:0:0:root:/root:/usr/sbin/nologin",
        f"nobody:x:{IDLE_UID}:{IDLE_UID}:idle process:/nonexistent:/usr/sbin/nologin",
    ]
    groups = ["root:x:0:", f"nogroup:x:{IDLE_UID}:"]
    for slot in range(PASSWD_SLOTS):
        uid = SANDBOX_UID_BASE + slot
        users.append(f"sandbox{slot}:x:{uid}:{uid}:sandbox slot {slot}:/tmp:/usr/sbin/nologin")
        groups.append(f"sandbox{slot}:x:{uid}:")
    return ("\n".join(users) + "\n").encode(), ("\n".join(groups) + "\n").encode()


def collect() -> list[_Entry]:
    """The image's entries, from the host's files."""
    if not os.path.exists(PYTHON) or not os.path.isdir(STDLIB):
        raise ImageError(
            f"the docker image is built from the host's {PYTHON} and {STDLIB}, "
            "which are missing: apt-get install python3.11-minimal libpython3.11-stdlib"
        )
    fs = _Rootfs()
    # Merged /usr, as on the host: /bin, /lib and /lib64 are links into /usr.
    for top in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink("/" + top):
            fs.add_symlink(top, os.readlink("/" + top))
    fs.add_host_path(PYTHON)
    stdlib = list(_stdlib_files())
    for path in stdlib:
        fs.add_host_path(path)
    extensions = [p for p in stdlib if p.endswith(".so")]
    for lib in sorted(_ldd([os.path.realpath(PYTHON)]) | _ldd(extensions)):
        fs.add_host_path(lib)
    passwd, group = _passwd()
    fs.add_file("etc/passwd", passwd)
    fs.add_file("etc/group", group)
    fs.add_dir("tmp", 0o1777)
    for d in ("proc", "dev", "sys", "root"):
        fs.add_dir(d, 0o755 if d != "root" else 0o700)
    return fs.sorted()


def _tarinfo(e: _Entry, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(e.name)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = (
        e.mode,
        e.mtime,
        0,
        0,
        "",
        "",
    )
    if e.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif e.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, e.linkname
    else:
        info.type, info.size = tarfile.REGTYPE, size
    return info


def _content(e: _Entry) -> bytes:
    if e.data is not None:
        return e.data
    assert e.source is not None
    with open(e.source, "rb") as f:
        return f.read()


def content_hash(entries: list[_Entry]) -> str:
    h = hashlib.sha256(f"atgrpo-sandbox-python recipe {RECIPE_VERSION}\n".encode())
    for e in entries:
        meta = [e.name, e.kind, oct(e.mode), e.mtime, e.linkname]
        if e.kind == "file":
            meta.append(hashlib.sha256(_content(e)).hexdigest())
        h.update(json.dumps(meta).encode() + b"\n")
    return h.hexdigest()


def write_tarball(entries: list[_Entry], fileobj: io.BufferedIOBase) -> None:
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for e in entries:
            if e.kind == "file":
                data = _content(e)
                tar.addfile(_tarinfo(e, len(data)), io.BytesIO(data))
            else:
                tar.addfile(_tarinfo(e, 0))


def image_tag(entries: list[_Entry] | None = None) -> str:
    """`repository:tag` of the image the host's files make (no engine needed)."""
    return f"{REPOSITORY}:{content_hash(entries if entries is not None else collect())[:16]}"


def _exists(client, ref: str) -> bool:
    import docker.errors

    try:
        client.api.inspect_image(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(client) -> str:
    """The image reference, building and importing the image first unless the engine has it."""
    entries = collect()
    ref = image_tag(entries)
    if _exists(client, ref):
        return ref
    repository, tag = ref.split(":", 1)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="atgrpo-image-") as tmp:
        path = os.path.join(tmp, "rootfs.tar")
        with open(path, "wb") as f:
            write_tarball(entries, f)
        size = os.path.getsize(path)
        result = client.api.import_image(
            src=path,
            repository=repository,
            tag=tag,
            changes=[
                "USER 65534:65534",
                "WORKDIR /tmp",
                'CMD ["python3"]',
                "LABEL org.opencontainers.image.title=atgrpo-sandbox-python",
            ],
        )
    for line in str(result).splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("error"):
            raise ImageError(f"docker import of the sandbox image failed: {msg['error']}")
    if not _exists(client, ref):
        raise ImageError(
            f"docker import reported success but {ref} is not in the engine: {result!r}"
        )
    _last_build.update(ref=ref, tar_bytes=size, seconds=time.monotonic() - start)
    return ref


# What the last build in this process made (for logs and the report): ref, tar_bytes, seconds.
_last_build: dict = {}
