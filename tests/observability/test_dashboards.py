"""The Grafana dashboards: they parse, are laid out as Grafana expects, and every query names
only metrics that atgrpo's code exports (a renamed metric fails here, not on a blank panel)."""

from __future__ import annotations

import json

import pytest

from tests.observability.conftest import DASHBOARDS
from tests.observability.exported import (
    OTHER_SERIES,
    exported_families,
    exported_series,
    metric_names,
    series_names,
)


def targets(board: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of a dashboard."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def test_the_two_dashboards_ship():
    boards = {json.loads(p.read_text())["uid"]: p for p in DASHBOARDS}
    assert set(boards) == {"atgrpo-training", "atgrpo-system"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path):
    board = json.loads(path.read_text())
    assert board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"  # works with any Prometheus data source
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    for title, expr in targets(board):
        for var in ("$run", "$agent", "$pool"):
            if var in expr:
                assert var[1:] in variables, f"{title}: {var} is not a variable of {path.name}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_name_exported_metrics(path):
    known = exported_series()
    for title, expr in targets(json.loads(path.read_text())):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= known, (
            f"{path.name}, panel {title!r}: {sorted(names - known)} not exported by atgrpo"
        )


def test_the_dashboards_cover_the_metrics():
    """Every atgrpo family appears on a dashboard (the process_* / python_* defaults need not)."""
    used = {
        n
        for p in DASHBOARDS
        for _, e in targets(json.loads(p.read_text()))
        for n in metric_names(e)
    }
    missing = [
        name
        for name, kind in exported_families().items()
        if name.startswith("atgrpo_") and not series_names(name, kind) & used
    ]
    assert not missing, f"metrics on no dashboard: {missing}"
    assert OTHER_SERIES.keys() <= used


def test_metric_names_reads_promql():
    expr = (
        'histogram_quantile(0.95, sum by (le, pool) (rate(a_bucket{pool=~"$pool", '
        'x="b_c"}[$__rate_interval])))'
        " / on (pool) group_left sum without (le) (b_total offset 5m) * 1e3 > bool 2 or vector(0)"
    )
    assert metric_names(expr) == {"a_bucket", "b_total"}
    assert metric_names(
        'time() - max by (run) (last_ts{run=~"$run"}) > 1800 and on (run) (s == 1)'
    ) == {"last_ts", "s"}
