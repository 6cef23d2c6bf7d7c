"""rollout_svc's OpenAI-compatible HTTP port, driven by the real `openai` client against a real
`python -m rollout_svc` process (the tiny model, a token configured), and held against its own
gRPC Generate: the same engine, so the same seed gives the same ids and log-probs."""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
from transformers import AutoTokenizer

from atgrpo.contract.sampling import Sampling
from atgrpo.models.chat import chat_tokens
from rollout_svc.client import RolloutClient
from tests.conftest import ROOT
from tests.rollout.qwen3_style import qwen3_style_model

TOKEN = "tok-openai-3c1d9e"
POOL = "tiny"
TOOL_POOL = "qwen3"  # the tiny model with a chat template that renders tools (Qwen3's form)
HELLO = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Hi there"}]
MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the agent one cell.",
        "parameters": {"type": "object", "properties": {"dir": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def service(tiny_model, tmp_path_factory):
    """(http base url, grpc address, metrics url, the tool pool's model directory) of one rollout
    process for the module: the tiny model, and its copy whose template renders tools."""
    tmp = tmp_path_factory.mktemp("openai")
    tools_model = qwen3_style_model(tiny_model, tmp / "qwen3-style")
    port_file, log = tmp / "port.json", tmp / "rollout.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATGRPO_")}
    env |= {"PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
    env |= {"ATGRPO_AUTH_TOKEN": TOKEN, "ATGRPO_LOG_LEVEL": "WARNING"}
    argv = [sys.executable, "-m", "rollout_svc", "--pool", f"{POOL}={tiny_model}"]
    argv += ["--pool", f"{TOOL_POOL}={tools_model}"]
    argv += [
        "--port",
        "0",
        "--http-port",
        "0",
        "--metrics-port",
        "0",
        "--port-file",
        str(port_file),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        ports = json.loads(port_file.read_text())
        yield (
            f"http://127.0.0.1:{ports['http_port']}/v1",
            f"127.0.0.1:{ports['port']}",
            f"http://127.0.0.1:{ports['metrics_port']}/metrics",
            tools_model,
        )
        proc.terminate()  # a graceful stop closes the HTTP port with the gRPC one, cleanly
        assert proc.wait(15) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def client(service):
    return openai.OpenAI(base_url=service[0], api_key=TOKEN, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def chat(client, messages=HELLO, **kw):
    return client.chat.completions.create(model=POOL, messages=messages, **kw)


def test_models_lists_the_pool_and_its_version(client):
    models = client.models.list().data
    assert [(m.id, m.object, m.policy_version) for m in models] == [
        (TOOL_POOL, "model", 0),
        (POOL, "model", 0),
    ]


def test_a_chat_completion_carries_its_exact_tokens(client, tokenizer):
    r = chat(client, max_tokens=8, seed=1)
    c = r.choices[0]
    assert r.object == "chat.completion" and c.message.role == "assistant"
    assert r.prompt_token_ids == chat_tokens(tokenizer, HELLO)  # the template's own rendering
    assert 1 <= len(c.token_ids) == len(c.token_logprobs) <= 8
    assert all(lp <= 0 for lp in c.token_logprobs)
    assert c.message.content == tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert c.finish_reason == ("length" if len(c.token_ids) == 8 else "stop")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        len(r.prompt_token_ids),
        len(c.token_ids),
    )


def test_a_completion_of_text_or_of_token_ids(client, tokenizer):
    r = client.completions.create(model=POOL, prompt="The grid has", max_tokens=6, seed=2)
    assert r.prompt_token_ids == tokenizer.encode("The grid has")
    assert r.choices[0].text == tokenizer.decode(r.choices[0].token_ids, skip_special_tokens=True)
    same = client.completions.create(model=POOL, prompt=r.prompt_token_ids, max_tokens=6, seed=2)
    assert same.choices[0].token_ids == r.choices[0].token_ids


def test_n_choices_and_seed_repeatability(client):
    r = chat(client, n=3, max_tokens=6, seed=5, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in r.choices}) > 1  # three draws, not one thrice
    again = chat(client, n=3, max_tokens=6, seed=5, temperature=1.0)
    assert [c.token_ids for c in again.choices] == [c.token_ids for c in r.choices]
    assert [c.token_logprobs for c in again.choices] == [c.token_logprobs for c in r.choices]
    other = chat(client, n=3, max_tokens=6, seed=6, temperature=1.0)
    assert [c.token_ids for c in other.choices] != [c.token_ids for c in r.choices]


def test_a_stop_string_ends_the_answer_before_it(client):
    full = chat(client, max_tokens=16, seed=3).choices[0].message.content
    at = next(i for i in range(1, len(full) - 1) if full.find(full[i : i + 2]) == i)
    stop = full[at : at + 2]
    for given in (stop, [stop, "never-in-it"]):
        c = chat(client, max_tokens=16, seed=3, stop=given).choices[0]
        assert (c.message.content, c.finish_reason) == (full[:at], "stop")


def test_logprobs_are_the_sampled_tokens_and_top_logprobs_are_refused(client):
    c = chat(client, max_tokens=5, seed=4, logprobs=True).choices[0]
    assert [t.logprob for t in c.logprobs.content] == c.token_logprobs
    assert all(t.top_logprobs == [] for t in c.logprobs.content)
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, max_tokens=5, logprobs=True, top_logprobs=3)
    assert err.value.status_code == 400 and err.value.param == "top_logprobs"
    assert "only the sampled token" in err.value.message
    r = client.completions.create(model=POOL, prompt="a b", max_tokens=4, seed=4, logprobs=0)
    assert r.choices[0].logprobs.token_logprobs == r.choices[0].token_logprobs


def test_a_stream_joins_to_the_answer_of_the_same_seed(client):
    whole = chat(client, max_tokens=12, seed=9).choices[0]
    chunks = list(
        chat(client, max_tokens=12, seed=9, stream=True, stream_options={"include_usage": True})
    )
    parts = [ch.choices[0] for ch in chunks if ch.choices]
    assert "".join(p.delta.content or "" for p in parts) == whole.message.content
    assert sum((getattr(p, "token_ids", None) or [] for p in parts), []) == whole.token_ids
    assert parts[-1].finish_reason == whole.finish_reason
    assert chunks[0].prompt_token_ids and chunks[-1].usage.completion_tokens == len(whole.token_ids)
    text = client.completions.create(model=POOL, prompt="x y", max_tokens=8, seed=9)
    streamed = client.completions.create(
        model=POOL, prompt="x y", max_tokens=8, seed=9, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed) == text.choices[0].text


def test_wrong_requests_are_refused_naming_the_field(client, service):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, temperature=-0.5)
    assert err.value.param == "temperature" and "between 0.0" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=[{"type": "function", "function": {"name": "grid", "parameters": {}}}])
    assert err.value.param == "tools" and "defines no tool use" in err.value.message
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=HELLO)
    assert (
        err.value.code == "model_not_found" and "the models are: qwen3, tiny" in err.value.message
    )
    with pytest.raises(openai.BadRequestError) as err:  # over the context: refused, never cut
        chat(client, messages=[{"role": "user", "content": "grid " * 5000}], max_tokens=4)
    assert "context length" in err.value.message
    bad = openai.OpenAI(base_url=service[0], api_key="wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    with pytest.raises(urllib.error.HTTPError) as no_key:  # no Authorization header at all
        urllib.request.urlopen(f"{service[0]}/models", timeout=10)
    assert no_key.value.code == 401
    assert json.loads(no_key.value.read())["error"]["code"] == "invalid_api_key"


def test_requests_and_tokens_are_counted(client, service):
    def scrape():
        text = urllib.request.urlopen(service[2], timeout=10).read().decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("atgrpo_rollout_http_")
        }

    before = scrape()
    r = chat(client, max_tokens=3, seed=1)
    after = scrape()
    ok = 'atgrpo_rollout_http_requests_total{code="200",route="/v1/chat/completions"}'
    prompt = 'atgrpo_rollout_http_tokens_total{kind="prompt",pool="tiny"}'
    done = 'atgrpo_rollout_http_tokens_total{kind="completion",pool="tiny"}'
    assert after[ok] - before.get(ok, 0) == 1
    assert after[prompt] - before.get(prompt, 0) == r.usage.prompt_tokens
    assert after[done] - before.get(done, 0) == r.usage.completion_tokens


def test_token_parity_with_generate_over_a_multi_turn_conversation(client, service, tokenizer):
    """The OpenAI path and gRPC Generate give the same prompt ids, token ids and log-probs for
    the same seed, on every turn, the earlier answers shown again in the messages."""
    sampling = Sampling(temperature=0.9, top_p=0.95, max_tokens=10, seed=21)
    messages = list(HELLO)

    async def generate(msgs):
        async with RolloutClient(service[1]) as grpc_client:
            return await grpc_client.generate(POOL, messages=msgs, sampling=sampling)

    for turn in range(3):
        r = chat(client, messages=messages, temperature=0.9, top_p=0.95, max_tokens=10, seed=21)
        gen = asyncio.run(generate(messages))
        assert r.prompt_token_ids == gen.prompt_ids == chat_tokens(tokenizer, messages)
        assert r.choices[0].token_ids == gen.completions[0].token_ids
        assert r.choices[0].token_logprobs == gen.completions[0].logprobs
        assert r.choices[0].message.content == gen.completions[0].text
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"And turn {turn + 2}?"},
        ]


def test_tools_render_in_qwen3s_form_where_the_template_has_it(client, service):
    tokenizer = AutoTokenizer.from_pretrained(service[3])
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "move", "arguments": '{"dir": "up"}'},
    }
    messages = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "moved up"},
    ]
    r = client.chat.completions.create(
        model=TOOL_POOL, messages=messages, tools=[MOVE], max_tokens=6, seed=1
    )
    seen = [*HELLO, {"role": "assistant", "content": "", "tool_calls": [call]}, messages[-1]]
    assert r.prompt_token_ids == chat_tokens(tokenizer, seen, [MOVE])
    prompt = tokenizer.decode(r.prompt_token_ids)
    assert f"<tools>\n{json.dumps(MOVE)}\n</tools>" in prompt
    assert '<tool_call>\n{"name": "move", "arguments": {"dir": "up"}}\n</tool_call>' in prompt
    assert "<tool_response>\nmoved up\n</tool_response>" in prompt
    # the random tiny model writes no call: its text stays the answer
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")
    for change, param in [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"stream": True}, "stream"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=TOOL_POOL, messages=HELLO, tools=[MOVE], max_tokens=2, **change
            )
        assert err.value.param == param
