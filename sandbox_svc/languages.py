"""How each language's program is laid out and started inside the sandbox working directory."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    name: str
    filename: str  # the program is written here, in the working directory
    argv: tuple[str, ...]  # run from the working directory, PATH=/usr/bin
    # Text in stderr that means the program ran out of memory (rlimit on the address space).
    oom_markers: tuple[bytes, ...] = ()


LANGUAGES: dict[str, Language] = {
    # -I: isolated mode (no user site, no PYTHON* variables, script dir not trusted);
    # -B: no .pyc written into the working directory.
    "python": Language("python", "main.py", ("python3", "-I", "-B", "main.py"), (b"MemoryError",)),
}
