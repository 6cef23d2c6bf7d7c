"""What the interception server reads from a chat-completions request, and what it refuses."""

import pytest

from atgrpo.sdk.intercept import CallRefused, completion, parse_request
from atgrpo.sdk.program_checks import Outcome, checked_outcome, replay_diff

AGENTS = ("tool", "reasoner")


def test_a_request_is_its_model_and_text_messages():
    body = {
        "model": "tool",
        "temperature": 0.3,  # the run config's sampling applies, not the program's
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "1+"}, {"type": "text", "text": "2"}],
            },
        ],
    }
    assert parse_request(body) == (
        "tool",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2"}],
    )
    answer = completion("tool", "3", 4)
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "3"}
    assert answer["id"] == "chatcmpl-atgrpo-4"  # a replay reads the same id


@pytest.mark.parametrize(
    "body, says",
    [
        ([], "not a JSON object"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model is None: name the role"),
        ({"model": "tool", "messages": []}, "messages must be a non-empty list"),
        (
            {"model": "tool", "stream": True, "messages": [{"role": "user", "content": "x"}]},
            "stream=True",
        ),
        (
            {"model": "tool", "n": 2, "messages": [{"role": "user", "content": "x"}]},
            "n=2: one answer",
        ),
        (
            {
                "model": "tool",
                "tools": [{"type": "function"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "not function calls",
        ),
        (
            {"model": "tool", "messages": [{"role": "tool", "content": "x"}]},
            "message 0 has role 'tool'",
        ),
        (
            {"model": "tool", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "text only",
        ),
    ],
)
def test_what_the_policy_cannot_answer_is_refused_saying_why(body, says):
    with pytest.raises(CallRefused, match=says):
        parse_request(body)


def test_outcomes_and_replay_diffs():
    assert checked_outcome(0.5, AGENTS, 1.0) == (0.5, {}, False)
    assert checked_outcome(Outcome(1.0, {"tool": 0.2}), AGENTS, 1.0) == (1.0, {"tool": 0.2}, True)
    assert checked_outcome(Outcome(0.0, success=True), AGENTS, 1.0)[2] is True
    for bad, says in [
        (True, "returned bool 'True': return the team reward"),
        (None, "returned NoneType"),
        (Outcome(1.0, {"critic": 1.0}), "rewards 'critic', not one of"),
        (Outcome(1.0, {"tool": -3}), "the returned reward of 'tool' is '-3'"),
        (Outcome(1.0, success="yes"), "success='yes'"),
    ]:
        with pytest.raises(ValueError, match=says):
            checked_outcome(bad, AGENTS, 1.0)
    recorded = ("tool", [{"role": "user", "content": "Compute 1+2."}])
    assert replay_diff(2, recorded, ("reasoner", recorded[1])) == (
        "call 2 was to 'tool' when recorded and is to 'reasoner' in the replay"
    )
    extra = ("tool", [*recorded[1], {"role": "user", "content": "More."}])
    assert replay_diff(0, recorded, extra) == (
        "call 0 ('tool') had 1 messages when recorded and has 2 in the replay"
    )
