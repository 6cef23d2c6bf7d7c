"""Resolve each image's Python dependencies as its Dockerfile installs them, without installing
anything (`pip install --dry-run --report`), and write the pins of the images that need their own.

    python scripts/lock_images.py            # rewrite docker/constraints-rollout-gpu.txt
                                             # (make lock-images)
    python scripts/lock_images.py --check    # resolve every image; exit 1 naming the
                                             # conflicting pin

What an image installs is read from its Dockerfile: the extras given to requirements.py, the
`-c` constraints files and any `--extra-index-url` of the `pip install` in its build stage, and
the interpreter and C library from its base image (python:3.11.13-slim-bookworm: CPython 3.11.13,
glibc 2.36, x86_64). pip resolves for that target with `--python-version`, `--platform` and
`--only-binary=:all:` (pip refuses sdists for a foreign target: it would have to build them
here). Every dependency has a wheel today (pyseccomp too: a py3-none-any one); a future one
that ships only an sdist fails the check by name, to be pinned to a version with a wheel.

The indexes are the ones pip is configured with here (`pip config list`, PIP_* variables), as
for `make install`, read once and passed explicitly; no other pip configuration applies
(PIP_CONFIG_FILE=/dev/null), as in an image build. Two differences, both on purpose:
- find-links directories hold this machine's own wheels (here the CPU torch 2.13.0+cpu), which
  no image build sees. The GPU images resolve without them: their torch is PyPI's CUDA build.
  The CPU image takes torch from TORCH_INDEX_URL (PyTorch's CPU index), which a machine that
  reaches only PyPI cannot reach: it resolves with that index when it answers and with the
  find-links as its stand-in, and the check then insists on a `+cpu` torch.
- pip's cache goes to a temporary folder, removed afterwards.

The GPU rollout image cannot share constraints.txt (the CPU machine's pins): vLLM needs
mistral_common[image]>=1.11.6, every release of which needs numpy<2.4 on Python <= 3.12, and
constraints.txt pins numpy 2.4.6. Its own pins are written by resolving its requirements with
constraints.txt, dropping each pin pip names as conflicting, until it resolves: it keeps the CPU
machine's versions wherever vLLM allows, and the file's header says which differ and why.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
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

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
IMAGES = ("cpu", "rollout-gpu", "trainer-gpu")
GPU_IMAGES = ("rollout-gpu", "trainer-gpu")
BASE_CONSTRAINTS = "constraints.txt"
# Images whose pins must differ from constraints.txt, and the file this script writes for each.
LOCKED = {"rollout-gpu": "docker/constraints-rollout-gpu.txt"}
# The CUDA of the GPU images, in one place (a pip constraint both GPU Dockerfiles install with).
CUDA_FILE = "docker/cuda.txt"
# Packages named for another CUDA major that the GPU images carry beside their own, and why.
OTHER_CUDA_ALLOWED = {
    "nvidia-cutlass-dsl-libs-cu12": "nvidia-cutlass-dsl always requires it; vLLM adds the -cu13 "
    "libraries through nvidia-cutlass-dsl[cu13]",
}
# The C library of the base images' Debian releases: the newest manylinux tag a wheel may carry.
GLIBC = {"bullseye": 31, "bookworm": 36, "trixie": 41}
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


class ImageCheckError(Exception):
    """An image's requirements do not resolve, or resolve to the wrong build; the message says
    why."""


class ResolutionFailed(ImageCheckError):
    def __init__(self, message: str, pins: list[str], output: str):
        super().__init__(message)
        self.pins = pins  # the constraint lines pip names as conflicting, e.g. "numpy==2.4.6"
        self.output = output


# ---- what an image installs -------------------------------------------------------------------


@dataclass
class Build:
    image: str
    base_image: str
    python: str  # "3.11.13"
    glibc_minor: int  # 36: manylinux_2_36 and older
    extras: list[str]
    constraints: list[str]  # paths from the repository root, in the Dockerfile's order
    extra_index_urls: list[str] = field(default_factory=list)

    @property
    def platforms(self) -> list[str]:
        tags = [f"manylinux_2_{m}_x86_64" for m in range(self.glibc_minor, 4, -1)]
        return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


@functools.cache
def _dockerfile_module():
    """tests/helm/dockerfile.py, the Dockerfile reader the image tests use."""
    spec = importlib.util.spec_from_file_location(
        "atgrpo_dockerfile", ROOT / "tests" / "helm" / "dockerfile.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["atgrpo_dockerfile"] = mod
    spec.loader.exec_module(mod)
    return mod


def build_of(image: str, docker_dir: Path = DOCKER) -> Build:
    """How docker/<image>.Dockerfile installs its dependencies, read from its build stage."""
    dockerfile = _dockerfile_module()
    df = dockerfile.parse((docker_dir / f"{image}.Dockerfile").read_text())
    args = df.global_args()
    stage = df.stages()[0]
    base = dockerfile.expand(stage[0].args.split()[0], args)
    m = re.fullmatch(r"(?:.*/)?python:(\d+\.\d+\.\d+)-(?:slim-)?(\w+)(?:@sha256:\w+)?", base)
    if not m or m.group(2) not in GLIBC:
        raise ImageCheckError(
            f"{image}: base image {base!r} is not python:X.Y.Z[-slim]-<{'|'.join(GLIBC)}>; "
            "teach scripts/lock_images.py its interpreter and C library"
        )
    # the first COPY brings the dependency files into the working directory under their own names
    copy = next(i for i in stage if i.name == "COPY")
    copied = {Path(src).name: src for src in copy.args.split()[:-1]}
    run = next((i for i in stage if i.name == "RUN" and "requirements.py" in i.args), None)
    if run is None:
        raise ImageCheckError(f"{image}: no RUN in the build stage runs requirements.py")
    words = shlex.split(dockerfile.expand(run.args, args))
    at = words.index("requirements.py")
    extras = []
    for w in words[at + 1 :]:
        if w.startswith(">") or w in ("&&", "|"):
            break
        extras.append(w)
    pip = next(i for i in range(len(words) - 1) if words[i] == "pip" and words[i + 1] == "install")
    constraints, indexes = [], []
    it = iter(words[pip + 2 :])
    for w in it:
        if w in ("&&", ";"):
            break
        if w in ("-c", "--constraint"):
            name = next(it)
            if name not in copied:
                raise ImageCheckError(
                    f"{image}: pip install -c {name}, which the first COPY does not bring"
                )
            constraints.append(copied[name])
        elif w == "--extra-index-url":
            indexes.append(next(it))
        elif w.startswith("--extra-index-url="):
            indexes.append(w.partition("=")[2])
        elif w in ("-r", "--requirement"):
            next(it)
        else:
            raise ImageCheckError(
                f"{image}: `pip install ... {w}` in the build stage: scripts/lock_images.py "
                "does not know how that changes the resolution; teach it"
            )
    return Build(image, base, m.group(1), GLIBC[m.group(2)], extras, constraints, indexes)


def requirements(extras: list[str], pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """docker/requirements.py's output: the core dependencies plus the extras."""
    out = subprocess.run(
        [sys.executable, str(DOCKER / "requirements.py"), "--pyproject", str(pyproject), *extras],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise ImageCheckError(out.stderr.strip())
    return out.stdout.splitlines()


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


# ---- the checks and the lock ------------------------------------------------------------------


def cuda_version(path: Path = ROOT / CUDA_FILE) -> str:
    """ "13.0" from docker/cuda.txt's `cuda-toolkit==13.0.*`."""
    m = re.search(r"^cuda-toolkit==(\d+\.\d+)\.\*\s*$", path.read_text(), re.M)
    if not m:
        raise ImageCheckError(f"{path}: no `cuda-toolkit==MAJOR.MINOR.*` line")
    return m.group(1)


def check_resolution(res: Resolution, build: Build, cuda: str) -> None:
    """What a resolution must hold beyond resolving: the right torch build, one CUDA, full pins."""
    torch = res.packages.get("torch")
    if torch is None:
        raise ImageCheckError(f"{res.image}: resolves without torch")
    if build.image in GPU_IMAGES:
        if Version(torch).local:
            raise ImageCheckError(f"{res.image}: torch resolved to {torch}, not PyPI's CUDA build")
        _check_cuda(res, build, cuda)
    else:
        cuda_pkgs = sorted(
            n for n in res.packages if n.startswith(("nvidia-", "cuda-")) or n == "triton"
        )
        if Version(torch).local != "cpu" or cuda_pkgs:
            raise ImageCheckError(
                f"{res.image}: torch resolved to {torch} (with "
                f"{', '.join(cuda_pkgs) or 'no CUDA packages'}), not a +cpu build: "
                f"{'; '.join(res.notes) or 'the CPU wheel index did not serve it'}; no index or "
                f"find-links here serves torch=={torch.split('+')[0]}+cpu"
            )
    own = LOCKED.get(build.image)
    if own:
        pins = {canonicalize_name(n): v for n, v in read_pins(ROOT / own).items()}
        loose = sorted(f"{res.names[n]}=={v}" for n, v in res.packages.items() if pins.get(n) != v)
        if loose:
            raise ImageCheckError(
                f"{res.image}: {own} does not pin {', '.join(loose)}: run `make lock-images`"
            )


def _check_cuda(res: Resolution, build: Build, cuda: str) -> None:
    major = cuda.split(".")[0]
    where = f"{CUDA_FILE} says CUDA {cuda}"
    toolkit = res.packages.get("cuda-toolkit")
    runtime = res.packages.get("nvidia-cuda-runtime") or res.packages.get(
        f"nvidia-cuda-runtime-cu{major}"
    )
    if toolkit is None or not toolkit.startswith(cuda + "."):
        raise ImageCheckError(f"{res.image}: {where}, but the resolved cuda-toolkit is {toolkit}")
    if runtime is None or not runtime.startswith(cuda + "."):
        raise ImageCheckError(f"{res.image}: {where}, but the resolved CUDA runtime is {runtime}")
    others = sorted(
        f"{res.names[n]}=={v}"
        for n, v in res.packages.items()
        if (m := re.search(r"-cu(\d+)$", n)) and m.group(1) != major and n not in OTHER_CUDA_ALLOWED
    )
    if others:
        raise ImageCheckError(
            f"{res.image}: {where}, but these are built for another CUDA: {', '.join(others)}"
        )
    # a CUDA base image must carry the same CUDA as the wheels
    if "cuda" in build.base_image.split(":")[0]:
        tag = build.base_image.split(":")[-1]
        if not tag.startswith(cuda + "."):
            raise ImageCheckError(f"{res.image}: {where}, but the base image is {build.base_image}")


def check(image: str, sources: Sources | None = None, cache_dir: Path | None = None) -> Resolution:
    build = build_of(image)
    res = resolve(build, sources, cache_dir=cache_dir)
    check_resolution(res, build, cuda_version())
    return res


def lock(
    image: str,
    sources: Sources | None = None,
    out: Path | None = None,
    cache_dir: Path | None = None,
    max_rounds: int = 10,
) -> tuple[Path, dict[str, str]]:
    """Write LOCKED[image]: the image's requirements resolved with constraints.txt's pins, less
    those that conflict; returns the file and {dropped pin: why}."""
    build = build_of(image)
    own = LOCKED[image]
    others = [ROOT / c for c in build.constraints if c != own]
    base_lines = (ROOT / BASE_CONSTRAINTS).read_text().splitlines()
    base = {canonicalize_name(n): (n, v) for n, v in read_pins(ROOT / BASE_CONSTRAINTS).items()}
    dropped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="atgrpo-lock-") as tmp:
        tmp_base = Path(tmp) / BASE_CONSTRAINTS
        for _ in range(max_rounds):
            tmp_base.write_text(
                "\n".join(ln for ln in base_lines if _pin_name(ln) not in dropped) + "\n"
            )
            try:
                res = resolve(build, sources, constraints=[tmp_base, *others], cache_dir=cache_dir)
                break
            except ResolutionFailed as err:
                names = {_pin_name(p) for p in err.pins}
                if not err.pins or not names <= set(base) or names & set(dropped):
                    raise ImageCheckError(
                        f"{err}\n{image}: only constraints.txt's pins give way to the image's "
                        f"requirements; the others ({', '.join(str(c) for c in others)}) are "
                        "meant, so change them by hand"
                    ) from None
                for name in names:
                    culprits = [
                        ln.strip()
                        for ln in err.output.splitlines()
                        if _excludes(ln, name, f"{base[name][0]}=={base[name][1]}")
                    ]
                    dropped[name] = culprits[0] if culprits else "pip named it as conflicting"
        else:
            raise ImageCheckError(
                f"{image}: still no resolution after dropping {', '.join(dropped)}"
            )
    header = [
        f"# The exact pins of docker/{image}.Dockerfile (installed with "
        f"{', '.join(c for c in build.constraints)}):",
        f"# pyproject.toml's core and {', '.join(build.extras)} extras resolved for CPython "
        f"{build.python} on manylinux x86_64 (glibc 2.{build.glibc_minor})",
        f"# from {', '.join(i for i in res.indexes if not i.startswith('file:'))} by `pip install "
        f"--dry-run --report`.",
        "# Written by `make lock-images` (scripts/lock_images.py): do not edit by hand. It keeps",
        "# constraints.txt's version wherever the image's requirements allow; these differ:",
    ]
    for name, why in sorted(dropped.items()):
        header.append(
            f"# differs: {base[name][0]}=={res.packages.get(name, '(not installed)')} "
            f"(constraints.txt: {base[name][1]}): {why}"
        )
    if not dropped:
        header.append("# differs: none")
    body = sorted(f"{res.names[n]}=={v}" for n, v in res.packages.items())
    path = out or ROOT / own
    path.write_text("\n".join(header + sorted(body, key=str.lower)) + "\n")
    return path, dropped


def _pin_name(line: str) -> str:
    return (
        canonicalize_name(re.split(r"[=<>!~ ;\[#]", line.strip(), maxsplit=1)[0])
        if line.strip()
        else ""
    )


def differs(path: Path) -> dict[str, tuple[str, str]]:
    """A lock file's `# differs:` lines: name -> (its version, constraints.txt's version then)."""
    out = {}
    for m in re.finditer(
        r"^# differs: (\S+)==(\S+) \(constraints\.txt: (\S+)\)", path.read_text(), re.M
    ):
        out[canonicalize_name(m.group(1))] = (m.group(2), m.group(3))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="resolve every image and check it; write nothing"
    )
    ap.add_argument(
        "images",
        nargs="*",
        help=f"default: {', '.join(LOCKED)}, or with --check {', '.join(IMAGES)}",
    )
    args = ap.parse_args(argv)
    sources = pip_sources()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="atgrpo-pip-cache-") as cache:
        for image in args.images or (IMAGES if args.check else list(LOCKED)):
            try:
                if args.check:
                    res = check(image, sources, Path(cache))
                    print(
                        f"{image}: {len(res.packages)} packages resolve in {res.seconds:.1f} s"
                        + "".join(f"\n  note: {n}" for n in res.notes)
                    )
                else:
                    path, dropped = lock(image, sources, cache_dir=Path(cache))
                    print(
                        f"{image}: wrote {path.relative_to(ROOT)}"
                        + "".join(
                            f"\n  differs from constraints.txt: {n}: {why}"
                            for n, why in dropped.items()
                        )
                    )
            except ImageCheckError as err:
                print(err, file=sys.stderr)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
