"""The environment of docs/environments.md, taken from the page itself, served by
`atgrpo env serve` in its own process, behaves exactly as the same class hosted in-process."""

import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atgrpo.rpc.server import create_server
from atgrpo.sdk.client import EnvClient
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry
from atgrpo.sdk.servicer import env_bindings
from tests.conftest import ROOT

DOC = ROOT / "docs" / "environments.md"


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    source = next(b for b in blocks if "class PairSumEnv" in b)
    where = tmp_path_factory.mktemp("docs_example")
    (where / "pair_sum.py").write_text(source)
    return where


def wait_for_port(proc: subprocess.Popen, port_file: Path) -> None:
    """Until the served process writes its port file; fails with its output if it exits first."""
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(example_dir, tmp_path_factory):
    port_file = tmp_path_factory.mktemp("port") / "port.json"
    env = {
        "PYTHONPATH": f"{example_dir}:{ROOT}",
        "PATH": "/usr/bin:/bin",
        "ATGRPO_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "atgrpo.cli",
            "env",
            "serve",
            "pair_sum:PairSumEnv",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_for_port(proc, port_file)
    yield f"127.0.0.1:{json.loads(port_file.read_text())['port']}"
    proc.terminate()
    assert proc.wait(timeout=10) == 0


def _local_class(example_dir):
    spec = importlib.util.spec_from_file_location("pair_sum_local", example_dir / "pair_sum.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PairSumEnv


async def _play(client: EnvClient) -> list:
    """One scripted session: resets, observations, good and bad steps, a fork."""
    trace = [[s.name for s in await client.list_envs()]]
    for seed in (0, 1, 2):
        ep, spec = await client.reset("pair_sum", f"t{seed}", seed=seed, split="train")
        trace.append((spec.agents, spec.turn_order, spec.max_turns))
        prompt, turn = await client.observe(ep, "first")
        target = int(re.search(r"Target (\d+)", prompt[0]["content"]).group(1))
        trace.append((prompt, turn))
        bad = await client.step(ep, "first", "many")
        trace.append((bad.team_reward, bad.local_reward, bad.info))
        first = min(9, target - 1)
        trace.append(vars(await client.step(ep, "first", str(first))))
        (branch,) = await client.fork(ep, 1)
        trace.append(vars(await client.step(branch, "second", str(target - first))))
        trace.append(vars(await client.step(ep, "second", "1")))
        trace.append(await client.observe(ep, "first"))
    return trace


def test_docs_example_served_behaves_as_hosted(served, example_dir):
    async def go():
        async with EnvClient(served) as remote:
            remote_trace = await _play(remote)
        registry = Registry(discover=False)
        registry.register(_local_class(example_dir))
        running = await create_server(env_bindings(EnvHost(registry)))
        async with EnvClient(f"127.0.0.1:{running.port}") as local:
            local_trace = await _play(local)
        await running.stop(0)
        return remote_trace, local_trace

    remote_trace, local_trace = asyncio.run(go())
    assert remote_trace == local_trace
    solved = [t for t in remote_trace if isinstance(t, dict) and t.get("success")]
    assert len(solved) >= 3  # every forked branch solved its task


def test_serving_a_bad_path_says_what_to_fix():
    out = subprocess.run(
        [sys.executable, "-m", "atgrpo.cli", "env", "serve", "nowhere:Env", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0 and "Install the package that holds it" in out.stderr


def test_the_console_script_serves_a_module_from_the_folder_it_runs_in(example_dir, tmp_path):
    """`atgrpo env serve pair_sum:PairSumEnv` in the module's folder, nothing on PYTHONPATH, as
    `atgrpo train` finds an env.path there (the console script, not `python -m`, which adds it)."""
    port_file = tmp_path / "port.json"
    script = Path(sys.executable).parent / "atgrpo"
    env = {"PATH": "/usr/bin:/bin", "ATGRPO_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [
            str(script),
            "env",
            "serve",
            "pair_sum:PairSumEnv",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        cwd=example_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_for_port(proc, port_file)
    proc.terminate()
    assert proc.wait(timeout=10) == 0


def test_the_docs_example_passes_env_check_from_its_folder(example_dir):
    """What the docs tell an author to run: `atgrpo env check pair_sum:PairSumEnv` in the folder
    that holds pair_sum.py (the console script: the folder is found as `atgrpo train` finds it)."""
    import shutil

    out = subprocess.run(
        [
            shutil.which("atgrpo") or str(Path(sys.executable).parent / "atgrpo"),
            "env",
            "check",
            "pair_sum:PairSumEnv",
        ],
        cwd=example_dir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "env 'pair_sum': ok, every rule kept" in out.stdout


def test_the_docs_demos_command_writes_the_example_s_demonstrations(example_dir, tmp_path):
    """`atgrpo model demos` as the docs give it, on the example's own demonstration(): every
    episode ends solved, so each is written, each agent's answer summing to the target."""
    import shutil

    out = tmp_path / "demos.jsonl"
    done = subprocess.run(
        [
            shutil.which("atgrpo") or str(Path(sys.executable).parent / "atgrpo"),
            "model",
            "demos",
            "--env",
            "pair_sum:PairSumEnv",
            "--episodes",
            "6",
            "--out",
            str(out),
        ],
        cwd=example_dir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 demonstrations from 6 of 6 episodes" in done.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for first, second in zip(rows[::2], rows[1::2], strict=True):
        target = int(first["messages"][0]["content"].split()[1].rstrip("."))
        assert (first["agent"], second["agent"]) == ("first", "second")
        assert int(first["response"]) + int(second["response"]) == target
