"""The images' Python dependencies resolve: each image's requirements (pyproject's core plus the
extras its Dockerfile names), with the constraints files its Dockerfile installs with, resolved
by `pip install --dry-run --report` against the package index pip is configured with here, for
the image's interpreter and platform (scripts/lock_images.py says how). Nothing is installed and
nothing is cached outside a temporary folder; a conflicting pin fails here, naming the pin.

The resolutions need the index: where it cannot be reached they fail saying so (never skip).
The other tests read files only.
"""

from __future__ import annotations

import importlib
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helm.conftest import ROOT
from tests.helm.dockerfile import parse


def _script_module(name: str):
    """scripts/<name>.py, imported as the script imports its siblings (its folder on sys.path)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "scripts"))


L = _script_module("lock_images")  # the checks and the lock
B = _script_module("lock_images_build")  # what an image installs
R = _script_module("lock_images_resolve")  # pip's dry run
ROLLOUT_LOCK = ROOT / L.LOCKED["rollout-gpu"]


# ---- what each image installs (files only) -------------------------------------------------------


def test_each_image_installs_with_its_own_constraints():
    builds = {image: B.build_of(image) for image in L.IMAGES}
    assert builds["cpu"].extras == ["train", "data"]
    assert builds["rollout-gpu"].extras == ["train", "vllm"]
    assert builds["trainer-gpu"].extras == ["train"]
    assert builds["cpu"].constraints == ["constraints.txt"]
    assert builds["rollout-gpu"].constraints == ["docker/constraints-rollout-gpu.txt", L.CUDA_FILE]
    assert builds["trainer-gpu"].constraints == ["constraints.txt", L.CUDA_FILE]
    assert builds["cpu"].extra_index_urls == ["https://download.pytorch.org/whl/cpu"]
    for build in builds.values():
        assert (build.python, build.glibc_minor) == ("3.11.13", 36)  # python:3.11.13-slim-bookworm
        assert all((ROOT / c).is_file() for c in build.constraints)


def test_the_cpu_image_reads_parquet():
    """env_svc runs in the CPU image and reads .parquet datasets when pyarrow is importable."""
    reqs = [Requirement(r) for r in B.requirements(B.build_of("cpu").extras)]
    [pyarrow] = [r for r in reqs if r.name == "pyarrow"]
    pinned = R.read_pins(ROOT / "constraints.txt")["pyarrow"]
    assert pyarrow.specifier.contains(pinned), (
        f"constraints.txt pins pyarrow {pinned}, outside {pyarrow}"
    )


def test_the_cuda_version_is_written_once():
    """docker/cuda.txt holds it; both GPU images install with it; no Dockerfile names another."""
    assert L.cuda_version() == "13.0"
    for image in L.GPU_IMAGES:
        assert L.CUDA_FILE in B.build_of(image).constraints
    for path in (ROOT / "docker").glob("*.Dockerfile"):
        for ins in parse(path.read_text()).instructions:
            assert not re.search(r"cuda[^a-z]*\d|\bcu1\d\d?\b|nvidia/cuda", ins.args, re.I), (
                f"{path.name} line {ins.line} names a CUDA version; it belongs in {L.CUDA_FILE}: "
                f"{ins.args}"
            )


def test_the_rollout_pins_follow_pyproject_and_constraints():
    """docker/constraints-rollout-gpu.txt is stale when pyproject or constraints.txt moved without
    `make lock-images`: its pins must satisfy the image's requirements, and agree with
    constraints.txt except where its header says why they differ."""
    pins = {canonicalize_name(n): v for n, v in R.read_pins(ROLLOUT_LOCK).items()}
    lines = [ln for ln in ROLLOUT_LOCK.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == len(pins) and all(re.fullmatch(r"[\w.-]+==[\w.+!-]+", ln) for ln in lines)
    for text in B.requirements(B.build_of("rollout-gpu").extras):
        req = Requirement(text)
        version = pins.get(canonicalize_name(req.name))
        assert version is not None and req.specifier.contains(version, prereleases=True), (
            f"{ROLLOUT_LOCK.name} pins {req.name} {version}, outside pyproject's {text}: run `make "
            f"lock-images`"
        )
    base = {canonicalize_name(n): v for n, v in R.read_pins(ROOT / "constraints.txt").items()}
    differs = L.differs(ROLLOUT_LOCK)
    assert "numpy" in differs  # vLLM -> mistral_common[image] -> numpy<2.4 (Python <= 3.12)
    for name, version in pins.items():
        if name in differs:
            assert (version, base.get(name)) == differs[name], (
                f"{name}: the header of {ROLLOUT_LOCK.name} is stale: run `make lock-images`"
            )
        elif name in base:
            assert version == base[name], (
                f"{ROLLOUT_LOCK.name} pins {name}=={version}, constraints.txt {base[name]}, "
                "and its header gives no reason: run `make lock-images`"
            )


# ---- how a failure reads (files only) ------------------------------------------------------------

# pip 26's words when the rollout image was installed with constraints.txt (cut short).
NUMPY_CONFLICT = (
    "ERROR: Cannot install -r /tmp/r.txt (line 11), humming-kernels, matplotlib, mistral_common "
    "and vllm because these package versions have conflicting dependencies.\n"
    """
The conflict is caused by:
    transformers 5.19.0 depends on numpy>=1.17
    vllm 0.32.0 depends on numpy
    numba 0.65.0 depends on numpy<2.5 and >=1.22
    mistral-common 1.13.1 depends on numpy<2.4 and >=1.25; python_version <= "3.12"
    mistral-common 1.11.6 depends on numpy<2.4 and >=1.25; python_version <= "3.12"
    The user requested (constraint) numpy==2.4.6

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip to attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""
)


def test_a_conflict_names_the_pin_its_file_and_who_excludes_it():
    err = R.explain_failure(
        "rollout-gpu", NUMPY_CONFLICT, [ROOT / "constraints.txt", ROOT / L.CUDA_FILE], []
    )
    assert isinstance(err, R.ResolutionFailed) and err.pins == ["numpy==2.4.6"]
    text = str(err)
    assert "ResolutionImpossible" in text and "numpy==2.4.6 (pinned in constraints.txt)" in text
    assert 'mistral-common 1.13.1 depends on numpy<2.4 and >=1.25; python_version <= "3.12"' in text
    assert "numba" not in text and "transformers" not in text  # their ranges hold 2.4.6


def test_an_unreachable_index_fails_saying_so():
    dead = R.Sources(index_url="http://127.0.0.1:9/simple")  # nothing listens on the discard port
    with pytest.raises(
        B.ImageCheckError, match=r"the package index http://127.0.0.1:9/simple is unreachable"
    ):
        R.resolve(B.build_of("trainer-gpu"), dead)


def test_the_index_is_pips_own(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.invalid/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///srv/a/simple file:///srv/b/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/wheels")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "77")
    s = R.pip_sources()
    assert s.index_url == "https://mirror.invalid/simple"
    assert s.extra_index_urls == ["file:///srv/a/simple", "file:///srv/b/simple"]
    assert s.find_links == ["/srv/wheels"] and s.connection["PIP_DEFAULT_TIMEOUT"] == "77"


def test_the_dry_run_targets_the_image_and_sees_no_local_wheels_for_gpu(tmp_path):
    s = R.Sources(find_links=["/srv/wheels"])
    gpu = R.dry_run_command(
        B.build_of("rollout-gpu"), tmp_path / "r.txt", [], s, tmp_path / "r.json", False, []
    )
    for flag in (
        "--dry-run",
        "--report",
        "--only-binary=:all:",
        "manylinux_2_36_x86_64",
        "manylinux2014_x86_64",
    ):
        assert flag in gpu
    assert gpu[gpu.index("--python-version") + 1] == "3.11.13" and "--find-links" not in gpu
    assert "manylinux_2_37_x86_64" not in gpu  # bookworm's glibc is 2.36


# ---- the resolutions (need the package index) ----------------------------------------------------


@pytest.fixture(scope="module")
def resolutions():
    """Every image's resolution started at once (each is mostly waiting on the index): image ->
    a future of its Resolution, or of the ImageCheckError that says why not. Each test waits for
    its own image only, so no one test carries all three (cpu 15 s, trainer-gpu 30 s, rollout-gpu
    42 s measured side by side here)."""
    sources = R.pip_sources()

    def one(image, cache):
        try:
            return L.check(image, sources, cache)
        except B.ImageCheckError as err:
            return err

    with (
        tempfile.TemporaryDirectory(prefix="atgrpo-pip-cache-") as cache,
        ThreadPoolExecutor(len(L.IMAGES)) as pool,
    ):
        yield {image: pool.submit(one, image, Path(cache)) for image in L.IMAGES}


@pytest.mark.slow
@pytest.mark.xdist_group("image-deps")  # one worker resolves each image once (make test-all)
@pytest.mark.timeout(R.DRY_RUN_TIMEOUT_S + 120)
@pytest.mark.parametrize("image", L.IMAGES)
def test_image_requirements_resolve(image, resolutions, record_property):
    res = resolutions[image].result()
    if isinstance(res, Exception):
        pytest.fail(str(res), pytrace=False)
    record_property("dry_run_seconds", round(res.seconds, 1))
    print(
        f"{image}: {len(res.packages)} packages in {res.seconds:.1f} s from "
        f"{', '.join(res.indexes)}"
    )
    if image == "cpu":
        assert "pyarrow" in res.packages and res.packages["torch"].endswith("+cpu")
    else:
        assert res.packages["cuda-toolkit"].startswith(L.cuda_version() + ".")
    if image == "rollout-gpu":
        assert res.packages["vllm"] == "0.32.0"
        assert res.packages["numpy"] == R.read_pins(ROLLOUT_LOCK)["numpy"]
