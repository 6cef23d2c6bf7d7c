"""A small Dockerfile reader for the image checks: instructions with their flags and arguments,
following the Dockerfile reference (parser directives, comments, `\\` continuations, JSON
(exec) form). It does not build anything: nothing can be pulled on CI machines."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

INSTRUCTIONS = {
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
}
JSON_FORM = {"CMD", "ENTRYPOINT", "RUN", "SHELL", "HEALTHCHECK", "VOLUME", "COPY", "ADD"}
_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(\S+)\s*$")


class DockerfileError(ValueError):
    pass


@dataclass
class Instruction:
    name: str
    args: str  # the text after the instruction and its --flags
    line: int
    flags: dict[str, str] = field(default_factory=dict)

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON array of CMD/ENTRYPOINT/RUN..., or None in shell form."""
        text = (
            self.args[len("CMD") :].strip()
            if self.name == "HEALTHCHECK" and self.args.startswith("CMD")
            else self.args
        )
        if not text.startswith("["):
            return None
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DockerfileError(
                f"line {self.line}: {self.name} JSON form must be an array of strings"
            )
        return value


@dataclass
class Dockerfile:
    directives: dict[str, str]
    instructions: list[Instruction]

    def stages(self) -> list[list[Instruction]]:
        """Instructions grouped by FROM (ARGs before the first FROM are stage -1's, dropped
        here)."""
        out: list[list[Instruction]] = []
        for ins in self.instructions:
            if ins.name == "FROM":
                out.append([])
            if out:
                out[-1].append(ins)
        return out

    def global_args(self) -> dict[str, str]:
        args = {}
        for ins in self.instructions:
            if ins.name == "FROM":
                break
            if ins.name == "ARG":
                name, _, default = ins.args.partition("=")
                args[name.strip()] = default.strip()
        return args


def _split_flags(rest: str) -> tuple[dict[str, str], str]:
    flags = {}
    while rest.startswith("--"):
        token, _, rest = rest.partition(" ")
        key, _, value = token[2:].partition("=")
        flags[key] = value
        rest = rest.lstrip()
    return flags, rest


def parse(text: str) -> Dockerfile:
    lines = text.splitlines()
    directives: dict[str, str] = {}
    i = 0
    # Parser directives: only at the very top, before any comment that is not one, or a blank line.
    while i < len(lines) and (m := _DIRECTIVE.match(lines[i])):
        directives[m.group(1).lower()] = m.group(2)
        i += 1
    escape = directives.get("escape", "\\")
    instructions: list[Instruction] = []
    while i < len(lines):
        start, line = i + 1, lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [line]
        while parts[-1].rstrip().endswith(escape):
            parts[-1] = parts[-1].rstrip()[:-1]
            # comments inside a continuation
            while i < len(lines) and lines[i].lstrip().startswith("#"):
                i += 1
            if i >= len(lines):
                raise DockerfileError(f"line {start}: the file ends inside a line continuation")
            parts.append(lines[i])
            i += 1
        logical = " ".join(p.strip() for p in parts)
        word, _, rest = logical.partition(" ")
        name = word.upper()
        if name not in INSTRUCTIONS:
            raise DockerfileError(f"line {start}: unknown instruction {word!r}")
        if "<<" in rest and name in ("RUN", "COPY"):
            raise DockerfileError(
                f"line {start}: heredocs are not read by this checker; avoid them"
            )
        flags, rest = _split_flags(rest.strip())
        ins = Instruction(name, rest, start, flags)
        if name in JSON_FORM:
            try:
                ins.exec_form  # noqa: B018 - parses the JSON or raises
            except json.JSONDecodeError as err:
                raise DockerfileError(
                    f"line {start}: {name} JSON form does not parse: {err}"
                ) from None
        if not rest and name not in ("HEALTHCHECK",):
            raise DockerfileError(f"line {start}: {name} has no arguments")
        instructions.append(ins)
    if not instructions or instructions[0].name not in ("FROM", "ARG"):
        raise DockerfileError("a Dockerfile must start with FROM (or ARGs for FROM)")
    return Dockerfile(directives, instructions)


def expand(text: str, args: dict[str, str]) -> str:
    """${NAME} and $NAME from build ARG defaults."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text
    )


def words(text: str) -> list[str]:
    return shlex.split(text)
