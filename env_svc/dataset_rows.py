"""What every dataset loader shares: the problem types, DatasetError, reading a file's rows
(.jsonl, .json, .parquet; gzipped .jsonl.gz and .json.gz too), checking that rows have the fields
a format needs, and counting the rows skipped. The formats themselves are in code_formats.py and
math_formats.py; env_svc/datasets.py lists them and loads a split.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class DatasetError(ValueError):
    """A dataset file that is missing, unreadable or not in the expected format."""


@dataclass(frozen=True)
class CodeProblem:
    id: str
    statement: str
    kind: str  # "stdin" | "function"
    tests: tuple[tuple[str, str], ...]  # hidden tests in run form: (stdin, expected stdout)
    solution: str = ""  # a reference Python 3 solution; "" when none
    fn_name: str = ""  # function problems: the function (or Solution method)
    starter_code: str = ""
    compare: str = "whitespace"  # "whitespace" | "float" (numeric tokens within 1e-6)
    source: str = ""
    # HumanEval-style judging: Python test code defining check(candidate). When set, `tests` is the
    # one case of the check program (code_check.py) and starter_code the code the answer completes.
    check: str = ""


@dataclass(frozen=True)
class MathProblem:
    id: str
    question: str
    answer: str
    source: str = ""


# ---- reading files ----------------------------------------------------------------------------


def read_rows(
    path: str | os.PathLike[str], fields_doc: str, start: int = 0, stop: int | None = None
) -> list[dict[str, Any]]:
    """Rows start..stop of a .jsonl / .json / .parquet file (JSON files may be gzipped: a name
    ending .gz), or DatasetError naming the path and the fields expected (`fields_doc`). JSON lines
    outside the slice are not parsed."""
    p = Path(path).expanduser()
    want = f"expected rows with {fields_doc}"
    if not p.exists():
        raise DatasetError(f"{p}: no such file; {want} (.jsonl, .json or .parquet)")
    if p.is_dir():
        raise DatasetError(
            f"{p}: is a directory; give the path of one .jsonl, .json or .parquet file ({want})"
        )
    gz = p.suffix.lower() == ".gz"
    suffix = Path(p.stem).suffix.lower() if gz else p.suffix.lower()
    try:
        if suffix == ".parquet" and not gz:
            return _read_parquet(p, want)[start:stop]
        if suffix in (".jsonl", ".ndjson"):
            return _read_jsonl(p, want, start, stop)
        if suffix == ".json":
            with _open_text(p) as f:
                data = json.loads(f.read())
            if isinstance(data, dict):  # {"rows": [...]} or {"train": [...]} with one list
                lists = [v for v in data.values() if isinstance(v, list)]
                data = lists[0] if len(lists) == 1 else data
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise DatasetError(f"{p}: a .json file must hold a list of objects; {want}")
            return data[start:stop]
    except OSError as e:
        raise DatasetError(f"{p}: cannot read ({e.strerror or e}); {want}") from None
    except (EOFError, zlib.error) as e:  # a truncated or corrupt .gz
        raise DatasetError(f"{p}: cannot read ({e}); {want}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); {want}") from None
    except json.JSONDecodeError as e:
        raise DatasetError(
            f"{p}: invalid JSON at line {e.lineno}, column {e.colno} ({e.msg}); {want}"
        ) from None
    kind = suffix + ".gz" if gz else suffix
    raise DatasetError(
        f"{p}: unknown file type {kind or '(no extension)'!r}; use .jsonl, .json or "
        f".parquet, or .jsonl.gz / .json.gz ({want})"
    )


def _open_text(p: Path) -> Any:
    """A text stream of the file, decompressed when its name ends .gz (HumanEval ships gzipped)."""
    if p.suffix.lower() == ".gz":
        return gzip.open(p, "rt", encoding="utf-8")
    return p.open(encoding="utf-8")


def _read_jsonl(
    p: Path, want: str, start: int = 0, stop: int | None = None
) -> list[dict[str, Any]]:
    rows = []
    index = -1  # of the row, counting non-empty lines
    with _open_text(p) as f:
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
                raise DatasetError(
                    f"{p}: line {n} is not valid JSON ({e.msg}); {want}, one JSON object per line"
                ) from None
            if not isinstance(row, dict):
                raise DatasetError(
                    f"{p}: line {n} is a JSON {type(row).__name__}, not an object; {want}"
                )
            rows.append(row)
    return rows


def _read_parquet(p: Path, want: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"{p}: reading .parquet files needs pyarrow, which is not installed: "
            "`pip install pyarrow`, or convert the file to .jsonl"
        ) from None
    try:
        return pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises its own types for corrupt files
        raise DatasetError(
            f"{p}: not a readable parquet file ({type(e).__name__}: {e}); {want}"
        ) from None


def _require(
    rows: list[dict[str, Any]],
    path: Any,
    needs: Sequence[Sequence[str]],
    fields_doc: str,
    offset: int = 0,
) -> None:
    """Every row has, for each group in `needs`, at least one of its field names."""
    if not rows:
        raise DatasetError(
            f"{path}: no rows (in the slice asked for); expected rows with {fields_doc}"
        )
    for i, row in enumerate(rows, offset):
        missing = [" or ".join(g) for g in needs if not any(k in row for k in g)]
        if missing:
            raise DatasetError(
                f"{path}: row {i} has no field {', '.join(missing)} (it has: "
                f"{', '.join(sorted(row)) or 'nothing'}); expected rows with {fields_doc}"
            )


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
            raise DatasetError(
                f"{self.path}: no usable problem in the file ({self.count} rows skipped; "
                f"{self.first}); expected rows with {fields_doc}"
            )
        if self.count:
            log.warning(
                "%s: skipped %d of %d rows without usable content (%s)",
                self.path,
                self.count,
                self.count + kept,
                self.first,
            )
