"""The `toy` relay environment, driven by scripted policies (no model) plus a tokenizer check."""

from __future__ import annotations

import json

import pytest

from atgrpo.sdk.env import Environment, seed_for
from env_svc.envs.toy import DEFAULT_SYMBOLS, R_CLEAN, R_INFORM, R_SOLVED, ToyEnv

SYMBOLS = tuple(DEFAULT_SYMBOLS)


def make(seed: int = 0, split: str = "train", **options) -> ToyEnv:
    env = ToyEnv(options)
    env.reset(f"{split}-{seed}", seed_for(split, seed), split)
    return env


def message_of(env: ToyEnv) -> str:
    """What the listener was told: its prompt after the fixed prefix."""
    (msg,) = env.observe("listener")
    return msg["content"].removeprefix("listener: the speaker says: ")


def faithful_listener(env: ToyEnv) -> str:
    """Repeats the first symbol of the speaker's message (or says nothing useful)."""
    heard = env.first_symbol(message_of(env))
    return heard if heard is not None else "?"


def other_symbol(secret: str) -> str:
    return next(s for s in SYMBOLS if s != secret)


# -- spec --------------------------------------------------------------------------------------


def test_spec_and_defaults():
    env = ToyEnv()
    assert isinstance(env, Environment)
    assert ToyEnv.name == env.spec.name == "toy"
    assert env.spec.agents == ("speaker", "listener")
    assert env.spec.turn_order == ("speaker", "listener")
    assert env.spec.max_turns == 2 and not env.spec.parallel
    assert ToyEnv({"max_turns": 1}).spec.max_turns == 1
    assert env.task_ids("train") is None and env.task_ids("eval") is None


@pytest.mark.parametrize(
    "options",
    [
        {"symbols": "1"},
        {"symbols": "112"},
        {"symbols": ["1", ""]},
        {"symbols": [" 1", "2"]},
        {"symbols": 12},
        {"max_turns": 0},
        {"max_turns": "2"},
        {"max_turns": True},
        {"max_message_chars": 0},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError, match="toy"):
        ToyEnv(options)


def test_unknown_agent_is_a_caller_error():
    env = make()
    with pytest.raises(ValueError, match="unknown agent"):
        env.observe("judge")
    with pytest.raises(ValueError, match="unknown agent"):
        env.step("judge", "1")


# -- the relay ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_right_speaker_and_right_listener_succeed(seed):
    env = make(seed)
    (speaker_prompt,) = env.observe("speaker")
    assert speaker_prompt["role"] == "user"
    assert speaker_prompt["content"].endswith(env.secret)

    said = env.step("speaker", env.secret)
    assert (said.team_reward, said.local_reward) == (0.0, R_INFORM + R_CLEAN)
    assert not said.done and not said.success

    answer = env.step("listener", faithful_listener(env))
    assert answer.team_reward == R_SOLVED and answer.local_reward == R_CLEAN
    assert answer.done and answer.success
    assert answer.info["symbol"] == answer.info["heard"] == env.secret
    assert "parse_error" not in said.info and "parse_error" not in answer.info


def test_lenient_texts_still_count_but_earn_no_clean_bonus():
    env = make(3)
    said = env.step("speaker", f"the secret is {env.secret}, ok?")
    assert said.local_reward == R_INFORM and said.info["clean"] is False
    answer = env.step("listener", f" it is {env.secret} \n")
    assert answer.success and answer.team_reward == R_SOLVED and answer.local_reward == 0.0


def test_first_symbol_named_wins():
    env = ToyEnv({"symbols": "1234"})
    assert env.first_symbol("x3y1") == "3"
    assert env.first_symbol("no digits") is None
    multi = ToyEnv({"symbols": ["ab", "a", "c"]})
    assert multi.first_symbol("zzab") == "ab"  # the longest one on a tie
    assert multi.first_symbol("ca") == "c"


def test_hiding_speaker_leaves_the_listener_to_luck():
    for seed in range(8):
        base = make(seed)
        said = base.step("speaker", "hello there")
        assert said.local_reward == 0.0 and "parse_error" in said.info
        winners = []
        for guess in SYMBOLS:
            branch = base.fork()
            r = branch.step("listener", guess)
            if r.success:
                winners.append(guess)
                assert r.team_reward == R_SOLVED
            else:
                assert r.team_reward == 0.0 and r.local_reward == 0.0
        # Exactly one blind guess is right: success is luck, 1 in len(symbols).
        assert winners == [base.secret]


def test_correct_listener_fails_when_the_speaker_names_something_else():
    for seed in range(8):
        env = make(seed)
        wrong = other_symbol(env.secret)
        said = env.step("speaker", wrong)
        assert said.team_reward == 0.0 and said.local_reward == 0.0
        assert said.info["symbol"] == wrong and "parse_error" not in said.info
        answer = env.step("listener", faithful_listener(env))
        assert answer.info["heard"] == wrong
        assert not answer.success and answer.team_reward == 0.0 and answer.local_reward == 0.0


def test_listener_sees_the_speaker_message():
    env = make(5)
    env.step("speaker", f"psst {env.secret}!")
    (prompt,) = env.observe("listener")
    assert prompt["role"] == "user"
    assert f"psst {env.secret}!" in prompt["content"]
    assert "secret" not in prompt["content"]  # the listener is never told the secret


def test_speaker_message_is_cut_and_scored_as_shown():
    env = make(1, max_message_chars=10)
    said = env.step("speaker", "x" * 20 + env.secret)
    assert said.local_reward == 0.0 and said.info["symbol"] is None
    assert "truncated" in said.info
    assert message_of(env) == "x" * 10


# -- malformed output --------------------------------------------------------------------------


MALFORMED = [
    "",
    "   \n\t",
    "hello world",
    "!!!???",
    "x" * 100_000,
    "\x00\x01\x02",
    "٣ ३ ３ ³",  # other scripts' digits and superscripts are not the symbols
    "🙂 日本語 Ωμέγα",
    "\ud800",  # emoji, CJK/Greek, a lone surrogate
]


@pytest.mark.parametrize("text", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_output_scores_zero_with_info(text):
    env = make(2)
    said = env.step("speaker", text)
    assert (said.team_reward, said.local_reward, said.done) == (0.0, 0.0, False)
    assert said.info["parse_error"] and said.info["symbol"] is None
    answer = env.step("listener", text)
    assert (answer.team_reward, answer.local_reward, answer.success) == (0.0, 0.0, False)
    assert answer.info["parse_error"]
    json.dumps(said.info)
    json.dumps(answer.info)


def test_empty_is_named_as_such():
    env = make(0)
    assert "empty" in env.step("speaker", "").info["parse_error"]
    assert "no symbol" in env.step("listener", "abc").info["parse_error"]


def test_long_text_with_the_secret_still_parses():
    env = make(4)
    env.step("speaker", env.secret)
    answer = env.step("listener", env.secret + " " + "z" * 100_000)
    assert answer.success and answer.local_reward == 0.0


def test_non_string_action_does_not_raise():
    env = make(0)
    r = env.step("speaker", None)  # type: ignore[arg-type]
    assert r.local_reward == 0.0 and "parse_error" in r.info


# -- turns and retries -------------------------------------------------------------------------


def test_wrong_answer_is_retried_then_the_episode_ends():
    env = make(6)  # max_turns 2 by default
    wrong = other_symbol(env.secret)
    env.step("speaker", "??")
    first = env.step("listener", wrong)
    assert not first.done and not first.success and first.team_reward == 0.0

    (retry,) = env.observe("speaker")
    assert f"said {wrong}, wrong" in retry["content"]
    assert retry["content"].endswith(env.secret)
    env.step("speaker", env.secret)
    second = env.step("listener", env.secret)
    assert second.done and second.success and second.team_reward == R_SOLVED

    after = env.step("listener", env.secret)  # past the end: scored, never raised
    assert after.done and after.team_reward == 0.0 and "error" in after.info


def test_episode_ends_unsolved_after_max_turns():
    env = make(7, max_turns=2)
    env.step("speaker", "")
    first = env.step("listener", "")
    assert not first.done and not first.success
    (retry,) = env.observe("speaker")
    assert "said nothing, wrong" in retry["content"]
    env.step("speaker", "")
    second = env.step("listener", "")
    assert second.done and not second.success and second.team_reward == 0.0


def test_single_turn_option():
    env = make(7, max_turns=1)
    env.step("speaker", "")
    r = env.step("listener", other_symbol(env.secret))
    assert r.done and not r.success


# -- tasks -------------------------------------------------------------------------------------


def test_same_seed_same_secret_and_splits_differ():
    assert [make(i).secret for i in range(64)] == [make(i).secret for i in range(64)]
    train = [make(i, "train").secret for i in range(64)]
    evals = [make(i, "eval").secret for i in range(64)]
    assert train != evals
    assert set(train) == set(SYMBOLS) and set(evals) == set(SYMBOLS)
    # reset() starts the episode afresh.
    env = make(9)
    env.step("speaker", env.secret)
    env.step("listener", env.secret)
    env.reset("train-9", seed_for("train", 9), "train")
    assert not env.done and env.turn == 0 and env.secret == make(9).secret


def test_secrets_are_roughly_balanced():
    counts = {s: 0 for s in SYMBOLS}
    for i in range(400):
        counts[make(i).secret] += 1
    assert all(60 <= c <= 140 for c in counts.values()), counts


def test_fork_is_independent():
    env = make(11)
    env.sandbox = object()  # type: ignore[assignment]
    env.step("speaker", env.secret)
    a, b = env.fork(), env.fork()
    assert a.sandbox is env.sandbox and b.sandbox is env.sandbox

    ra = a.step("listener", env.secret)
    assert ra.success and a.done
    assert not b.done and not env.done
    assert env.observe("listener") == b.observe("listener")
    rb = b.step("listener", other_symbol(env.secret))
    assert not rb.success and not rb.done  # a retry remains in b
    assert b.turn == 1 and env.turn == 0 and a.success and not b.success
    # the original can still be stepped as if nothing had happened
    assert env.step("listener", env.secret).success


# -- the tiny model's tokenizer ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_symbols_are_single_tokens_of_the_tiny_tokenizer(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = {}
    for s in SYMBOLS:
        enc = tok.encode(s, add_special_tokens=False)
        assert len(enc) == 1, (s, enc)
        assert tok.decode(enc) == s
        ids[s] = enc[0]
    assert len(set(ids.values())) == len(SYMBOLS)
    # No other token's text contains a symbol: a text names a symbol iff that token was sampled.
    for token, i in tok.get_vocab().items():
        text = tok.convert_tokens_to_string([token])
        if i not in ids.values():
            assert not any(s in text for s in SYMBOLS), (token, text)


def test_prompts_are_short(tiny_tokenizer):
    env = make(0)

    def n_tokens(messages):
        enc = tiny_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return len(enc["input_ids"])

    assert n_tokens(env.observe("speaker")) <= 24
    env.step("speaker", env.secret)
    assert n_tokens(env.observe("listener")) <= 24
    env.step("listener", other_symbol(env.secret))
    assert n_tokens(env.observe("speaker")) <= 40


# -- the code option and the single-agent order ---------------------------------------------------


def test_code_speaker_must_encode_and_listener_decode():
    env = make(1, code="5678")
    encoded = "5678"[SYMBOLS.index(env.secret)]
    said = env.step("speaker", encoded)
    assert said.local_reward == R_INFORM + R_CLEAN and said.info["symbol"] == encoded
    answer = env.step("listener", env.secret)
    assert answer.success and answer.team_reward == R_SOLVED and answer.info["heard"] == encoded


def test_code_speaker_saying_the_plain_secret_is_not_informative():
    env = make(1, code="5678")
    said = env.step("speaker", env.secret)
    # a secret digit is not in the code
    assert said.local_reward == 0.0 and "parse_error" in said.info
    # answering in the code alphabet fails
    answer = env.step("listener", "5678"[SYMBOLS.index(env.secret)])
    assert not answer.success and answer.team_reward == 0.0


@pytest.mark.parametrize("code", ["567", "1567", [""] * 4])
def test_bad_code_is_refused(code):
    with pytest.raises(ValueError, match="toy: "):
        ToyEnv({"code": code})


def test_speaker_alone_is_judged_on_its_own_answer():
    env = make(2, turn_order=["speaker"])
    assert env.spec.turn_order == ("speaker",)
    wrong = env.step("speaker", other_symbol(env.secret))
    assert not wrong.done and wrong.team_reward == 0.0
    (prompt,) = env.observe("speaker")
    assert prompt["content"].startswith("speaker: you said ")
    right = env.step("speaker", env.secret)
    assert (
        right.done
        and right.success
        and (right.team_reward, right.local_reward) == (R_SOLVED, R_CLEAN)
    )


def test_a_listener_alone_is_refused():
    with pytest.raises(ValueError, match="never sees the secret"):
        ToyEnv({"turn_order": ["listener"]})
    with pytest.raises(ValueError, match="must list some of the agents"):
        ToyEnv({"turn_order": ["speaker", "speaker"]})
