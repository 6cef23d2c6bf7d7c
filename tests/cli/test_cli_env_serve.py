"""`atgrpo <sub> --help` for every subcommand, and `atgrpo env serve`'s arguments reaching
serve_main."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

import atgrpo.sdk.serve
from atgrpo.cli import build_parser, main


def subcommands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command path the parser accepts (`env`, `env serve`, ...), nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from subcommands(sub, (*prefix, name))


COMMANDS = sorted(subcommands(build_parser()))


def test_the_walk_finds_the_nested_commands():
    assert {("env", "serve"), ("model", "tiny"), ("config", "check"), ("up",), ("train",)} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_exits_0_with_the_usage(command, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, flag])
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.err
    assert out.out.startswith("usage: atgrpo " + " ".join(command))


def test_env_serve_passes_every_argument_in_order(monkeypatch):
    seen = []
    monkeypatch.setattr(atgrpo.sdk.serve, "serve_main", seen.append)
    argv = ["--port", "0", "pkg.mod:Env", "--sandbox", "127.0.0.1:1", "--max-episodes", "5"]
    assert main(["env", "serve", *argv]) == 0
    assert seen == [argv]


def test_other_commands_still_refuse_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plot", "run", "--no-such-flag"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
