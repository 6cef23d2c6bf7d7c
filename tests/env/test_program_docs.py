"""The agent program of docs/environments.md ("Agent programs"), taken from the page itself: it
keeps every rule of `atgrpo env check`, and `atgrpo env serve` serves it in its own process."""

import asyncio
import importlib.util
import json
import re
import subprocess
import sys

from atgrpo.sdk.check import check_env
from atgrpo.sdk.client import EnvClient
from tests.conftest import ROOT
from tests.env.test_docs_example import wait_for_port

DOC = ROOT / "docs" / "environments.md"


def _example(where):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (where / "add_doc.py").write_text(next(b for b in blocks if "program_env(" in b))
    spec = importlib.util.spec_from_file_location("add_doc", where / "add_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Add


def test_the_docs_program_keeps_every_rule(tmp_path):
    report = check_env(_example(tmp_path), examples=["3", "7"])
    assert report.ok and report.findings == [], report.render()


def test_the_docs_program_is_served_by_atgrpo_env_serve(tmp_path):
    _example(tmp_path)
    port_file = tmp_path / "port.json"
    env = {
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "PATH": "/usr/bin:/bin",
        "ATGRPO_LOG_LEVEL": "WARNING",
    }
    command = ["env", "serve", "add_doc:Add", "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "atgrpo.cli", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(proc, port_file)

        async def play(address):
            async with EnvClient(address) as envs:
                ep, spec = await envs.reset("add", "1", seed=0, split="train")  # 3 + 4
                asked, _ = await envs.observe(ep, "tool")
                tool = await envs.step(ep, "tool", "7")
                (fork,) = await envs.fork(ep, 1)
                shown, _ = await envs.observe(fork, "reasoner")  # the fork replays the tool's 7
                last = await envs.step(fork, "reasoner", "7")
                await envs.close_episodes([ep, fork])
                return spec.agents, asked, tool.local_reward, shown, last

        agents, asked, paid, shown, last = asyncio.run(
            play(f"127.0.0.1:{json.loads(port_file.read_text())['port']}")
        )
        assert agents == ("tool", "reasoner")
        assert asked == [{"role": "user", "content": "Compute 3+4."}] and paid == 1.0
        assert shown == [{"role": "user", "content": "What is 3+4? The tool says 7."}]
        assert (last.team_reward, last.done, last.success) == (1.0, True, True)
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()
