"""docker/: the Dockerfiles parse and follow the image rules (pinned bases, non-root, health
check, small layers, a tight build context), and what they run exists and starts from the
installed package. Nothing can be pulled here, so no image is built."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import tomllib

import pytest

from tests.helm.conftest import ROOT, SERVICE_MODULES
from tests.helm.dockerfile import DockerfileError, expand, parse

DOCKER = ROOT / "docker"
IMAGES = {
    "cpu": "cpu.Dockerfile",
    "rollout-gpu": "rollout-gpu.Dockerfile",
    "trainer-gpu": "trainer-gpu.Dockerfile",
}
UID = "10001"


def dockerfile(name: str):
    return parse((DOCKER / IMAGES[name]).read_text())


def test_one_dockerfile_per_image():
    assert sorted(p.name for p in DOCKER.glob("*.Dockerfile")) == sorted(IMAGES.values())


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_parses(image):
    df = dockerfile(image)
    assert df.directives.get("syntax", "").startswith("docker/dockerfile:")
    assert [s[0].name for s in df.stages()] == ["FROM", "FROM"]  # build stage + runtime stage


@pytest.mark.parametrize(
    "text, message",
    [
        ("FROM a:1\nRUNN true\n", "unknown instruction 'RUNN'"),
        ('FROM a:1\nCMD ["python", "-m"\n', "CMD JSON form does not parse"),
        ("FROM a:1\nRUN true \\\n", "ends inside a line continuation"),
        ("RUN true\n", "must start with FROM"),
    ],
)
def test_the_reader_rejects_broken_files(text, message):
    with pytest.raises(DockerfileError, match=message):
        parse(text)


@pytest.mark.parametrize("image", IMAGES)
def test_bases_are_pinned(image):
    df = dockerfile(image)
    args = df.global_args()
    for stage in df.stages():
        ref = expand(stage[0].args.split()[0], args)
        name, _, digest = ref.partition("@")
        repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
        assert digest.startswith("sha256:") or re.fullmatch(r"\d+\.\d+\.\d+[-\w.]*", tag), (
            f"{IMAGES[image]}: base {ref!r} is not pinned to an exact version tag or a digest"
        )
        assert tag != "latest"


@pytest.mark.parametrize("image", IMAGES)
def test_runtime_stage_is_non_root_with_a_health_check(image):
    final = dockerfile(image).stages()[-1]
    names = [i.name for i in final]
    users = [i for i in final if i.name == "USER"]
    assert users and users[-1].args == f"{UID}:{UID}"  # numeric: runAsNonRoot can verify it
    assert names.index("USER") < names.index("CMD") and names.index("USER") < names.index(
        "ENTRYPOINT"
    )
    [health] = [i for i in final if i.name == "HEALTHCHECK"]
    assert health.exec_form == ["python", "/usr/local/bin/atgrpo-healthcheck"]
    assert {"interval", "timeout", "start-period", "retries"} <= set(health.flags)
    run_text = " ".join(i.args for i in final if i.name == "RUN")
    assert f"useradd --uid {UID}" in run_text
    # tools that build stay in the build stage; the runtime stage only copies the venv
    assert "pip install" not in run_text
    assert any(
        i.name == "COPY" and i.flags.get("from") == "build" and i.args == "/opt/venv /opt/venv"
        for i in final
    )


@pytest.mark.parametrize("image", IMAGES)
def test_layers_stay_small(image):
    df = dockerfile(image)
    for stage in df.stages():
        env = " ".join(i.args for i in stage if i.name == "ENV")
        for ins in stage:
            if ins.name != "RUN":
                continue
            if "apt-get install" in ins.args:
                assert "--no-install-recommends" in ins.args, f"line {ins.line}"
                assert "apt-get update" in ins.args and "rm -rf /var/lib/apt/lists/*" in ins.args, (
                    f"line {ins.line}: update, install and clean the lists in one layer"
                )
            if "pip install" in ins.args:
                assert "--no-cache-dir" in ins.args or "PIP_NO_CACHE_DIR=1" in env, (
                    f"line {ins.line}"
                )
    # dependencies install before the source is copied, so a code change reuses that layer
    build = df.stages()[0]
    copies = [i for i in build if i.name == "COPY"]
    # pyproject.toml, the image's constraints files (tests/helm/test_image_deps.py checks which)
    # and requirements.py, nothing that changes with the code
    first = copies[0].args.split()[:-1]
    assert first[0] == "pyproject.toml" and first[-1] == "docker/requirements.py"
    assert all(re.fullmatch(r"(docker/)?[\w-]+\.txt", f) for f in first[1:-1]), first
    assert copies[-1].args == ". ."
    install_deps = next(i for i in build if i.name == "RUN" and "-r requirements.txt" in i.args)
    assert build.index(copies[0]) < build.index(install_deps) < build.index(copies[-1])


# ---- the build context --------------------------------------------------------------------


def ignore_patterns(image: str) -> list[str]:
    text = (DOCKER / f"{IMAGES[image]}.dockerignore").read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def in_context(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(p.split("/")[-1], pat[3:]) for p in candidates)
        else:
            hit = any(
                fnmatch.fnmatchcase(p, pat) and p.count("/") == pat.count("/") for p in candidates
            )
        if hit:
            keep = negate
    return keep


def test_dockerignores_are_equal_allowlists():
    texts = {(DOCKER / f"{f}.dockerignore").read_text() for f in IMAGES.values()}
    assert len(texts) == 1
    assert ignore_patterns("cpu")[0] == "*"


@pytest.mark.parametrize("image", IMAGES)
def test_build_context_holds_the_sources_and_nothing_else(image):
    patterns = ignore_patterns(image)
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    context = {p for p in tracked if in_context(p, patterns)}
    for needed in (
        "pyproject.toml",
        "constraints.txt",
        "docker/constraints-rollout-gpu.txt",
        "docker/cuda.txt",
        "README.md",
        "docker/requirements.py",
        "docker/healthcheck.py",
        "atgrpo/__init__.py",
        "atgrpo/_proto/v1/env_pb2.py",
        "atgrpo/models/corpus",
        *(f"{m}/__main__.py" for m in SERVICE_MODULES),
    ):
        assert any(p == needed or p.startswith(needed + "/") for p in context), (
            f"{needed} is not in the context"
        )
    for outside in (
        "tests/",
        "helm/",
        "bench/",
        "examples/",
        ".venv/",
        ".git/",
        ".atgrpo/",
        "docs/",
    ):
        assert not any(p.startswith(outside) for p in context), f"{outside} is in the build context"
    assert not in_context(".venv/bin/python", patterns) and not in_context(
        "atgrpo/__pycache__/x.pyc", patterns
    )
    # every COPY source from the context is in it
    for ins in dockerfile(image).instructions:
        if ins.name == "COPY" and "from" not in ins.flags:
            for src in ins.args.split()[:-1]:
                assert src == "." or (ROOT / src).exists() and in_context(src, patterns), (
                    f"COPY {src}"
                )


# ---- what the images run --------------------------------------------------------------------


def exec_commands(image: str) -> list[list[str]]:
    final = dockerfile(image).stages()[-1]
    return [i.exec_form for i in final if i.name in ("CMD", "ENTRYPOINT", "HEALTHCHECK")]


@pytest.mark.parametrize("image", IMAGES)
def test_commands_exist(image, service_help):
    text = (DOCKER / IMAGES[image]).read_text()
    for cmd in exec_commands(image):
        if cmd[0] == "/usr/bin/tini":
            assert re.search(r"apt-get install[^\n]* tini", text), "tini is run but not installed"
        elif cmd[:2] == ["python", "-m"]:
            module, flags = cmd[2], [a for a in cmd[3:] if a.startswith("--")]
            assert module in SERVICE_MODULES
            assert all(f in service_help[module] for f in flags), cmd
        elif cmd[0] == "python":
            assert f"COPY docker/healthcheck.py {cmd[1]}" in text
        else:
            pytest.fail(f"{IMAGES[image]} runs {cmd}, which this test does not know")


def test_atgrpo_console_script_is_installed():
    [ep] = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "atgrpo"
    ]
    assert ep.value == "atgrpo.cli:main" and callable(ep.load())
    assert os.access(os.path.join(os.path.dirname(sys.executable), "atgrpo"), os.X_OK)


@pytest.mark.parametrize("module", ["env_svc", "sandbox_svc"])
def test_services_start_as_processes(module):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--metrics-port" in proc.stdout


def test_healthcheck_reports_a_live_server_and_a_dead_one(tmp_path):
    port_file = tmp_path / "port.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATGRPO_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(
        [sys.executable, "-m", "env_svc", "--port", "0", "--port-file", str(port_file)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert server.poll() is None, server.stderr.read().decode()
            assert time.monotonic() < deadline, "env_svc did not start in 30 s"
            time.sleep(0.05)
        port = json.loads(port_file.read_text())["port"]
        check = [sys.executable, str(DOCKER / "healthcheck.py")]
        up = subprocess.run(
            check, env={**env, "ATGRPO_PORT": str(port)}, capture_output=True, text=True, timeout=30
        )
        assert up.returncode == 0 and up.stdout.strip() == f"localhost:{port}: SERVING"
    finally:
        server.terminate()
        server.wait(timeout=30)
    down = subprocess.run(
        check, env={**env, "ATGRPO_PORT": str(port)}, capture_output=True, text=True, timeout=30
    )
    assert down.returncode == 1 and "UNAVAILABLE" in down.stdout


def test_requirements_script_lists_core_and_extras():
    script = DOCKER / "requirements.py"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = subprocess.run(
        [sys.executable, str(script), "--pyproject", str(ROOT / "pyproject.toml"), "train", "vllm"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    extras = project["optional-dependencies"]
    # Each requirement once, in order: train and vllm both take xxhash (pushes are sent and
    # checked).
    want = list(dict.fromkeys(project["dependencies"] + extras["train"] + extras["vllm"]))
    assert out == want and len(want) < len(project["dependencies"]) + len(extras["train"]) + len(
        extras["vllm"]
    )
    bad = subprocess.run(
        [sys.executable, str(script), "--pyproject", str(ROOT / "pyproject.toml"), "gpu"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "no extra gpu in pyproject.toml" in bad.stderr
