"""What each part of the GPU check (gpu_check.py) needs installed beyond torch, and what to carry
to a bare GPU machine for it: a machine that has torch and CUDA and no internet gets the parts'
wheels and what they require, transitively (`gpu_check.py --wheels` prints them), and a part
whose wheels are missing is skipped, saying which (missing_wheels). The same closure tells which
wheels a part's process imported (imported_wheels), which its report lists.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from gpu_check_fixtures import ROOT

# What each part imports beyond the standard library, torch and the tree itself (which travels as
# files), by distribution name; what a bare GPU machine lacks is these and what they require
# (wheels()). tests/trainer/test_gpu_check.py runs the trainer's parts on an interpreter that has
# only torch and these, and checks that each part imports every name listed.
_MODEL = ("numpy", "pyyaml", "safetensors", "transformers")
_GRPC = ("grpcio", "grpcio-health-checking", "protobuf")
NEEDS = {
    "trainer": _MODEL,
    "logprobs": _MODEL,
    # its own process imports only these; the five services it starts need the project's
    # dependencies (pyproject.toml's, the train extra's): see wheels()
    "services": _MODEL,
    "push": (*_MODEL, *_GRPC, "xxhash"),  # the weight push digests with XXH3
    # vLLM itself is not carried (the rollout image has it): the part is skipped where it is not
    "vllm": (*_MODEL, *_GRPC, "xxhash"),
    "two_gpu": (*_MODEL, *_GRPC, "xxhash"),
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def closure(names) -> set[str]:
    """`names` and every distribution they require, transitively (extras left out; only what is
    installed here counts, which also drops requirements for other platforms and Pythons)."""
    seen, todo = set(), [_canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or not _installed(name):
            continue
        seen.add(name)
        for req in importlib.metadata.requires(name) or []:
            if "extra ==" not in req:
                todo.append(_canonical(re.match(r"[A-Za-z0-9._-]+", req).group()))
    return seen


def bare_machine() -> set[str]:
    """torch and everything it requires: what a GPU machine with torch installed already has."""
    return closure(["torch"])


def imported_wheels() -> list[str]:
    """The distributions this process has imported from, beyond the bare machine's and the tree's
    (optional imports included: a library imports what it finds installed)."""
    owners = importlib.metadata.packages_distributions()
    tops = {m.split(".")[0] for m in list(sys.modules)}
    names = {_canonical(d) for t in tops for d in owners.get(t, ())}
    return sorted(names - bare_machine() - {"atgrpo"})


def project_dependencies() -> list[str]:
    """The distributions the five services need: pyproject.toml's dependencies and the train
    extra's, torch left out."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = (*project["dependencies"], *project["optional-dependencies"]["train"])
    return [
        n
        for n in (_canonical(re.match(r"[A-Za-z0-9._-]+", d).group()) for d in deps)
        if n != "torch"
    ]


def wheels() -> dict[str, list[str]]:
    """What to carry to a bare GPU machine, per part, with what those require."""
    bare = bare_machine()
    return {
        **{p: sorted(closure(NEEDS[p]) - bare) for p in NEEDS},  # NEEDS names every part
        "services": sorted(closure([*project_dependencies(), *NEEDS["services"]]) - bare),
    }


def missing_wheels(part: str) -> list[str]:
    """What `part` needs that is not installed here (the services: the project's dependencies)."""
    needs = [*NEEDS[part], *(project_dependencies() if part == "services" else ())]
    return [d for d in dict.fromkeys(needs) if not _installed(d)]
