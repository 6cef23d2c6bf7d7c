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

lock_images_build.py reads what an image installs; lock_images_resolve.py runs pip's dry run
and explains a failure; this file checks the resolutions and writes the lock.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from lock_images_build import ROOT, Build, ImageCheckError, build_of
from lock_images_resolve import (
    Resolution,
    ResolutionFailed,
    Sources,
    _excludes,
    pip_sources,
    read_pins,
    resolve,
)
from packaging.utils import canonicalize_name
from packaging.version import Version

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
