"""The math dataset formats (sample, AIME and other problem/answer files, OlympiadBench,
PettingLLMs' files), each a loader from a file's rows to MathProblems. The registry is in
env_svc/datasets.py.
"""

from __future__ import annotations

import re
from typing import Any

from env_svc.dataset_rows import MathProblem, _first, _require, _Skips

# ---- math datasets ----------------------------------------------------------------------------

SAMPLE_MATH_FIELDS = "id, question, answer"
AIME_FIELDS = "problem (or Problem, question), answer (or Answer), id (optional)"
OLYMPIAD_FIELDS = (
    "question, final_answer (a list), is_multiple_answer (optional), context (optional), "
    "id (optional)"
)
PETTING_MATH_FIELDS = "question, solution (the final answer)"


def _strip_dollars(s: str) -> str:
    """An answer without its math-mode dollars: `$2$, $3$` -> `2, 3` (an escaped \\$ stays)."""
    return re.sub(r"(?<!\\)\$", "", s).strip()


def _load_generic_math(
    rows: list[dict[str, Any]], path: Any, source: str, offset: int = 0
) -> list[MathProblem]:
    _require(
        rows,
        path,
        [("problem", "Problem", "question", "Question"), ("answer", "Answer")],
        AIME_FIELDS,
        offset,
    )
    out, skips = [], _Skips(path)
    for i, r in enumerate(rows, offset):
        q, a = (
            _first(r, "problem", "Problem", "question", "Question"),
            _first(r, "answer", "Answer"),
        )
        if q is None or a is None or not str(a).strip():
            skips.add(i, "empty problem or answer")
            continue
        pid = _first(r, "id", "ID", "problem_id")
        out.append(
            MathProblem(
                f"{source}-{pid if pid is not None else i}",
                str(q).strip(),
                _strip_dollars(str(a)),
                source,
            )
        )
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
        out.append(
            MathProblem(
                f"olympiadbench-{r.get('id', i)}", question, ", ".join(answers), "olympiadbench"
            )
        )
    skips.finish(len(out), OLYMPIAD_FIELDS)
    return out


def _load_petting_math(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[MathProblem]:
    _require(rows, path, [("question",), ("solution",)], PETTING_MATH_FIELDS, offset)
    return [
        MathProblem(
            f"math-{i}",
            str(r["question"]).strip(),
            _strip_dollars(str(r["solution"])),
            "pettingllms",
        )
        for i, r in enumerate(rows, offset)
        if str(r.get("solution") or "").strip()
    ]


def _load_sample_math(rows: list[dict[str, Any]], path: Any, offset: int = 0) -> list[MathProblem]:
    _require(rows, path, [("id",), ("question",), ("answer",)], SAMPLE_MATH_FIELDS, offset)
    return [MathProblem(str(r["id"]), str(r["question"]), str(r["answer"]), "sample") for r in rows]
