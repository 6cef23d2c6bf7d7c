"""LaTeX answer text to the plain syntax the tokenizer of answer_expr.py reads: \\frac, \\sqrt,
\\binom, \\log_b, \\text{...} and symbol commands are rewritten; any other command raises
AnswerError, so unknown LaTeX never reaches sympy. Commands nest at most MAX_DEPTH deep
(JudgeError too_deep): the scanner recurses into each argument, and each argument is scanned
once per level, so depth also bounds the work.
"""

from __future__ import annotations

import re

from env_svc.envs.answer_expr import _FUNCS
from env_svc.envs.answer_extract import _braced
from env_svc.envs.answer_limits import MAX_DEPTH, AnswerError, too_deep

_DROP_CMDS = {
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "displaystyle",
    "textstyle",
    ",",
    ";",
    ":",
    "!",
    " ",
    "quad",
    "qquad",
    "limits",
    "nolimits",
    "$",
    "%",
}
_SYMBOL_CMDS = {
    "cdot": "*",
    "times": "*",
    "ast": "*",
    "div": "/",
    "pi": "pi",
    "infty": "oo",
    "infinity": "oo",
    "cup": "∪",
    "{": "⦃",
    "}": "⦄",
    "lbrace": "⦃",
    "rbrace": "⦄",
    "lvert": "|",
    "rvert": "|",
    "mid": "|",
    "vert": "|",
    "circ": "",
    "degree": "",
    "prime": "'",
    "e": "e",
    "i": "i",
    "lt": "<",
    "gt": ">",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "ne": "≠",
    "neq": "≠",
    "pm": "±",
    "emptyset": "∅",
    "varnothing": "∅",
    "langle": "(",
    "rangle": ")",
    "dots": "…",
    "ldots": "…",
    "cdots": "…",
}
_TEXT_CMDS = {
    "text",
    "textbf",
    "textit",
    "textrm",
    "mathrm",
    "mathbf",
    "mathit",
    "operatorname",
    "mbox",
    "rm",
    "mathsf",
    "textsf",
    "boldsymbol",
    "bf",
    "it",
}
_CMD_RE = re.compile(r"\\([A-Za-z]+|.)")
_FRAC_CMDS = {"frac", "dfrac", "tfrac", "cfrac"}
_BINOM_CMDS = {"binom", "dbinom", "tbinom", "choose"}
_LOGS = ("ln", "log", "arcsin", "arccos", "arctan")


def _arg(s: str, i: int) -> tuple[str, int]:
    """One LaTeX macro argument at s[i:]: a {...} group or a single token."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise AnswerError("a LaTeX command is missing its argument")
    if s[i] == "{":
        got = _braced(s, i)
        if got is None:
            raise AnswerError("unbalanced braces")
        return got
    if s[i] == "\\":
        m = re.match(r"\\[A-Za-z]+", s[i:])
        if m:
            return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def _log_arg(s: str, i: int) -> tuple[str, int]:
    """The argument of \\log_b: a (...) or {...} group, or a run of letters, digits and dots."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] in "({":
        close = {"(": ")", "{": "}"}[s[i]]
        depth = 0
        for j in range(i, len(s)):
            depth += s[j] == s[i]
            depth -= s[j] == close
            if depth == 0:
                return s[i + 1 : j], j + 1
        raise AnswerError("unbalanced brackets after \\log")
    m = re.match(r"[0-9A-Za-z.]+", s[i:])
    if m is None:
        raise AnswerError("\\log_b without an argument")
    return m.group(0), i + len(m.group(0))


def latex_to_plain(s: str, depth: int = 0) -> str:
    """LaTeX answer text -> the plain syntax the tokenizer reads (`\\frac{a}{b}` -> `((a)/(b))`).
    Set braces become ⦃ ⦄, unions ∪; unsupported commands raise AnswerError."""
    if depth > MAX_DEPTH:
        raise too_deep("LaTeX")
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out.append({"{": "(", "}": ")"}.get(c, c))
            i += 1
            continue
        m = _CMD_RE.match(s, i)
        if m is None:
            i += 1
            continue
        name = m.group(1)
        i = m.end()
        if name in _FRAC_CMDS:
            a, i = _arg(s, i)
            b, i = _arg(s, i)
            out.append(f"(({latex_to_plain(a, depth + 1)})/({latex_to_plain(b, depth + 1)}))")
        elif name in _BINOM_CMDS:
            a, i = _arg(s, i)
            b, i = _arg(s, i)
            out.append(
                f"binomial(({latex_to_plain(a, depth + 1)}),({latex_to_plain(b, depth + 1)}))"
            )
        elif name == "sqrt":
            index = None
            j = i
            while j < len(s) and s[j] == " ":
                j += 1
            if j < len(s) and s[j] == "[":
                close = s.find("]", j)
                if close < 0:
                    raise AnswerError("\\sqrt[ without ]")
                index, i = s[j + 1 : close], close + 1
            a, i = _arg(s, i)
            inner = latex_to_plain(a, depth + 1)
            out.append(
                f"(({inner})^(1/({latex_to_plain(index, depth + 1)})))"
                if index
                else f"sqrt({inner})"
            )
        elif name in _TEXT_CMDS:
            a, i = _arg(s, i)
            words = a.strip()
            if words in _FUNCS or words in _LOGS:
                out.append(f" {words} ")  # \operatorname{sin}: a function, not a word to drop
            elif re.fullmatch(r"[A-Za-z ]*", words) and len(words.replace(" ", "")) > 1:
                out.append(f" ⟦{words}⟧ ")  # words: units, or a text answer (decided later)
            else:
                out.append(latex_to_plain(a, depth + 1))
        elif name in ("left", "right") and i < len(s) and s[i] == ".":
            i += 1
        elif name in _DROP_CMDS:
            pass
        elif name in _SYMBOL_CMDS:
            out.append(_SYMBOL_CMDS[name])
        elif name == "log" and s[i : i + 1] == "_":
            base, i = _arg(s, i + 1)
            x, i = _log_arg(s, i)
            out.append(
                f"(log({latex_to_plain(x, depth + 1)})/log({latex_to_plain(base, depth + 1)}))"
            )
        elif name in _FUNCS or name in _LOGS:
            out.append(f" {name} ")
        else:
            raise AnswerError(f"unsupported LaTeX command \\{name}")
    return "".join(out)
