"""The OpenAI-compatible API's pure parts: request checks (rollout_svc.openai_request) and the
stream's pieces (rollout_svc.openai_response), on plain values."""

import pytest

from atgrpo.contract.rollout import Completion, Generation, PolicyRef
from atgrpo.contract.sampling import Sampling
from rollout_svc.openai_request import ApiError, parse_chat, parse_completion, resolve_model
from rollout_svc.openai_response import chat_chunks, chat_response, models_list, pieces
from rollout_svc.openai_tools import parse_tool_calls, renders_tools

CHAT = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}


def refused(parse, body) -> ApiError:
    with pytest.raises(ApiError) as err:
        parse(body)
    assert err.value.status == 400
    assert err.value.body()["error"]["type"] == "invalid_request_error"
    return err.value


def test_a_chat_request_becomes_generate_settings():
    req = parse_chat(
        {
            **CHAT,
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "n": 3,
            "temperature": 0.7,
            "top_p": 0.9,
            "max_completion_tokens": 5,
            "stop": "\n",
            "seed": 11,
            "logprobs": True,
            "top_logprobs": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "ignored",
        }
    )
    assert req.sampling == Sampling(
        temperature=0.7, top_p=0.9, max_tokens=5, max_prompt_tokens=0, stop=("\n",), seed=11
    )
    assert req.messages == (
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    )
    assert (req.n, req.stream, req.include_usage, req.logprobs) == (3, True, True, True)
    assert parse_chat(CHAT).sampling == Sampling(max_prompt_tokens=0)


@pytest.mark.parametrize(
    "change, param, words",
    [
        ({"model": ""}, "model", "GET /v1/models"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "system, user"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "string"),
        (
            {"messages": [{"role": "user", "tool_calls": [1]}]},
            "messages[0].tool_calls",
            "assistant",
        ),
        ({"messages": [{"role": "tool", "content": 3}]}, "messages[0].content", "string"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "name"),
        ({"tools": {"a": 1}}, "tools", "list"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice", "cannot force"),
        ({"temperature": -1}, "temperature", "between 0.0"),
        ({"temperature": float("nan")}, "temperature", "number"),
        ({"top_p": 0}, "top_p", "between"),
        ({"n": 0}, "n", "between 1 and 1024"),
        ({"n": True}, "n", "integer"),
        ({"max_tokens": 0}, "max_tokens", "between 1"),
        ({"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens", "one of the two"),
        ({"stop": ["a", ""]}, "stop", "non-empty"),
        ({"seed": -1}, "seed", "between 0"),
        ({"top_logprobs": 2}, "top_logprobs", "only the sampled token"),
        ({"logprobs": "yes"}, "logprobs", "true or false"),
        ({"presence_penalty": 0.5}, "presence_penalty", "remove presence_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "not supported"),
        ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
        ({"stream_options": 1}, "stream_options", "include_usage"),
    ],
)
def test_a_wrong_chat_field_is_named_with_what_to_send(change, param, words):
    err = refused(parse_chat, {**CHAT, **change})
    assert err.param == param
    assert err.message.startswith(f"{param}: ")
    assert words in err.message


def test_a_completion_prompt_is_one_text_or_token_ids():
    assert parse_completion({"model": "p", "prompt": "x"}).prompt == "x"
    assert parse_completion({"model": "p", "prompt": ["x"]}).prompt == "x"
    assert parse_completion({"model": "p", "prompt": [5, 6]}).prompt == (5, 6)
    assert parse_completion({"model": "p", "prompt": "x", "logprobs": 0}).logprobs
    assert refused(parse_completion, {"model": "p", "prompt": ["a", "b"]}).param == "prompt"
    assert refused(parse_completion, {"model": "p", "prompt": ""}).param == "prompt"
    err = refused(parse_completion, {"model": "p", "prompt": "x", "logprobs": 2})
    assert err.param == "logprobs" and "only the sampled token" in err.message
    assert refused(parse_completion, {"model": "p", "prompt": "x", "echo": True}).param == "echo"
    assert refused(parse_completion, [1]).param is None


def test_model_names_a_pool_an_adapter_of_it_or_an_agent_served_once():
    served = {"a": ("solver", "checker"), "b": ("solver",), "c": ()}
    assert resolve_model("a", served) == ("a", "")
    assert resolve_model("b/solver", served) == ("b", "solver")
    assert resolve_model("checker", served) == ("a", "checker")
    for name, hint in [("solver", "name it pool/adapter"), ("c/x", "a, a/checker, a/solver, b")]:
        with pytest.raises(ApiError) as err:
            resolve_model(name, served)
        assert (err.value.status, err.value.code, err.value.param) == (
            404,
            "model_not_found",
            "model",
        )
        assert hint in err.value.message


def test_models_list_names_pools_and_adapters_with_their_versions():
    listed = models_list([PolicyRef("a"), PolicyRef("a", "solver", 3)], 100)["data"]
    assert [(m["id"], m["parent"], m["policy_version"]) for m in listed] == [
        ("a", None, 0),
        ("a/solver", "a", 3),
    ]


def decode(ids):
    # a byte-level tokenizer's way: token 9 is half of a two-byte character, 10 its other half
    table = {1: "ab", 2: " c", 9: b"\xc3", 10: b"\xa9", 3: "!", 0: ""}
    raw = b"".join(v if isinstance(v, bytes) else v.encode() for v in (table[i] for i in ids))
    return raw.decode(errors="replace")


@pytest.mark.parametrize(
    "ids, text",
    [
        ([1, 2, 3], "ab c!"),
        ([1, 9, 10, 2], "abé c"),  # the character's first byte waits for its second
        ([1, 2, 3, 1], "ab c"),  # a stop string cut the text: the last token rides along
        ([1, 0], "ab"),  # an end-of-text token decodes to nothing
        ([1, 9], "ab\ufffd"),  # ends inside a character: the text as the engine decoded it
    ],
)
def test_stream_pieces_join_to_the_text_and_cover_every_token(ids, text):
    got = pieces(Completion(ids, [0.0] * len(ids), text, "stop"), decode)
    assert "".join(t for t, _, _ in got) == text
    assert [i for _, a, b in got for i in ids[a:b]] == ids
    assert all(a < b for _, a, b in got[:-1])


def test_a_chat_stream_carries_the_prompt_ids_once_and_every_token():
    gen = Generation(
        [7, 8],
        [Completion([1, 2], [-0.5, -1.5], "ab c", "stop"), Completion([3], [-2.0], "!", "length")],
        PolicyRef("p"),
    )
    chunks = list(chat_chunks("id", 1, "p", gen, True, True, decode))
    assert [c.get("prompt_token_ids") for c in chunks if "prompt_token_ids" in c] == [[7, 8]]
    for i, c in enumerate(gen.completions):
        mine = [
            ch["choices"][0] for ch in chunks if ch["choices"] and ch["choices"][0]["index"] == i
        ]
        assert "".join(m["delta"].get("content", "") for m in mine) == c.text
        assert sum((m.get("token_ids", []) for m in mine), []) == c.token_ids
        assert sum((m.get("token_logprobs", []) for m in mine), []) == c.logprobs
        assert mine[-1]["finish_reason"] == c.finish_reason
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_a_conversation_with_tools_keeps_its_calls_and_results_for_the_template():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    req = parse_chat(
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        }
    )
    assert req.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        ],
    }
    assert req.messages[2] == {"role": "tool", "content": "done", "tool_call_id": "c1"}
    assert (req.tool_use, req.tool_choice) == (True, "auto")
    assert (parse_chat(CHAT).tool_use, parse_chat(CHAT).tool_choice) == (False, "none")


def test_tool_calls_are_parsed_from_qwen3_blocks_and_bad_ones_stay_text():
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    text += '\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    content, calls = parse_tool_calls(text, "call_a")
    assert content == "Let me look."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_a_0", "f", '{"x": 1}'),
        ("call_a_1", "g", "{}"),
    ]
    for broken in ("<tool_call>{not json}</tool_call>", '<tool_call>{"x": 1}</tool_call>', "hi"):
        assert parse_tool_calls(broken, "c") == (broken, [])
    gen = Generation([1], [Completion([5], [-1.0], text, "stop")], PolicyRef("p"))
    choice = chat_response("chatcmpl-ab", 1, "p", gen, False, decode, tools=True)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["f", "g"]
    plain = chat_response("chatcmpl-ab", 1, "p", gen, False, decode)["choices"][0]
    assert (plain["finish_reason"], plain["message"]["content"]) == ("stop", text)


def test_only_templates_with_qwen3s_tool_form_take_tools():
    from atgrpo.models.tiny import CHAT_TEMPLATE
    from tests.rollout.qwen3_style import QWEN3_STYLE_TEMPLATE

    assert renders_tools(QWEN3_STYLE_TEMPLATE)
    assert not renders_tools(CHAT_TEMPLATE)
    assert not renders_tools(None)
