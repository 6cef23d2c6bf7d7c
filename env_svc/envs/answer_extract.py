"""Reading answers and programs out of model text: the last fenced Python block, the last
\\boxed{...}, a "Final answer: X" line, a tool program's last stdout line. Plain string work, no
parsing of mathematics (that is answer_latex.py, answer_expr.py and answers.py).

Model text is up to a megabyte (the env host's bound on an action), so every scan here is linear:
no regex can backtrack over a run of spaces (possessive `*+`), and the `{...}` after a \\boxed is
read for at most BRACED_CHARS characters, for the last MAX_BOXES boxes only.
"""

from __future__ import annotations

import re

# `[ \t]*+`: possessive, or "```" + a million spaces backtracks quadratically
_CODE_RE = re.compile(
    r"```[ \t]*+(python3?|py)?[ \t]*+\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE
)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*+\{")
BRACED_CHARS = 20_000
MAX_BOXES = 20


def extract_code(text: str) -> str | None:
    """The program in `text`: the last ```python block, else the last unlabeled ``` block; an
    unterminated last block counts. Text after a closing </think> is preferred when it has one."""
    if "</think>" in text:
        after = text.rsplit("</think>", 1)[1]
        if "```" in after:
            text = after
    blocks = [(lang, body) for lang, body in _CODE_RE.findall(text) if body.strip()]
    labeled = [b for lang, b in blocks if lang]
    if labeled:
        return labeled[-1]
    return blocks[-1][1] if blocks else None


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the {...} group opening at text[start], and the index after it."""
    depth = 0
    for i in range(start, min(len(text), start + BRACED_CHARS)):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue
        if text[i] == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif text[i] == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) in `text`, or None."""
    for m in reversed(list(_BOX_RE.finditer(text))[-MAX_BOXES:]):  # the last few only: bounded work
        got = _braced(text, m.end() - 1)
        if got is not None and got[0].strip():
            return got[0].strip()
    return None


# possessive `\s*+`: "answer" then a long run of spaces and no colon must fail in linear time
_FINAL_RE = re.compile(r"(?:final answer|answer)\s*+(?:is\s*+)?[:：]\s*(.+)", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The reasoner's final answer: the last \\boxed{...}, else the last "Final answer: X" line."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    for line in reversed(text.strip().splitlines()):
        m = _FINAL_RE.search(line)
        if m and m.group(1).strip():
            return m.group(1).strip().rstrip(".").strip().strip("$").strip()
    return None


def stdout_answer(stdout: str) -> str | None:
    """A tool program's answer: its last non-empty stdout line, unwrapped from \\boxed{} or
    `Answer:`. Whole, not cut: a long line is the judge's to refuse (too_large), and a number cut
    short would be another number."""
    last = next((ln.strip() for ln in reversed(stdout.splitlines()) if ln.strip()), None)
    if last is None:
        return None
    boxed = extract_boxed(last)
    if boxed is not None:
        return boxed
    m = _FINAL_RE.search(last)
    return m.group(1).strip() if m else last
