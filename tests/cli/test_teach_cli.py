"""`atgrpo model teach`: the tiny model, taught from a few example answers on an env's own prompts,
answers each role in the env's format (a random tiny model never does, so a new env's smoke run
would score every sample alike and train on nothing)."""

import asyncio

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from atgrpo.cli import main
from atgrpo.cli.teach import first_prompts

ENV = "tests.env.sdk_envs:CounterEnv"


def greedy(model_dir, messages) -> str:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


def test_the_taught_model_answers_each_role_with_its_examples(tiny_model, tmp_path, capsys):
    examples = tmp_path / "examples.yaml"
    examples.write_text(yaml.safe_dump({"a": ["3", "4"], "b": "5"}))
    out = tmp_path / "taught"
    argv = ["model", "teach", "--base", tiny_model, "--examples", str(examples), "--out", str(out)]
    assert main([*argv, "--env", ENV, "--steps", "200", "--tasks", "4"]) == 0
    assert capsys.readouterr().out.strip() == str(out)

    held_out = asyncio.run(first_prompts(ENV, {}, ["a", "b"], 12))[8:]  # tasks 4..5: not taught
    said = {(agent, greedy(out, messages)) for agent, messages in held_out}
    assert {s for a, s in said if a == "a"} <= {"3", "4"}
    assert {s for a, s in said if a == "b"} == {"5"}
    assert greedy(tiny_model, held_out[0][1]) not in {"3", "4", "5"}  # the untaught model does not


@pytest.mark.parametrize(
    "examples, extra, says",
    [
        ({"c": "1"}, ["--env", ENV], "has no agent 'c'"),
        ({"a": [1]}, ["--env", ENV], "'a' needs an answer or a list of answers"),
        ({"a": "1"}, [], "give --env or --config"),
        ({"a": "1"}, ["--env", "no_such.module:Env"], "cannot load environment"),
    ],
)
def test_a_wrong_request_exits_2_saying_what_to_give(examples, extra, says, tmp_path, capsys):
    path = tmp_path / "examples.yaml"
    path.write_text(yaml.safe_dump(examples))
    argv = ["model", "teach", "--base", "x", "--examples", str(path), "--out", str(tmp_path / "o")]
    assert main([*argv, *extra]) == 2
    assert says in capsys.readouterr().err
