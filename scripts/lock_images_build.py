"""What an image installs, read from its Dockerfile (scripts/lock_images.py's first step): the
base image's interpreter and C library, the extras given to requirements.py, the `-c` constraints
files and any `--extra-index-url` of the `pip install` in its build stage; and the requirements
those extras come to. The errors every step of lock_images raises live here too.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
# The C library of the base images' Debian releases: the newest manylinux tag a wheel may carry.
GLIBC = {"bullseye": 31, "bookworm": 36, "trixie": 41}


class ImageCheckError(Exception):
    """An image's requirements do not resolve, or resolve to the wrong build; the message says
    why."""


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
