"""Problem sets for the `code` and `math` environments: the small sample sets shipped with atgrpo
(env_svc/data/) and loaders for the public datasets' own files, read from a local path.

| env | `dataset` | file rows (fields the loader reads) |
|---|---|---|
| code | `sample` | ours: `id`, `kind` (stdin/function), `statement`, `tests` [{input, output}], `solution`, `fn_name`, `starter_code` |
| code | `apps` | codeparrot/apps: `question`, `input_output` (JSON: inputs, outputs, optional fn_name), `solutions` (JSON list), `starter_code`, `problem_id` |
| code | `code_contests` | deepmind/code_contests: `name`, `description`, `public_tests`/`private_tests`/`generated_tests` ({input: [...], output: [...]}), `solutions` ({language: [...], solution: [...]}) |
| code | `livecodebench` | livecodebench/code_generation_lite: `question_id`, `question_title`, `question_content`, `starter_code`, `public_test_cases`, `private_test_cases` (JSON, or base64 zlib pickle), `metadata` (JSON with func_name) |
| code | `pettingllms` | the reference's processed files: `question`, `test_input`, `test_output`, `solution` |
| math | `sample` | ours: `id`, `question`, `answer` |
| math | `aime` (`aime2024`, `aime2025`, `math`) | `problem`/`Problem`/`question`, `answer`/`Answer`, optional `id`/`ID` (Maxwell-Jia/AIME_2024, yentinglin/aime_2025, HuggingFaceH4/aime_2024, POLARIS) |
| math | `olympiadbench` | Hothan/OlympiadBench: `question`, `final_answer` (list), `is_multiple_answer`, `context`, `id`; rows with images are skipped |
| math | `pettingllms` | the reference's processed files: `question`, `solution` (the final answer) |

Files are `.jsonl`, `.json` (a list of rows) or `.parquet` (needs pyarrow). A missing file, an
unreadable one or rows without the fields above raise DatasetError naming the path and the fields
expected. Rows that have the fields but no usable content (no tests, undecodable test JSON) are
skipped and counted; a file with no usable row at all is an error. `start`/`stop` take a slice of
the file's rows before anything is skipped (as the reference split APPS: rows 500-4500 for
training, 0-500 for evaluation); JSON lines outside the slice are not even parsed.

Function-call problems become stdin/stdout problems through a harness (see
env_svc/envs/code.py): the stdin of a case is its arguments, one JSON value per line (the
LiveCodeBench convention), and the expected stdout is `canonical_json(return value)`.

Loaded sets are cached per (file, its size and mtime, slice): env_svc builds one environment
object per episode, and the file is read once.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import json
import logging
import os
import pickle
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"
MAX_DECOMPRESSED_BYTES = 512 * 2**20     # LiveCodeBench's compressed private tests, decoded
SPLITS = ("train", "eval")


class DatasetError(ValueError):
    """A dataset file that is missing, unreadable or not in the expected format."""


@dataclass(frozen=True)
class CodeProblem:
    id: str
    statement: str
    kind: str                                 # "stdin" | "function"
    tests: tuple[tuple[str, str], ...]        # hidden tests in run form: (stdin, expected stdout)
    solution: str = ""                        # a reference Python 3 solution; "" when none
    fn_name: str = ""                         # function problems: the function (or Solution method)
    starter_code: str = ""
    compare: str = "whitespace"               # "whitespace" | "float" (numeric tokens within 1e-6)
    source: str = ""


@dataclass(frozen=True)
class MathProblem:
    id: str
    question: str
    answer: str
    source: str = ""


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
        if v == int(v) and abs(v) < 2 ** 53:
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


# ---- reading files ----------------------------------------------------------------------------

def read_rows(path: str | os.PathLike[str], fields_doc: str, start: int = 0,
              stop: int | None = None) -> list[dict[str, Any]]:
    """Rows start..stop of a .jsonl / .json / .parquet file, or DatasetError naming the path and
    the fields expected (`fields_doc`). JSON lines outside the slice are not parsed."""
    p = Path(path).expanduser()
    want = f"expected rows with {fields_doc}"
    if not p.exists():
        raise DatasetError(f"{p}: no such file; {want} (.jsonl, .json or .parquet)")
    if p.is_dir():
        raise DatasetError(f"{p}: is a directory; give the path of one .jsonl, .json or .parquet file ({want})")
    suffix = p.suffix.lower()
    try:
        if suffix == ".parquet":
            return _read_parquet(p, want)[start:stop]
        if suffix in (".jsonl", ".ndjson"):
            return _read_jsonl(p, want, start, stop)
        if suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            if isinstance(data, dict):      # {"rows": [...]} or {"train": [...]} with one list
                lists = [v for v in data.values() if isinstance(v, list)]
                data = lists[0] if len(lists) == 1 else data
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise DatasetError(f"{p}: a .json file must hold a list of objects; {want}")
            return data[start:stop]
    except OSError as e:
        raise DatasetError(f"{p}: cannot read ({e.strerror or e}); {want}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); {want}") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{p}: invalid JSON at line {e.lineno}, column {e.colno} ({e.msg}); {want}") from None
    raise DatasetError(f"{p}: unknown file type {suffix or '(no extension)'!r}; use .jsonl, .json or "
                       f".parquet ({want})")


def _read_jsonl(p: Path, want: str, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
    rows = []
    index = -1                                 # of the row, counting non-empty lines
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            index += 1
            if index < start:
                continue
            if stop is not None and index >= stop:
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{p}: line {n} is not valid JSON ({e.msg}); {want}, one JSON object "
                                   "per line") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{p}: line {n} is a JSON {type(row).__name__}, not an object; {want}")
            rows.append(row)
    return rows


def _read_parquet(p: Path, want: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{p}: reading .parquet files needs pyarrow, which is not installed: "
                           "`pip install pyarrow`, or convert the file to .jsonl") from None
    try:
        return pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises its own types for corrupt files
        raise DatasetError(f"{p}: not a readable parquet file ({type(e).__name__}: {e}); {want}") from None


def _require(rows: list[dict[str, Any]], path: Any, needs: Sequence[Sequence[str]], fields_doc: str,
             offset: int = 0) -> None:
    """Every row has, for each group in `needs`, at least one of its field names."""
    if not rows:
        raise DatasetError(f"{path}: no rows (in the slice asked for); expected rows with {fields_doc}")
    for i, row in enumerate(rows, offset):
        missing = [" or ".join(g) for g in needs if not any(k in row for k in g)]
        if missing:
            raise DatasetError(f"{path}: row {i} has no field {', '.join(missing)} (it has: "
                               f"{', '.join(sorted(row)) or 'nothing'}); expected rows with {fields_doc}")


def _first(row: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if row.get(k) is not None:
            return row[k]
    return None


def _json_field(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _io_text(value: Any) -> str:
    """A stdin or expected-stdout cell: a string, or a list of lines."""
    s = _text(value)
    return s if s.endswith("\n") or not s else s + "\n"


class _Skips:
    """Counts rows that had the fields but no usable content, remembering the first reason."""

    def __init__(self, path: Any):
        self.path, self.count, self.first = path, 0, ""

    def add(self, i: int, why: str) -> None:
        self.count += 1
        self.first = self.first or f"row {i}: {why}"

    def finish(self, kept: int, fields_doc: str) -> None:
        if not kept:
            raise DatasetError(f"{self.path}: no usable problem in the file ({self.count} rows skipped; "
                               f"{self.first}); expected rows with {fields_doc}")
        if self.count:
            log.warning("%s: skipped %d of %d rows without usable content (%s)", self.path, self.count,
                        self.count + kept, self.first)


# ---- code datasets ----------------------------------------------------------------------------

SAMPLE_CODE_FIELDS = "id, kind (stdin or function), statement, tests [{input, output}], solution (optional), fn_name (function problems)"
APPS_FIELDS = "question, input_output (JSON with inputs, outputs and optional fn_name), solutions (JSON list, optional), starter_code (optional), problem_id (optional)"
CC_FIELDS = "description, public_tests / private_tests / generated_tests ({input: [...], output: [...]}), solutions ({language: [...], solution: [...]}, optional), name (optional)"
LCB_FIELDS = "question_content, public_test_cases, private_test_cases (JSON lists of {input, output, testtype}), starter_code, metadata (JSON with func_name), question_id (optional)"
PETTING_CODE_FIELDS = "question, test_input (list), test_output (list), solution (optional)"


def _function_tests(path: Any, i: int, args_list: Sequence[Any], outputs: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    tests = []
    for args, out in zip(args_list, outputs, strict=False):
        if not isinstance(args, list):
            raise ValueError(f"function-call inputs must be lists of arguments, got {type(args).__name__}")
        tests.append((args_stdin(args), canonical_json(out) + "\n"))
    return tuple(tests)


def _load_sample_code(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(rows, path, [("id",), ("statement",), ("tests",)], SAMPLE_CODE_FIELDS, offset)
    out = []
    for i, r in enumerate(rows, offset):
        kind = r.get("kind", "stdin")
        tests = r["tests"]
        if kind not in ("stdin", "function") or not isinstance(tests, list) or not tests:
            raise DatasetError(f"{path}: row {i} ({r['id']}): kind must be stdin or function and tests a "
                               f"non-empty list; expected rows with {SAMPLE_CODE_FIELDS}")
        if kind == "function":
            if not r.get("fn_name"):
                raise DatasetError(f"{path}: row {i} ({r['id']}): a function problem needs fn_name")
            run = _function_tests(path, i, [t["input"] for t in tests], [t["output"] for t in tests])
        else:
            run = tuple((_io_text(t["input"]), _io_text(t["output"])) for t in tests)
        out.append(CodeProblem(str(r["id"]), str(r["statement"]), kind, run, str(r.get("solution") or ""),
                               str(r.get("fn_name") or ""), str(r.get("starter_code") or ""),
                               str(r.get("compare") or "whitespace"), "sample"))
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
                tests = tuple((_io_text(a), _io_text(b)) for a, b in zip(inputs, outputs, strict=True))
            sols = _json_field(r.get("solutions") or "[]") or []
        except (ValueError, TypeError, AttributeError) as e:
            skips.add(i, f"undecodable input_output or solutions ({e})")
            continue
        pid = r.get("problem_id", i)
        out.append(CodeProblem(f"apps-{pid}", _text(r["question"]).strip(), "function" if fn else "stdin",
                               tests, str(sols[0]) if sols else "", fn, _text(r.get("starter_code")),
                               source="apps"))
    skips.finish(len(out), APPS_FIELDS)
    return out


_PY3 = (3, "3", "PYTHON3", "python3")


def _load_code_contests(rows: list[dict[str, Any]], path: Any, test_sets: Sequence[str], offset: int = 0) -> list[CodeProblem]:
    _require(rows, path, [("description",), ("public_tests", "private_tests", "generated_tests")], CC_FIELDS, offset)
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        tests: list[tuple[str, str]] = []
        try:
            for which in test_sets:
                t = r.get(f"{which}_tests") or {}
                tests += [(_io_text(a), _io_text(b)) for a, b in zip(t.get("input") or [], t.get("output") or [], strict=True)]
            sols = r.get("solutions") or {}
            solution = next((s for lang, s in zip(sols.get("language") or [], sols.get("solution") or [], strict=False)
                             if lang in _PY3), "")
        except (ValueError, TypeError, AttributeError) as e:
            skips.add(i, f"malformed tests or solutions ({e})")
            continue
        if not tests:
            skips.add(i, f"no {'/'.join(test_sets)} tests")
            continue
        name = str(r.get("name") or i).split(".")[0].strip().replace(" ", "_")
        out.append(CodeProblem(f"cc-{name}", _text(r["description"]).strip(), "stdin", tuple(tests), solution,
                               source="code_contests"))
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
    raw = d.decompress(base64.b64decode(text.encode("ascii"), validate=False), MAX_DECOMPRESSED_BYTES)
    if d.unconsumed_tail:
        raise ValueError(f"compressed test cases expand past {MAX_DECOMPRESSED_BYTES} bytes")
    inner = _NoGlobals(io.BytesIO(raw)).load()
    return json.loads(inner) if isinstance(inner, (str, bytes)) else inner


def _load_lcb(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(rows, path, [("question_content",), ("public_test_cases", "private_test_cases")], LCB_FIELDS, offset)
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        try:
            cases = decode_lcb_tests(r.get("public_test_cases")) + decode_lcb_tests(r.get("private_test_cases"))
            meta = _json_field(r.get("metadata") or "{}") or {}
            functional = bool(cases) and cases[0].get("testtype") == "functional"
            fn = str(meta.get("func_name") or "")
            if functional:
                if not fn:
                    skips.add(i, "functional tests without metadata.func_name")
                    continue
                args = [[json.loads(line) for line in str(c["input"]).split("\n") if line.strip()] for c in cases]
                tests = _function_tests(path, i, args, [json.loads(c["output"]) for c in cases])
            else:
                tests = tuple((_io_text(c["input"]), _io_text(c["output"])) for c in cases)
        except (ValueError, TypeError, KeyError, AttributeError, pickle.UnpicklingError, zlib.error, EOFError) as e:
            skips.add(i, f"undecodable test cases or metadata ({type(e).__name__}: {e})")
            continue
        if not tests:
            skips.add(i, "no test cases")
            continue
        title = _text(r.get("question_title")).strip()
        statement = _text(r["question_content"]).strip()
        qid = r.get("question_id") or i
        out.append(CodeProblem(f"lcb-{qid}", f"{title}\n\n{statement}" if title else statement,
                               "function" if functional else "stdin", tests, "", fn if functional else "",
                               _text(r.get("starter_code")), source="livecodebench"))
    skips.finish(len(out), LCB_FIELDS)
    return out


def _load_petting_code(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[CodeProblem]:
    _require(rows, path, [("question",), ("test_input",), ("test_output",)], PETTING_CODE_FIELDS, offset)
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        ins, outs = list(r["test_input"] or []), list(r["test_output"] or [])
        if not ins or len(ins) != len(outs):
            skips.add(i, "test_input and test_output are empty or differ in length")
            continue
        out.append(CodeProblem(f"code-{i}", _text(r["question"]).strip(), "stdin",
                               tuple((_io_text(a), _io_text(b)) for a, b in zip(ins, outs, strict=True)),
                               _text(r.get("solution")), source="pettingllms"))
    skips.finish(len(out), PETTING_CODE_FIELDS)
    return out


# ---- math datasets ----------------------------------------------------------------------------

SAMPLE_MATH_FIELDS = "id, question, answer"
AIME_FIELDS = "problem (or Problem, question), answer (or Answer), id (optional)"
OLYMPIAD_FIELDS = "question, final_answer (a list), is_multiple_answer (optional), context (optional), id (optional)"
PETTING_MATH_FIELDS = "question, solution (the final answer)"


def _strip_dollars(s: str) -> str:
    """An answer without its math-mode dollars: `$2$, $3$` -> `2, 3` (an escaped \\$ stays)."""
    return re.sub(r"(?<!\\)\$", "", s).strip()


def _load_generic_math(rows: list[dict[str, Any]], path: Any, source: str, offset: int = 0) -> list[MathProblem]:
    _require(rows, path, [("problem", "Problem", "question", "Question"), ("answer", "Answer")], AIME_FIELDS, offset)
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        q, a = _first(r, "problem", "Problem", "question", "Question"), _first(r, "answer", "Answer")
        if q is None or a is None or not str(a).strip():
            skips.add(i, "empty problem or answer")
            continue
        pid = _first(r, "id", "ID", "problem_id")
        out.append(MathProblem(f"{source}-{pid if pid is not None else i}", str(q).strip(),
                               _strip_dollars(str(a)), source))
    skips.finish(len(out), AIME_FIELDS)
    return out


def _load_olympiad(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[MathProblem]:
    _require(rows, path, [("question",), ("final_answer",)], OLYMPIAD_FIELDS, offset)
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        if r.get("image_1"):
            skips.add(i, "a multimodal problem (image_1 is set)")
            continue
        answers = r["final_answer"]
        answers = [answers] if isinstance(answers, str) else list(answers or [])
        answers = [_strip_dollars(str(a)) for a in answers if str(a).strip()]
        if not answers:
            skips.add(i, "empty final_answer")
            continue
        question = str(r["question"]).strip()
        if r.get("context"):
            question = f"{str(r['context']).strip()}\n\n{question}"
        out.append(MathProblem(f"olympiadbench-{r.get('id', i)}", question, ", ".join(answers), "olympiadbench"))
    skips.finish(len(out), OLYMPIAD_FIELDS)
    return out


def _load_petting_math(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[MathProblem]:
    _require(rows, path, [("question",), ("solution",)], PETTING_MATH_FIELDS, offset)
    return [MathProblem(f"math-{i}", str(r["question"]).strip(), _strip_dollars(str(r["solution"])), "pettingllms")
            for i, r in enumerate(rows, offset) if str(r.get("solution") or "").strip()]


def _load_sample_math(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[MathProblem]:
    _require(rows, path, [("id",), ("question",), ("answer",)], SAMPLE_MATH_FIELDS, offset)
    return [MathProblem(str(r["id"]), str(r["question"]), str(r["answer"]), "sample") for r in rows]


# ---- the registry of formats ------------------------------------------------------------------

CODE_DATASETS: dict[str, tuple[str, Any]] = {
    "sample": (SAMPLE_CODE_FIELDS, _load_sample_code),
    "apps": (APPS_FIELDS, _load_apps),
    "code_contests": (CC_FIELDS, _load_code_contests),
    "livecodebench": (LCB_FIELDS, _load_lcb),
    "pettingllms": (PETTING_CODE_FIELDS, _load_petting_code),
}
MATH_DATASETS: dict[str, tuple[str, Any]] = {
    "sample": (SAMPLE_MATH_FIELDS, _load_sample_math),
    "aime": (AIME_FIELDS, functools.partial(_load_generic_math, source="aime")),
    "math": (AIME_FIELDS, functools.partial(_load_generic_math, source="math")),
    "olympiadbench": (OLYMPIAD_FIELDS, _load_olympiad),
    "pettingllms": (PETTING_MATH_FIELDS, _load_petting_math),
}
ALIASES = {"codecontests": "code_contests", "code-contests": "code_contests", "cc": "code_contests",
           "lcb": "livecodebench", "live_code_bench": "livecodebench", "aime2024": "aime", "aime2025": "aime",
           "aime24": "aime", "aime25": "aime", "aime_2024": "aime", "aime_2025": "aime",
           "olympiad_bench": "olympiadbench", "olympiad": "olympiadbench", "polaris": "math"}
CC_TEST_SETS = ("public", "private", "generated")


@dataclass(frozen=True)
class Source:
    """Where one split's problems come from."""

    dataset: str = "sample"
    path: str = ""
    start: int = 0
    stop: int | None = None
    tests: tuple[str, ...] = ("public", "private")     # code_contests: which test sets are hidden tests


def sources(options: Mapping[str, Any], kind: str) -> dict[str, Source]:
    """The source of each split from an env's options: `dataset`, `path`, `start`, `stop` (and
    `tests` for code_contests) for every split, overridden per split by `train: {...}` and
    `eval: {...}`. ValueError says what is wrong (the host turns it into INVALID_ARGUMENT)."""
    known = CODE_DATASETS if kind == "code" else MATH_DATASETS
    base = {k: options[k] for k in ("dataset", "path", "start", "stop", "tests") if k in options}
    out = {}
    for split in SPLITS:
        per = options.get(split) or {}
        if not isinstance(per, Mapping):
            raise ValueError(f"option {split!r} must be a mapping like {{dataset: apps, path: FILE}}, got {per!r}")
        unknown = set(per) - {"dataset", "path", "start", "stop", "tests"}
        if unknown:
            raise ValueError(f"option {split}: unknown keys {sorted(unknown)}; use dataset, path, start, stop, tests")
        spec = {**base, **per}
        name = str(spec.get("dataset", "sample")).lower()
        name = ALIASES.get(name, name)
        if name not in known:
            raise ValueError(f"unknown {kind} dataset {spec.get('dataset')!r}; use one of {sorted(known)}")
        path = str(spec.get("path") or "")
        if name != "sample" and not path:
            raise ValueError(f"dataset {name!r} for the {split} split needs `path`: a local .jsonl, .json or "
                             f".parquet file with {known[name][0]}")
        start, stop = int(spec.get("start") or 0), spec.get("stop")
        stop = None if stop is None else int(stop)
        if start < 0 or (stop is not None and stop <= start):
            raise ValueError(f"option {split}: start {start} and stop {stop} must satisfy 0 <= start < stop")
        tests = tuple(spec.get("tests") or ("public", "private"))
        if bad := [t for t in tests if t not in CC_TEST_SETS]:
            raise ValueError(f"option tests: unknown test sets {bad}; use some of {list(CC_TEST_SETS)}")
        out[split] = Source(name, path, start, stop, tests)
    return out


def load(kind: str, source: Source, split: str) -> tuple[CodeProblem, ...] | tuple[MathProblem, ...]:
    """The problems of one split (cached; raises DatasetError for a bad file)."""
    name = ALIASES.get(source.dataset.lower(), source.dataset.lower())
    if name not in (CODE_DATASETS if kind == "code" else MATH_DATASETS):
        raise DatasetError(f"unknown {kind} dataset {source.dataset!r}")
    source = dataclasses.replace(source, dataset=name)
    if source.dataset == "sample":
        path = DATA_DIR / f"{kind}_{split}.jsonl"
    else:
        path = Path(source.path).expanduser()
    try:
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = (-1, -1)      # read_rows reports the missing file
    return _load_cached(kind, source, str(path), stamp)


@functools.lru_cache(maxsize=32)
def _load_cached(kind: str, source: Source, path: str, stamp: tuple[int, int]) -> tuple[Any, ...]:
    table = CODE_DATASETS if kind == "code" else MATH_DATASETS
    fields_doc, loader = table[source.dataset]
    rows = read_rows(path, fields_doc, source.start, source.stop)
    if source.dataset == "code_contests":
        problems = loader(rows, path, source.tests, offset=source.start)
    else:
        problems = loader(rows, path, offset=source.start)
    return tuple(problems)


def pick(problems: Sequence[Any], task_id: str, seed: int, split: str, eval_offset: int) -> Any:
    """The problem of a task: the one whose id is `task_id` if any, else the seed's.

    Consecutive seeds walk the split once per epoch: training in a seeded shuffled order per
    epoch, evaluation in file order (eval seeds start at `eval_offset`, so the first N evaluation
    tasks are the first N problems).
    """
    for p in problems:
        if p.id == task_id:
            return p
    n = len(problems)
    index = seed - eval_offset if split == "eval" and seed >= eval_offset else seed
    epoch, pos = divmod(abs(index), n)
    if split == "eval":
        return problems[pos]
    order = list(range(n))
    random.Random(f"{split}:{epoch}").shuffle(order)
    return problems[order[pos]]
