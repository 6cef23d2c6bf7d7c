"""`atgrpo samples RUN_DIR`: a step's saved samples as text, filtered; a clear error when a run
saved none or not that step."""

from atgrpo.cli import main
from atgrpo.contract.rollout import PolicyRef, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.rundir import RunDir


def sample(agent, branch, selected, text) -> Sample:
    return Sample(
        "train-3", agent, 0, branch, PolicyRef("shared", agent, 4), [5, 6], [7], [-0.1],
        1.0, 0.5, True, selected, selected, Sampling(), info={"symbol": text},
        response_text=text, episode=1, prompt_text=f"<user>{agent}: the secret is 3",
    )  # fmt: skip


def test_a_step_prints_as_text_filtered_by_agent_and_selection(tmp_path, capsys):
    run = RunDir(tmp_path)
    samples = [sample("speaker", 0, True, "7"), sample("speaker", 1, False, "5")]
    samples.append(sample("listener", 0, True, "3"))
    run.write_samples(
        2, samples, [1.5, 1.5, 1.5], [0.7, -0.7, None], {"speaker": "s", "listener": "s"}
    )
    run.write_samples(1, samples[:1], [0.0], [0.0], {"speaker": "s"})

    assert main(["samples", str(tmp_path), "--agent", "speaker", "--selected"]) == 0
    out = capsys.readouterr().out
    assert out == (
        "step 2 · task train-3 · turn 0 · speaker · branch 0 (selected) · speaker v4\n"
        "reward +1.500 (team +1.000, local +0.500) · advantage +0.700 · done, success\n"
        "prompt:\n  <user>speaker: the secret is 3\nresponse:\n  7\n"
        'info: {"symbol": "7"}\n'
    )
    assert main(["samples", str(tmp_path), "--step", "2", "--limit", "2"]) == 0
    assert capsys.readouterr().out.count("step 2 · task train-3") == 2


def test_no_saved_samples_says_which_setting_saves_them(tmp_path, capsys):
    assert main(["samples", str(tmp_path)]) == 1
    assert "set run.save_samples: true" in capsys.readouterr().err
    assert main(["samples", str(tmp_path), "--eval"]) == 1
    assert "set run.save_eval_samples: true" in capsys.readouterr().err


def test_a_step_not_saved_names_the_ones_that_were(tmp_path, capsys):
    RunDir(tmp_path).write_samples(4, [sample("a", 0, True, "1")], [0.0], [0.0], {"a": "s"})
    assert main(["samples", str(tmp_path), "--step", "9"]) == 1
    assert "no samples of step 9" in (err := capsys.readouterr().err) and "last saved: 4" in err
    assert main(["samples", str(tmp_path), "--agent", "nobody"]) == 1
    assert "matches" in capsys.readouterr().err
