"""Loaders of the public datasets' files (fixtures in tests/env/fixtures/ follow each dataset's
real field names), their errors, how tasks pick problems, and loaded problems run end to end."""

import asyncio
import base64
import json
import os
import pickle
import sys
import zlib
from pathlib import Path

import pytest

from env_svc import code_formats, datasets
from env_svc.datasets import DatasetError, Source, load, pick, read_rows, sources
from env_svc.envs.answers import answers_match
from env_svc.envs.code import CodeEnv
from tests.env.test_code_env import answer_with_tests

FIX = Path(__file__).resolve().parent / "fixtures"


def code(dataset, name, **kw):
    return load("code", Source(dataset, str(FIX / name), **kw), "train")


def math_set(dataset, name):
    return load("math", Source(dataset, str(FIX / name)), "eval")


# ---- code datasets ---------------------------------------------------------------------------


def test_apps():
    ps = code("apps", "apps_test.jsonl")
    assert [p.id for p in ps] == ["apps-4000", "apps-4001", "apps-4003"]  # 4002 has no tests
    stdin, fn, lines = ps
    assert stdin.kind == "stdin" and stdin.tests == (
        ("1 2\n", "3\n"),
        ("10 -3\n", "7\n"),
        ("0 0\n", "0\n"),
    )
    assert stdin.solution.startswith("a, b = map(int")  # the first solution
    assert "-----Input-----" in stdin.statement
    # call-based: arguments as JSON lines, outputs unwrapped from APPS's one-element lists
    assert (
        fn.kind == "function"
        and fn.fn_name == "sum_list"
        and fn.starter_code.startswith("def sum_list")
    )
    assert fn.tests == (("[1,2,3]\n", "6\n"), ("[]\n", "0\n"), ("[-1.5,0.5]\n", "-1\n"))
    assert lines.tests == (("ab\nignored\n", "ab\nab\n"),)  # lists of lines joined


def test_code_contests_jsonl_and_parquet(tmp_path):
    ps = code("code_contests", "code_contests.jsonl")
    assert len(ps) == 1  # 9001_B has no tests
    p = ps[0]
    assert p.id == "cc-9001_A" and p.statement.startswith("Given n, print 2n.")
    assert p.tests == (("3\n", "6\n"), ("0\n", "0\n"), ("-4\n", "-8\n"))  # public + private
    assert p.solution == "print(2 * int(input()))\n"  # PYTHON3, not C++ or Python 2
    every = code("code_contests", "code_contests.jsonl", tests=("private", "generated"))[0]
    assert every.tests == (("0\n", "0\n"), ("-4\n", "-8\n"), ("100\n", "200\n"))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIX / "code_contests.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    assert load("code", Source("code_contests", str(tmp_path / "train.parquet")), "train") == ps


def test_livecodebench_plain_and_compressed_tests():
    stdin, fn = code("livecodebench", "livecodebench.jsonl")
    assert (
        stdin.id == "lcb-abc900_a"
        and stdin.kind == "stdin"
        and stdin.statement.startswith("Add Them\n\n")
    )
    # public + private
    assert stdin.tests == (
        ("1 2\n", "3\n"),
        ("5 7\n", "12\n"),
        ("-1 1\n", "0\n"),
    )
    assert stdin.solution == ""  # LiveCodeBench has none
    assert (
        fn.kind == "function" and fn.fn_name == "countPairs" and "class Solution" in fn.starter_code
    )
    assert fn.tests == (("[1,2,3,4]\n5\n", "2\n"), ("[1,1,1]\n2\n", "3\n"), ("[]\n0\n", "0\n"))


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_a_crafted_pickle_in_livecodebench_tests_is_refused(tmp_path):
    _Evil.marker = tmp_path / "pwned"
    row = json.loads((FIX / "livecodebench.jsonl").read_text().splitlines()[0])
    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(_Evil()))).decode()
    good = json.loads((FIX / "livecodebench.jsonl").read_text().splitlines()[1])
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(good) + "\n")
    ps = load("code", Source("livecodebench", str(path)), "train")
    assert [p.fn_name for p in ps] == ["countPairs"]  # the crafted row is skipped ...
    assert not _Evil.marker.exists()  # ... without running anything
    with pytest.raises(pickle.UnpicklingError, match="refusing to load posix.system"):
        code_formats.decode_lcb_tests(row["private_test_cases"])


def test_pettingllms_code():
    (p,) = code("pettingllms", "pettingllms_code.jsonl")
    assert p.tests == (("3\n", "9\n"), ("0\n", "0\n")) and p.solution.startswith("n = int")


def test_sample_sets_are_packaged():
    for kind in ("code", "math"):
        for split in ("train", "eval"):
            assert (datasets.DATA_DIR / f"{kind}_{split}.jsonl").is_file()
    train = {p.id for p in load("code", Source(), "train")}
    assert train.isdisjoint(p.id for p in load("code", Source(), "eval"))


# ---- math datasets ---------------------------------------------------------------------------


def test_aime_both_years_field_spellings():
    a24 = math_set("aime2024", "aime_2024.jsonl")
    assert [(p.id, p.answer) for p in a24] == [("aime-2024-I-1", "24"), ("aime-2024-I-2", "1")]
    assert a24[0].question.startswith("Find the number of positive divisors")
    (a25,) = math_set("aime2025", "aime_2025.jsonl")
    assert (a25.id, a25.answer) == ("aime-0", "53")


def test_olympiadbench():
    ps = math_set("olympiadbench", "olympiadbench.jsonl")
    # no images
    assert [p.id for p in ps] == [
        "olympiadbench-2001",
        "olympiadbench-2002",
        "olympiadbench-2004",
    ]
    half, roots, interval = ps
    assert half.answer == "\\frac{1}{2}" and answers_match("0.5", half.answer)
    assert answers_match("3, 2", roots.answer) and not answers_match("2", roots.answer)
    assert interval.question.startswith("Let x be a real number.\n\n") and answers_match(
        "(-1, 1)", interval.answer
    )


def test_pettingllms_math_skips_unanswered():
    assert [(p.question, p.answer) for p in math_set("pettingllms", "pettingllms_math.jsonl")] == [
        ("What is 6 times 7?", "42")
    ]


# ---- errors ----------------------------------------------------------------------------------


def test_missing_file_names_the_path_and_the_fields(tmp_path):
    missing = tmp_path / "apps" / "test.jsonl"
    with pytest.raises(DatasetError) as e:
        load("code", Source("apps", str(missing)), "train")
    assert str(missing) in str(e.value) and "no such file" in str(e.value)
    assert "question, input_output" in str(e.value)
    with pytest.raises(DatasetError, match="is a directory"):
        read_rows(tmp_path, "x")


def test_malformed_files(tmp_path):
    bad = tmp_path / "aime.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": 2}\n{"problem": oops}\n')
    with pytest.raises(
        DatasetError, match=r"aime.jsonl: line 2 is not valid JSON.*answer \(or Answer\)"
    ):
        load("math", Source("aime", str(bad)), "eval")
    bad.write_text('{"Problem": "1+1?", "Solution": "2"}\n')
    with pytest.raises(DatasetError) as e:
        load("math", Source("aime", str(bad)), "eval")
    assert "row 0 has no field answer or Answer (it has: Problem, Solution)" in str(e.value)
    assert str(bad) in str(e.value)
    lists = tmp_path / "rows.json"
    lists.write_text(json.dumps({"rows": [{"question": "2+2?", "answer": "4"}]}))
    assert load("math", Source("math", str(lists)), "eval")[0].answer == "4"
    lists.write_text(json.dumps("just a string"))
    with pytest.raises(DatasetError, match="must hold a list of objects"):
        load("math", Source("math", str(lists)), "eval")
    csv = tmp_path / "apps.csv"
    csv.write_text("question,input_output\n")
    with pytest.raises(
        DatasetError, match=r"unknown file type '.csv'; use .jsonl, .json or .parquet"
    ):
        load("code", Source("apps", str(csv)), "train")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="empty.jsonl: no rows"):
        load("code", Source("apps", str(empty)), "train")
    useless = tmp_path / "useless.jsonl"
    useless.write_text(json.dumps({"question": "q", "input_output": "{not json"}) + "\n")
    with pytest.raises(
        DatasetError, match=r"no usable problem in the file \(1 rows skipped; row 0: undecodable"
    ):
        load("code", Source("apps", str(useless)), "train")


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "test.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        DatasetError, match=r"needs pyarrow.*pip install pyarrow.*convert the file to .jsonl"
    ):
        load("code", Source("apps", str(path)), "train")


def test_options_choose_a_source_per_split():
    s = sources(
        {
            "dataset": "LCB",
            "path": "/data/lcb.jsonl",
            "train": {"dataset": "cc", "path": "/data/cc.parquet", "tests": ["private"]},
        },
        "code",
    )
    assert s["train"] == Source("code_contests", "/data/cc.parquet", 0, None, ("private",))
    assert s["eval"] == Source("livecodebench", "/data/lcb.jsonl")
    assert sources({}, "math") == {"train": Source(), "eval": Source()}
    apps = sources(
        {
            "dataset": "apps",
            "path": "a.jsonl",
            "train": {"start": 500, "stop": 4500},
            "eval": {"stop": 500},
        },
        "code",
    )
    assert (apps["train"].start, apps["train"].stop, apps["eval"].stop) == (500, 4500, 500)
    for bad, why in [
        ({"dataset": "apps"}, "needs `path`"),
        ({"dataset": "gsm8k", "path": "x"}, "unknown code dataset"),
        ({"train": {"datset": "apps"}}, "unknown keys"),
        ({"start": 5, "stop": 2}, "start"),
        ({"dataset": "cc", "path": "x", "tests": ["hidden"]}, "unknown test sets"),
    ]:
        with pytest.raises(ValueError, match=why):
            sources(bad, "code")
    sliced = load("code", Source("apps", str(FIX / "apps_test.jsonl"), 1, 3), "train")
    assert [p.id for p in sliced] == ["apps-4001"]  # rows 1-2; row 2 has no tests
    tail = load("code", Source("pettingllms", str(FIX / "pettingllms_code.jsonl"), 0, 1), "train")
    assert tail[0].id == "code-0"
    with pytest.raises(DatasetError, match="no rows"):
        load("code", Source("apps", str(FIX / "apps_test.jsonl"), 10, 20), "train")


def test_tasks_pick_problems_deterministically():
    ps = load("math", Source(), "train")
    n = len(ps)
    epoch0 = [pick(ps, f"train-{i}", i, "train", 10**9).id for i in range(n)]
    epoch1 = [pick(ps, f"train-{i}", i, "train", 10**9).id for i in range(n, 2 * n)]
    assert sorted(epoch0) == sorted(p.id for p in ps) == sorted(epoch1) and epoch0 != epoch1
    assert epoch0 == [pick(ps, "x", i, "train", 10**9).id for i in range(n)]  # reproducible
    ev = load("math", Source(), "eval")
    assert [pick(ev, "e", 10**9 + i, "eval", 10**9).id for i in range(3)] == [p.id for p in ev[:3]]
    assert pick(ps, ps[5].id, 0, "train", 10**9) is ps[5]  # by problem id


# ---- loaded problems through the environment ----------------------------------------------


def test_livecodebench_function_problem_runs_end_to_end(sandbox):
    env = CodeEnv(
        {"dataset": "livecodebench", "path": str(FIX / "livecodebench.jsonl"), "done_when": "tests"}
    )
    env.reset("lcb-9901", 0, "train")
    env.sandbox = sandbox
    assert "countPairs" in env.observe("coder")[0]["content"]
    r = asyncio.run(
        env.step(
            "coder",
            "```python\nclass Solution:\n    def countPairs(self, nums: List[int], k: int) -> "
            "int:\n        return sum(nums[i] + nums[j] == k for i in range(len(nums)) for j in "
            "range(i + 1, len(nums)))\n```",
        )
    )
    assert r.local_reward == 1.0 and r.success
    # no dataset solution: the program that passed every hidden test judges the tester's tests
    t = asyncio.run(env.step("tester", answer_with_tests([("[2, 3]\n5", "1"), ("[2, 2]\n4", "2")])))
    assert t.info["agree"] == 1 and not t.done
    assert t.local_reward == 0.0  # right tests, but no wrong program in the episode to catch


def test_apps_call_based_problem_uses_its_solution_as_reference(sandbox):
    env = CodeEnv({"dataset": "apps", "path": str(FIX / "apps_test.jsonl"), "done_when": "tests"})
    env.reset("apps-4001", 0, "train")
    env.sandbox = sandbox
    t = asyncio.run(
        env.step(
            "tester", answer_with_tests([("[1, 2]", "3"), ("[0.5, 0.25]", "0.75"), ("[1]", "2")])
        )
    )
    assert t.info["agree"] == 2 and t.local_reward == 0.0  # no wrong program yet to catch
    r = asyncio.run(
        env.step("coder", "```python\ndef sum_list(xs):\n    return float(sum(xs))\n```")
    )
    assert r.local_reward == 1.0 and r.success and not r.done  # the tester's third test is wrong


def test_the_docs_example_options_are_valid():
    import re

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    section = doc.split("## The built-in `code` and `math` environments", 1)[1]
    env = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))["env"]
    s = sources(env["options"], env["name"])
    assert s["train"].dataset == "code_contests" and s["eval"].dataset == "livecodebench"
    assert CodeEnv(env["options"]).spec.turn_order == tuple(env["turn_order"])
