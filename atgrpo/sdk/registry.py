"""Where environment classes are found: built-ins, explicit registrations, and installed
packages' entry points (group `atgrpo.envs`, `name = "package.module:Class"`), so a third party
adds an environment with `pip install` and no change to atgrpo."""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

from atgrpo.errors import InvalidArgument, NotFound
from atgrpo.sdk.env import Environment

ENTRY_POINT_GROUP = "atgrpo.envs"


def load_class(path: str) -> type[Environment]:
    """Import "package.module:Class" and check that it is an Environment."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(
            f"{path!r} is not an environment path; write it as 'package.module:ClassName'"
        )
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise NotFound(
            f"cannot load environment {path!r} ({type(err).__name__}: {err}). Install the "
            "package that holds it, or run from the folder its module imports from (or put that "
            "folder on PYTHONPATH), and check the class name"
        ) from None
    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise InvalidArgument(f"{path!r} is not a subclass of atgrpo.sdk.Environment")
    return obj


def discovered() -> dict[str, str]:
    """Installed packages' entry points, and atgrpo's own built-ins even when atgrpo runs from a
    source tree that was never installed (a GPU machine that got the tree as files has no
    dist-info, so no entry points: the built-ins are read from the tree's pyproject.toml, the one
    list an install would have registered)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    try:
        distribution("atgrpo")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        if pyproject.exists():
            table = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {})
            found = {**table.get(ENTRY_POINT_GROUP, {}), **found}
    return found


class Registry:
    """Environment name -> class, loaded on first use (an env's heavy imports wait until needed)."""

    def __init__(self, paths: Mapping[str, str] | None = None, *, discover: bool = True):
        self._paths: dict[str, str] = dict(paths or {})
        self._classes: dict[str, type[Environment]] = {}
        if discover:
            for name, value in discovered().items():
                self._paths.setdefault(name, value)

    def register(self, cls: type[Environment], name: str | None = None) -> type[Environment]:
        name = name or cls.name
        if not name:
            raise InvalidArgument(
                f"{cls.__name__} has no `name`; set the class attribute or pass name="
            )
        self._classes[name] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(set(self._paths) | set(self._classes))

    def get(self, name: str) -> type[Environment]:
        if name not in self._classes:
            if name not in self._paths:
                raise NotFound(
                    f"no environment named {name!r}; available: {', '.join(self.names()) or 'none'}"
                )
            self._classes[name] = load_class(self._paths[name])
        return self._classes[name]


def import_from_here() -> None:
    """Let the folder this process runs in import, as `atgrpo train` finds an env.path there (its
    env service runs as `python -m`, which puts that folder first); a console script does not."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def registry_for(target: str | type[Environment]) -> tuple[str, Registry]:
    """(name, registry) that hold `target`: an Environment class or 'package.module:Class' (alone,
    under its `name`), or the name of an installed env (the entry points)."""
    if isinstance(target, str) and ":" not in target:
        return target, Registry()
    cls = load_class(target) if isinstance(target, str) else target
    name = cls.name or cls.__name__
    registry = Registry(discover=False)
    registry.register(cls, name)
    return name, registry
