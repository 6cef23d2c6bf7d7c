"""Fixtures for the observability checks: Debian's prometheus and promtool (DESIGN.md §5).

A missing binary is a failure that says how to get it, never a skip: CI must run these checks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "atgrpo"
RULE_FILES = sorted((CHART / "rules").glob("*.yaml"))
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
RULES_TEST = Path(__file__).resolve().parent / "rules_test.yaml"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"{binary} is not installed: run `make install` (scripts/install_system_packages.sh "
            "installs Debian's prometheus package, which brings prometheus and promtool)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return require("promtool")


@pytest.fixture(scope="session")
def prometheus() -> str:
    return require("prometheus")
