"""No secret of a service's environment reaches sandboxed code, and the sandbox issue's hostile
programs, sent as a coder's answer through env_svc's `code` environment to sandbox_svc (both real
processes holding the auth token and a planted secret), are contained end to end."""

import asyncio

import pytest

from atgrpo.sdk.client import EnvClient
from sandbox_svc.client import SandboxClient
from tests.sandbox import hostile
from tests.security.conftest import TOKEN, start_service

SECRETS = {"ATGRPO_AUTH_TOKEN": TOKEN, hostile.SECRET_VAR: hostile.SECRET_VALUE}
SUM = "train-sum-two"
RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"


def probe(token_file: str) -> str:
    """Everything a program could read the environment from: its own, pid 1's, its parent's,
    every process it can see, and the token file itself."""
    return f"""
import glob, os
out = ["ENV " + repr(dict(os.environ))]
paths = ["/proc/self/environ", "/proc/1/environ", "/proc/%d/environ" % os.getppid(), "/proc/1/cmdline",
         *glob.glob("/proc/[0-9]*/environ"), *glob.glob("/proc/[0-9]*/cmdline"), {token_file!r},
         "/run/secrets", "/var/run/secrets"]
for path in sorted(set(paths)):
    try:
        out.append(path + " " + repr(open(path, "rb").read()))
    except Exception as e:
        out.append(path + " refused " + type(e).__name__)
print("\\n".join(out))
"""  # noqa: E501


SEARCH = """
import glob, os
found = [k for k in os.environ if k.startswith("ATGRPO") or "SECRET" in k]
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    if b"ATGRPO_AUTH_TOKEN" in data or b"ATGRPO_TEST_SECRET" in data:
        found.append(path)
raise SystemExit("leaked " + repr(found) if found else "clean")
"""


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secrets")
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    env = SECRETS | {"ATGRPO_AUTH_TOKEN_FILE": str(token_file)}
    sandbox = start_service("sandbox", tmp, [], env)
    try:
        envsvc = start_service("env", tmp, ["--sandbox", sandbox.address], env)
    except BaseException:
        sandbox.stop()
        raise
    yield {"sandbox": sandbox, "env": envsvc, "token_file": str(token_file)}
    envsvc.stop()
    sandbox.stop()


def test_no_secret_of_the_sandbox_service_reaches_sandboxed_code(services, client_env):
    client_env({})

    async def go():
        async with SandboxClient(services["sandbox"].address) as c:
            return await c.execute(probe(services["token_file"]))

    r = asyncio.run(go())
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert "ENV {" in out and "/proc/self/environ" in out, out  # the probe ran
    assert f"{services['token_file']} refused" in out
    for name, value in SECRETS.items():
        assert value not in out, f"{name}'s value reached sandboxed code:\n{out}"
        assert name not in out, f"{name} is visible to sandboxed code:\n{out}"
    log = services["sandbox"].log_text()
    assert TOKEN not in log and hostile.SECRET_VALUE not in log


# (program, what the coder's step must show): each runs as the coder's answer to a real task.
CASES = {
    "fork bomb": (hostile.FORK_BOMB, lambda v: "ok" not in v),
    "memory bomb": (hostile.MEMORY_BOMB, lambda v: "memory_limit" in v),
    "infinite loop": (hostile.INFINITE_LOOP, lambda v: "timeout" in v),
    "sleep forever": (hostile.SLEEP_FOREVER, lambda v: "timeout" in v),
    "output flood": (hostile.OUTPUT_FLOOD, lambda v: "output_limit" in v),
    "read /etc/shadow": (hostile.READ_SHADOW, lambda v: "runtime_error" in v),
    "kill the parent": (hostile.KILL_PARENT, lambda v: "ok" in v),
    "tamper with pid 1": (hostile.TAMPER_WITH_PID1, lambda v: "ok" in v),
    "leave a daemon": (hostile.LEAVE_DAEMON, lambda v: "ok" in v),
    "write outside /tmp": (hostile.WRITE_OUTSIDE_TMP, lambda v: "ok" in v),
}


def test_hostile_programs_through_the_code_environment_are_contained(services, client_env):
    client_env({})

    async def step(env: EnvClient, code: str):
        episode, _ = await env.reset("code", SUM, seed=0, options={"case_timeout_s": 1.0})
        try:
            return await env.step(episode, "coder", f"```python\n{code}```")
        finally:
            await env.close_episodes([episode])

    async def go():
        async with EnvClient(services["env"].address, timeout_s=120) as env:
            for name, (code, contained) in CASES.items():
                result = await step(env, code)
                verdicts = result.info.get("verdicts", {})
                assert not result.success and contained(verdicts), (name, result.info)
            leak = await step(env, SEARCH)
            assert leak.info.get("error") == "clean", leak.info
            right = await step(env, RIGHT)  # the sandbox serves on, unharmed
            assert right.success and right.local_reward > 0, right.info
            assert await env.health() == "SERVING"

    asyncio.run(go())
    for proc in ("sandbox", "env"):
        assert services[proc].proc.poll() is None, f"{proc} died"
        log = services[proc].log_text()
        assert TOKEN not in log and hostile.SECRET_VALUE not in log
