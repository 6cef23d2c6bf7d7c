"""Text helpers the environments that run model-written programs share."""

from __future__ import annotations

from typing import Any


def clip(text: str, n: int) -> str:
    """`text` shortened to about n characters, keeping its head and tail."""
    if len(text) <= n:
        return text
    half = max(n // 2, 1)
    return f"{text[:half]}...[{len(text) - 2 * half} chars cut]...{text[-half:]}"


def decode(data: Any) -> str:
    """A program's output as text (bytes decoded leniently)."""
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data or "")


def program_lines(out: dict[str, Any], stdout_label: str, stderr_label: str) -> list[str]:
    """How the tool agent's program of this turn and its output read in the next agent's prompt."""
    lines = []
    if out["code"]:
        lines.append(f"The tool agent's program this turn:\n```python\n{out['code']}\n```")
    if out["stdout"]:
        lines.append(f"{stdout_label}:\n{out['stdout']}")
    if out["stderr"]:
        lines.append(f"{stderr_label}:\n{out['stderr']}")
    return lines


def run_failure(result: Any, stderr: str) -> str | None:
    """What went wrong with a sandbox run of the tool agent's program, for its report; None when
    its verdict is ok."""
    verdict = getattr(
        getattr(result, "verdict", None), "value", str(getattr(result, "verdict", ""))
    )
    if verdict == "ok":
        return None
    tail = clip(stderr.strip().splitlines()[-1], 200) if stderr.strip() else "no stderr"
    what = {
        "timeout": "ran past its time limit",
        "memory_limit": "ran out of memory",
        "output_limit": "printed too much",
    }.get(verdict, f"failed (exit code {getattr(result, 'exit_code', '?')})")
    return f"the program {what}: {tail}"
