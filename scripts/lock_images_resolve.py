"""pip's dry run of what an image installs (scripts/lock_images.py's docstring says how and why):
where pip looks (the indexes, find-links and connection settings pip is configured with here),
the `pip install --dry-run --report` command for the image's target, the resolution it reports,
and, when it fails, a message that names the conflicting pins and what excludes them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lock_images_build import ROOT, Build, ImageCheckError, requirements
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

PYPI = "https://pypi.org/simple"
# pip settings about the connection, carried over from pip's configuration into the dry-run.
CONNECTION_KEYS = (
    "cert",
    "client-cert",
    "trusted-host",
    "proxy",
    "timeout",
    "default-timeout",
    "retries",
)
DRY_RUN_TIMEOUT_S = 480
_UNREACHABLE = re.compile(
    r"NameResolutionError|Failed to establish a new connection|Max retries exceeded"
    r"|Could not fetch URL|ConnectTimeoutError|Network is unreachable|Connection refused"
)


class ResolutionFailed(ImageCheckError):
    def __init__(self, message: str, pins: list[str], output: str):
        super().__init__(message)
        self.pins = pins  # the constraint lines pip names as conflicting, e.g. "numpy==2.4.6"
        self.output = output


# ---- where pip looks ----------------------------------------------------------------------------


@dataclass
class Sources:
    index_url: str = PYPI
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    connection: dict[str, str] = field(default_factory=dict)  # PIP_* variables for the dry-run


def pip_sources(python: str = sys.executable) -> Sources:
    """The indexes, find-links and connection settings pip uses here, from `pip config list`
    (configuration files and PIP_* variables; a variable wins over a file, as in pip)."""
    out = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    rank = {"global": 0, "install": 1, ":env:": 2}
    values: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)=(.*)", line.strip())
        if not m or m.group(1) not in rank:
            continue
        value = ast.literal_eval(m.group(3))
        if m.group(2) not in values or rank[m.group(1)] >= values[m.group(2)][0]:
            values[m.group(2)] = (rank[m.group(1)], value)
    get = {k: v for k, (_, v) in values.items()}
    return Sources(
        index_url=get.get("index-url", PYPI),
        extra_index_urls=get.get("extra-index-url", "").split(),
        find_links=get.get("find-links", "").split(),
        connection={
            f"PIP_{k.upper().replace('-', '_')}": get[k] for k in CONNECTION_KEYS if k in get
        },
    )


def reachable(url: str, timeout_s: float = 15) -> tuple[bool, str]:
    """Whether an index answers at all (any HTTP status counts), or why not. It asks for one
    project's page: an index's root can list every project (PyPI's is tens of megabytes)."""
    if url.startswith("file://"):
        path = Path(urllib.request.url2pathname(url[len("file://") :]))
        return path.is_dir(), f"{path} is not a directory"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/pip/", timeout=timeout_s):
            return True, ""
    except urllib.error.HTTPError:
        return True, ""
    except (urllib.error.URLError, OSError) as err:
        return False, str(getattr(err, "reason", err))


# ---- the dry run --------------------------------------------------------------------------------


@dataclass
class Resolution:
    image: str
    packages: dict[str, str]  # canonical name -> version
    names: dict[str, str]  # canonical name -> the name as the distribution spells it
    seconds: float
    indexes: list[str]
    notes: list[str]


def dry_run_command(
    build: Build,
    requirements_file: Path,
    constraints: list[Path],
    sources: Sources,
    report: Path,
    use_find_links: bool,
    extra_indexes: list[str],
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "--progress-bar",
        "off",
        "--python-version",
        build.python,
        "--implementation",
        "cp",
        "--abi",
        "cp" + "".join(build.python.split(".")[:2]),
        "--only-binary=:all:",
    ]
    for tag in build.platforms:
        cmd += ["--platform", tag]
    cmd += ["--index-url", sources.index_url]
    for url in [*sources.extra_index_urls, *extra_indexes]:
        cmd += ["--extra-index-url", url]
    if use_find_links:
        for link in sources.find_links:
            cmd += ["--find-links", link]
    for c in constraints:
        cmd += ["-c", str(c)]
    return cmd + ["-r", str(requirements_file)]


def resolve(
    build: Build,
    sources: Sources | None = None,
    constraints: list[Path] | None = None,
    cache_dir: Path | None = None,
    pyproject: Path = ROOT / "pyproject.toml",
) -> Resolution:
    """Resolve what `build` installs, for its target, without installing; ResolutionFailed or
    ImageCheckError with a message that names the cause."""
    sources = sources or pip_sources()
    ok, why = reachable(sources.index_url)
    if not ok:
        raise ImageCheckError(
            f"{build.image}: the package index {sources.index_url} is unreachable ({why}); "
            "resolving the image's requirements needs it"
        )
    notes, extra_indexes = [], []
    for url in build.extra_index_urls:
        ok, why = reachable(url)
        if ok:
            extra_indexes.append(url)
        else:
            notes.append(
                f"{url} is unreachable from here ({why}); pip's find-links stand in for it"
            )
    constraints = [ROOT / c for c in build.constraints] if constraints is None else constraints
    with tempfile.TemporaryDirectory(prefix="atgrpo-lock-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(requirements(build.extras, pyproject)) + "\n")
        report = Path(tmp) / "report.json"
        cmd = dry_run_command(
            build, req, constraints, sources, report, bool(build.extra_index_urls), extra_indexes
        )
        keep = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env = {
            **keep,
            **sources.connection,
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_INPUT": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_CACHE_DIR": str(cache_dir or Path(tmp) / "cache"),
        }
        start = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, timeout=DRY_RUN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ImageCheckError(
                f"{build.image}: pip's dry run took over {DRY_RUN_TIMEOUT_S} s"
            ) from None
        seconds = time.monotonic() - start
        output = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise explain_failure(build.image, output, constraints, cmd)
        installs = json.loads(report.read_text())["install"]
    packages = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs
    }
    names = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["name"] for i in installs}
    used = [sources.index_url, *sources.extra_index_urls, *extra_indexes]
    if build.extra_index_urls:
        used += [f"find-links {link}" for link in sources.find_links]
    return Resolution(build.image, packages, names, seconds, used, notes)


def explain_failure(
    image: str, output: str, constraints: list[Path], cmd: list[str]
) -> ImageCheckError:
    """The message for a failed dry run: the conflicting pins with the files that hold them and
    the requirements that exclude them, or why pip could not look."""
    lines = output.splitlines()
    pins = re.findall(r"The user requested \(constraint\) (\S+)", output)
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    if pins:
        where = []
        for pin in pins:
            name = canonicalize_name(re.split(r"[=<>!~ ;\[]", pin, maxsplit=1)[0])
            files = [
                str(c.relative_to(ROOT)) if c.is_relative_to(ROOT) else c.name
                for c in constraints
                if name in {canonicalize_name(p) for p in read_pins(c)}
            ]
            culprits = [f"      {ln.strip()}" for ln in lines if _excludes(ln, name, pin)]
            where.append(
                f"  {pin} (pinned in {', '.join(files) or 'a constraints file'}), which these "
                f"exclude:\n"
                + "\n".join(culprits or ["      (pip named no requirement; see its output below)"])
            )
        return ResolutionFailed(
            f"{image}: the image's requirements do not resolve (ResolutionImpossible): "
            f"conflicting pin{'s' if len(pins) > 1 else ''}\n"
            + "\n".join(where)
            + "\n"
            + "\n".join(errors[-2:]),
            pins,
            output,
        )
    if _UNREACHABLE.search(output):
        hits = sorted({ln.strip() for ln in lines if _UNREACHABLE.search(ln)})[:3]
        return ImageCheckError(
            f"{image}: the package index is unreachable, so the image's requirements could not be "
            "resolved:\n  " + "\n  ".join(hits)
        )
    return ResolutionFailed(
        f"{image}: the image's requirements do not resolve:\n  "
        + "\n  ".join(errors or lines[-15:])
        + "\n(command: "
        + shlex.join(cmd[2:])
        + ")",
        [],
        output,
    )


def _excludes(line: str, name: str, pin: str) -> bool:
    """Whether a "X 1.0 depends on numpy<2.4 and >=1.25; marker" line of pip's excludes the pin."""
    m = re.match(r"\s*(\S+) (\S+) depends on (.+)$", line)
    if not m:
        return False
    spec = m.group(3).split(";")[0].replace(" and ", ",")
    try:
        req = Requirement(spec)
        version = pin.split("==", 1)[1] if "==" in pin else None
    except (InvalidRequirement, IndexError):
        return False
    return (
        canonicalize_name(req.name) == name
        and version is not None
        and not req.specifier.contains(version, prereleases=True)
    )


def read_pins(path: Path) -> dict[str, str]:
    """name -> exact version of a constraints file's `name==version` lines (names as written)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    return pins
