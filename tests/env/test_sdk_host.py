"""The EnvService over real gRPC: episodes, forks, the bounded store, and the error codes."""

import asyncio
import time

import pytest

from atgrpo import errors
from atgrpo.rpc.server import create_server
from atgrpo.sdk.client import EnvClient
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry, load_class
from atgrpo.sdk.servicer import env_bindings
from atgrpo.sdk.store import EpisodeStore
from tests.env.sdk_envs import CarelessEnv, CounterEnv, FiniteEnv, SlowEnv


def registry():
    r = Registry(discover=False)
    for cls in (CounterEnv, SlowEnv, FiniteEnv, CarelessEnv):
        r.register(cls)
    return r


def with_client(fn, **store_kw):
    async def go():
        host = EnvHost(registry(), store=EpisodeStore(**store_kw))
        running = await create_server(env_bindings(host))
        try:
            async with EnvClient(f"127.0.0.1:{running.port}") as c:
                return await fn(c, host)
        finally:
            await running.stop(0)

    return asyncio.run(go())


def test_an_episode_over_grpc():
    async def go(c, host):
        specs = {s.name: s for s in await c.list_envs()}
        assert set(specs) == {"counter", "slow", "finite", "careless"} and specs[
            "counter"
        ].turn_order == ("a", "b")
        ep, spec = await c.reset("counter", "t", seed=3, split="train", options={"max_turns": 2})
        assert spec.max_turns == 2
        messages, turn = await c.observe(ep, "a")
        assert turn == 0 and messages[0]["role"] == "user" and "total 0" in messages[0]["content"]
        r = await c.step(ep, "a", "2")
        assert (r.team_reward, r.local_reward, r.done, r.turn) == (0.0, 0.1, False, 0)
        bad = await c.step(ep, "b", "two")
        assert (
            bad.local_reward == -1.0 and "not a number" in bad.info["parse_error"] and bad.turn == 0
        )
        assert (await c.observe(ep, "a"))[1] == 1
        assert await c.close_episodes([ep, "unknown"]) == 1
        with pytest.raises(errors.NotFound, match="Reset a new one"):
            await c.observe(ep, "a")

    with_client(go)


def test_same_seed_same_task_and_splits_differ():
    async def go(c, host):
        async def tasks(split):  # the counter's target is drawn from (split, seed): one of 5
            seen = []
            for seed in range(8):
                ep, _ = await c.reset("counter", "t", seed=seed, split=split)
                seen.append((await c.observe(ep, "a"))[0][0]["content"])
            return seen

        train = await tasks("train")
        assert await tasks("train") == train
        assert await tasks("eval") != train
        assert len(set(train)) > 1  # the seed draws too

    with_client(go)


def test_forks_are_independent_and_keep_the_turn():
    async def go(c, host):
        ep, _ = await c.reset("counter", "t", seed=0, split="train")
        await c.step(ep, "a", "1")
        forks = await c.fork(ep, 3)
        assert len(set(forks)) == 3 and ep not in forks
        await c.step(forks[0], "b", "1")
        await c.step(forks[1], "b", "2")
        origin = (await c.observe(ep, "a"))[0][0]["content"]
        assert "total 1," in origin
        assert "total 2," in (await c.observe(forks[0], "a"))[0][0]["content"]
        assert "total 3," in (await c.observe(forks[1], "a"))[0][0]["content"]
        assert (await c.observe(forks[2], "a"))[0][0]["content"] == origin
        assert (await c.observe(forks[0], "a"))[1] == 1  # a and b acted: turn 1 began
        assert (await c.observe(ep, "a"))[1] == 0

    with_client(go)


def test_episode_ends_at_done_or_max_turns():
    async def go(c, host):
        ep, _ = await c.reset("counter", "t", seed=0, split="train", options={"max_turns": 1})
        await c.step(ep, "a", "1")
        r = await c.step(ep, "b", "1")
        assert r.done and not r.success  # the env did not say done, but one turn was the limit
        with pytest.raises(errors.FailedPrecondition, match="is done"):
            await c.step(ep, "a", "1")
        ep2, _ = await c.reset("counter", "t", seed=0, split="train")
        r = await c.step(ep2, "a", "99")
        assert r.done and not r.success and r.team_reward == 1.0
        with pytest.raises(errors.FailedPrecondition):
            await c.step(ep2, "b", "1")

    with_client(go)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda c, ep: c.reset("nope", "t", 0),
            errors.NotFound,
            "no environment named 'nope'; available: careless, counter",
        ),
        (
            lambda c, ep: c.reset("counter", "t", 0, split="test"),
            errors.InvalidArgument,
            "no split 'test'",
        ),
        (lambda c, ep: c.observe(ep, "zed"), errors.InvalidArgument, "no agent 'zed'"),
        (lambda c, ep: c.step(ep, "zed", "1"), errors.InvalidArgument, "no agent 'zed'"),
        (
            lambda c, ep: c.step(ep, "a", "1" * (2 << 20)),
            errors.InvalidArgument,
            "cap the agent's max_tokens",
        ),
        (lambda c, ep: c.fork(ep, 0), errors.InvalidArgument, "between 1 and"),
        (lambda c, ep: c.fork("missing", 2), errors.NotFound, "no live episode 'missing'"),
        (lambda c, ep: c.observe("", "a"), errors.InvalidArgument, "episode_id is empty"),
        (lambda c, ep: c.describe(""), errors.InvalidArgument, "env is empty"),
    ],
)
def test_bad_requests_get_their_codes(call, error, message):
    async def go(c, host):
        ep, _ = await c.reset("counter", "t", 0)
        with pytest.raises(error) as err:
            await call(c, ep)
        assert message in err.value.message
        assert (await c.observe(ep, "a"))[1] == 0  # still serving, episode intact

    with_client(go)


def test_the_store_is_bounded_and_abandoned_episodes_expire():
    async def go(c, host):
        ep, _ = await c.reset("counter", "t", 0)
        await c.fork(ep, 3)
        c.retry = False  # see the refusal, not the client's backoff until the deadline
        with pytest.raises(errors.ResourceExhausted, match="cap is 5") as err:
            await c.fork(ep, 2)
        assert err.value.retry_after_ms
        assert len(host.store) == 4  # the refused fork added nothing
        await c.reset("counter", "t", 0)
        later = time.monotonic() + host.store.ttl_s + 1  # when every episode is past its TTL
        assert host.store.expire(now=later) == 5
        with pytest.raises(errors.NotFound, match="expired"):
            await c.observe(ep, "a")

    with_client(go, max_episodes=5)


def test_calls_on_one_episode_are_serialised():
    async def go(c, host):
        ep, _ = await c.reset("slow", "t", 0)
        results = await asyncio.gather(*(c.step(ep, "a" if i % 2 else "b", "1") for i in range(10)))
        return results, host.store.get(ep).env

    results, env = with_client(go)
    assert len(results) == 10 and env.steps == 10  # every call was answered and ran its step
    assert env.most_inside == 1  # one at a time, though all were sent at once


def test_a_synchronous_step_runs_off_the_event_loop():
    """A plain `def step` that blocks for 0.5 s: meanwhile health checks answer and another
    episode's async step runs."""

    async def go(c, host):
        blocked, _ = await c.reset("careless", "t", 0, options={"mode": "step_blocks"})
        other, _ = await c.reset("slow", "t", 0)
        start = time.perf_counter()
        step = asyncio.create_task(c.step(blocked, "a", "1"))
        await asyncio.sleep(0.1)
        assert await c.health() == "SERVING" and not step.done()
        await c.step(other, "a", "1")
        answered = time.perf_counter() - start
        assert (await step).local_reward == 0.1
        return answered, time.perf_counter() - start

    answered, blocked = with_client(go)
    assert answered < 0.4 <= blocked


def test_finite_task_lists_page():
    async def go(c, host):
        assert await c.list_tasks("finite", "eval", offset=1, limit=2) == (["eval-1", "eval-2"], 5)
        assert await c.list_tasks("counter", "train") == ([], -1)

    with_client(go)


def test_load_class_errors_name_the_fix():
    with pytest.raises(errors.InvalidArgument, match="package.module:ClassName"):
        load_class("no_colon")
    with pytest.raises(errors.NotFound, match="Install the package that holds it"):
        load_class("no.such.module:Env")
    with pytest.raises(errors.InvalidArgument, match="not a subclass"):
        load_class("time:sleep")


def test_store_ids_are_unique_and_not_reused():
    store = EpisodeStore(max_episodes=10)
    env = CounterEnv()
    ids = {e.id for _ in range(5) for e in store.add("counter", env)}
    store.remove(list(ids))
    assert not ids & {e.id for e in store.add("counter", env, count=3)}


def test_installed_packages_add_environments_through_entry_points(tmp_path, monkeypatch):
    dist = tmp_path / "third_party_envs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: third-party-envs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[atgrpo.envs]\ncounter_plus = tests.env.sdk_envs:CounterEnv\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    shipped = set(Registry({}).names()) - {"counter_plus"}  # atgrpo's own, entry points too
    assert {"toy", "sokoban", "code"} <= shipped
    reg = Registry({"builtin": "tests.env.sdk_envs:SlowEnv"})
    assert reg.names() == sorted({"builtin", "counter_plus"} | shipped)
    assert reg.get("counter_plus") is CounterEnv
    assert Registry({}, discover=False).names() == []


@pytest.mark.parametrize(
    "mode, call, message",
    [
        (
            "step_raises",
            "step",
            r"env 'careless' \(tests\.env\.sdk_envs\.CarelessEnv\): step\('a', ...\) raised "
            r"ValueError: boom in step\. This is a bug in the environment",
        ),
        ("nan_reward", "step", "team_reward=nan; rewards must be finite numbers"),
        ("inf_reward", "step", "team_reward=inf"),
        ("str_reward", "step", "team_reward='1.0'"),
        ("observe_str", "observe", "observe\\(\\) must return a list"),
        ("reset_raises", "reset", r"reset\('t', 0, 'train'\) raised ZeroDivisionError"),
        (
            "init_raises",
            "reset",
            r"CarelessEnv\(options\) raised RuntimeError: cannot open the puzzle file",
        ),
        ("no_spec", "reset", r"must set self.spec = EnvSpec"),
    ],
)
def test_an_environments_own_bugs_are_named_as_such_and_not_retryable(mode, call, message):
    """Not INTERNAL "a bug in atgrpo": UNKNOWN, as EnvCodeError, naming the env and the call."""

    async def go(c, host):
        with pytest.raises(errors.EnvCodeError, match=message) as err:
            ep, _ = await c.reset("careless", "t", seed=0, split="train", options={"mode": mode})
            if call == "observe":
                await c.observe(ep, "a")
            else:
                await c.step(ep, "a", "1")
        assert not err.value.retryable
        # The host keeps serving: a sound episode of the same env works.
        ep, _ = await c.reset("careless", "t", seed=0, split="train")
        assert (await c.step(ep, "a", "1")).local_reward == 0.1

    with_client(go)


def test_numpy_rewards_are_numbers():
    async def go(c, host):
        ep, _ = await c.reset(
            "careless", "t", seed=0, split="train", options={"mode": "numpy_reward"}
        )
        r = await c.step(ep, "a", "1")
        assert (r.team_reward, r.local_reward) == (0.5, 1.0)

    with_client(go)


def test_options_an_env_refuses_are_invalid_argument():
    async def go(c, host):
        with pytest.raises(errors.InvalidArgument, match="could not be built with options"):
            await c.reset("counter", "t", seed=0, split="train", options={"max_turns": 0})

    with_client(go)


def test_step_many_steps_each_branch_in_one_call():
    async def go(c, host):
        ep, _ = await c.reset("counter", "t", seed=0, split="train")
        branches = await c.fork(ep, 3)
        results = await c.step_many([(b, "a", str(i + 1)) for i, b in enumerate(branches)])
        assert [r.turn for r in results] == [0, 0, 0] and all(
            r.local_reward == 0.1 for r in results
        )
        totals = [(await c.observe(b, "b"))[0][0]["content"].split(",")[0] for b in branches]
        # each in its own branch, in order
        assert totals == [
            "b: total 1",
            "b: total 2",
            "b: total 3",
        ]
        with pytest.raises(errors.NotFound):
            await c.step_many([(branches[0], "b", "1"), ("nope", "b", "1")])

    with_client(go)
