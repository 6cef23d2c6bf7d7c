"""Agent programs as a user writes them: plain functions that call roles through an openai client,
made environments with program_env. A toy task: add two digits; the "tool" role computes the sum,
the "reasoner" answers given what the tool said."""

import asyncio
import itertools

from atgrpo.sdk.program import Outcome, program_env

TASKS = {"train": [(1, 2), (3, 4), (2, 5)], "eval": [(4, 4)]}
ROLES = {"agents": ("tool", "reasoner"), "turn_order": ("tool", "reasoner")}


def tasks(split):
    return TASKS[split]


def _ask(role, text):
    return {"model": role, "messages": [{"role": "user", "content": text}]}


def _text(response):
    return response.choices[0].message.content.strip()


async def add_async(task, client):
    """Two digits, added by a tool role and checked by a reasoner role."""
    a, b = task.data
    tool = _text(await client.chat.completions.create(**_ask("tool", f"Compute {a}+{b}.")))
    task.reward("tool", 1.0 if tool == str(a + b) else 0.0)
    asked = f"What is {a}+{b}? The tool says {tool}."
    answer = _text(await client.chat.completions.create(**_ask("reasoner", asked)))
    right = answer == str(a + b)
    task.reward("reasoner", 0.5 if right else 0.0)
    return 1.0 if right else 0.0


def add_sync(task, client):
    """The same program, synchronous: it runs on a thread, with a blocking client."""
    a, b = task.data
    tool = _text(client.chat.completions.create(**_ask("tool", f"Compute {a}+{b}.")))
    task.reward("tool", 1.0 if tool == str(a + b) else 0.0)
    asked = f"What is {a}+{b}? The tool says {tool}."
    answer = _text(client.chat.completions.create(**_ask("reasoner", asked)))
    right = answer == str(a + b)
    task.reward("reasoner", 0.5 if right else 0.0)
    return 1.0 if right else 0.0


AddAsync = program_env("add_async", add_async, max_turns=2, tasks=tasks, **ROLES)
AddSync = program_env("add_sync", add_sync, max_turns=2, tasks=tasks, **ROLES)


async def look_twice(task, client):
    """The tool looks up each digit (two calls) before the reasoner answers: the reasoner is
    skipped in the first turn."""
    a, b = task.data
    seen = [
        _text(await client.chat.completions.create(**_ask("tool", f"Look up {x}."))) for x in (a, b)
    ]
    answer = _text(await client.chat.completions.create(**_ask("reasoner", f"Add {seen}.")))
    return Outcome(team=1.0 if answer == str(a + b) else 0.0, roles={"reasoner": 0.25})


LookTwice = program_env("look_twice", look_twice, max_turns=3, tasks=tasks, **ROLES)

_counter = itertools.count()


async def counting(task, client):
    """Not a program atgrpo can fork: its prompt shows a global counter, new in every run."""
    await client.chat.completions.create(**_ask("tool", f"Run {next(_counter)}: compute."))
    await client.chat.completions.create(**_ask("reasoner", "Answer."))
    return 0.0


Counting = program_env("counting", counting, max_turns=2, tasks=tasks, **ROLES)


def _returning(value):
    async def program(task, client):
        await client.chat.completions.create(**_ask("tool", "Compute."))
        if isinstance(value, Exception):
            raise value
        return value

    return program


Raises = program_env("raises", _returning(KeyError("no digits")), max_turns=2, tasks=tasks, **ROLES)
ReturnsNan = program_env("returns_nan", _returning(float("nan")), max_turns=2, tasks=tasks, **ROLES)
ReturnsText = program_env("returns_text", _returning("1.0"), max_turns=2, tasks=tasks, **ROLES)
ReturnsTooMuch = program_env("returns_2", _returning(2.0), max_turns=2, tasks=tasks, **ROLES)


async def stalls(task, client):
    await asyncio.sleep(3600)


Stalls = program_env("stalls", stalls, max_turns=2, tasks=tasks, timeout_s=0.3, **ROLES)


async def gathers(task, client):
    """Asks both roles at once, the reasoner's call issued first."""
    both = await asyncio.gather(
        client.chat.completions.create(**_ask("reasoner", "Guess the sum.")),
        client.chat.completions.create(**_ask("tool", "Compute the sum.")),
    )
    return 1.0 if [_text(r) for r in both] == ["3", "3"] else 0.0


# settle_s: the two calls must both arrive before one is served, on a loaded machine too
Gathers = program_env("gathers", gathers, max_turns=2, tasks=tasks, settle_s=0.2, **ROLES)


async def via_base_url(task, client):
    """Calls through a client of its own on task.base_url, as an agent framework would."""
    import openai

    own = openai.AsyncOpenAI(base_url=task.base_url, api_key="any", max_retries=0)
    try:
        models = [m.id for m in (await own.models.list()).data]
        said = _text(await own.chat.completions.create(**_ask("tool", f"Models: {models}.")))
    finally:
        await own.close()
    return 1.0 if said == "ok" else 0.0


ViaBaseUrl = program_env("via_base_url", via_base_url, max_turns=2, tasks=tasks, **ROLES)


async def streams(task, client):
    await client.chat.completions.create(**_ask("tool", "Compute."), stream=True)


async def calls_a_stranger(task, client):
    await client.chat.completions.create(**_ask("gpt-4", "Compute."))


Streams = program_env("streams", streams, max_turns=2, tasks=tasks, **ROLES)
CallsAStranger = program_env("stranger", calls_a_stranger, max_turns=2, tasks=tasks, **ROLES)


def _sum_by_code(task, printed):
    a, b = task.data
    right = printed.strip() == str(a + b)
    task.reward("tool", 1.0 if right else 0.0)
    return 1.0 if right else 0.0


async def code_async(task, client):
    """The tool writes code; the program runs it in the sandbox, never itself."""
    a, b = task.data
    code = _text(await client.chat.completions.create(**_ask("tool", f"Print {a}+{b} in Python.")))
    ran = await task.sandbox.execute(code)
    return _sum_by_code(task, ran.stdout.decode())


def code_sync(task, client):
    """The same; in a plain program task.sandbox blocks."""
    a, b = task.data
    code = _text(client.chat.completions.create(**_ask("tool", f"Print {a}+{b} in Python.")))
    return _sum_by_code(task, task.sandbox.execute(code).stdout.decode())


CodeAsync = program_env("code_async", code_async, max_turns=1, tasks=tasks, **ROLES)
CodeSync = program_env("code_sync", code_sync, max_turns=1, tasks=tasks, **ROLES)

_runs = itertools.count()


async def every_other_run(task, client):
    """Not replayable either: every other run it gives up before its first call."""
    if next(_runs) % 2:
        raise RuntimeError("gave up")
    await client.chat.completions.create(**_ask("tool", "Compute."))
    await client.chat.completions.create(**_ask("reasoner", "Answer."))
    return 0.0


EveryOtherRun = program_env("every_other_run", every_other_run, max_turns=2, tasks=tasks, **ROLES)


async def reasoner_first(task, client):
    """Calls the reasoner before the tool: the tool is skipped in the first turn."""
    a, b = task.data
    guess = _text(await client.chat.completions.create(**_ask("reasoner", f"Guess {a}+{b}.")))
    tool = _text(await client.chat.completions.create(**_ask("tool", f"Check {guess}.")))
    task.reward("tool", 1.0 if tool == str(a + b) else 0.0)
    return 1.0 if guess == str(a + b) else 0.0


ReasonerFirst = program_env("reasoner_first", reasoner_first, max_turns=2, tasks=tasks, **ROLES)


def seeded_task(task_id, seed, split):
    """Tasks from seeds: the digits drawn from (split, seed)."""
    from atgrpo.sdk import task_rng

    rng = task_rng(split, seed)
    return rng.randint(0, 9), rng.randint(0, 9)


Seeded = program_env("seeded", add_async, max_turns=2, make_task=seeded_task, **ROLES)
