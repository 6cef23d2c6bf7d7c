"""Print atgrpo's dependencies (the core plus the named extras) from pyproject.toml, one a line.

The images install these in a layer of their own before the source is copied, so a change to
the code does not reinstall torch or vLLM:

    python requirements.py [--pyproject FILE] [EXTRA ...] > requirements.txt
"""

from __future__ import annotations

import argparse
import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(
            f"requirements.py: no extra {', '.join(unknown)} in pyproject.toml; "
            f"extras are {', '.join(sorted(optional))}"
        )
    out = list(project.get("dependencies", []))
    for extra in extras:
        out += [r for r in optional[extra] if r not in out]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyproject", default="pyproject.toml")
    ap.add_argument("extras", nargs="*")
    args = ap.parse_args(argv)
    with open(args.pyproject, "rb") as f:
        print("\n".join(requirements(tomllib.load(f), args.extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
