"""Reward integrity of the reasoning-gym scorer worker's seal (env_svc/envs/rg_seal.py): a scorer
that runs its answer (`rg_probe`, standing in for one nobody audited) reaches nothing of the env
service, leaves nothing for the next call, echoes nothing, and is never run unsealed.

The probes (tests/env/rg_seal_probes.py) each score HELD where the seal held. Before the seal, as
root (the child dropped to uid 65534), every probe but signalling the env service got out: the
env's secret, /proc, a host unix socket's path, unix and TCP sockets, kill(-1), the keyring, and a
SysV segment the next call found.
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import reasoning_gym as rg

from atgrpo.sdk.judge import JudgeError
from env_svc.envs import rg_scorer, rg_seal
from tests.env import rg_probe
from tests.env.rg_seal_probes import BREAKS, HELD, SHM_KEY, run_probes

CHART_UID = 10001  # helm/atgrpo/values.yaml: podSecurityContext.runAsUser
ROOT = rg_scorer.ROOT


def held(scores: dict) -> None:
    assert scores["reference"] == 1.0, scores  # the seal took hold and the scorer ran
    assert scores["shm_made"] == 0.5, scores  # made, in the call's own IPC namespace
    escaped = {k: v for k, v in scores.items() if k not in ("reference", "shm_made") and v != HELD}
    assert not escaped, escaped


def test_a_scorer_that_runs_its_answer_reaches_nothing_outside_its_call():
    held(run_probes())
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.shmget(SHM_KEY, 0, 0o600) == -1  # nor in the host's IPC namespace


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to become the chart's user"
)
def test_under_the_charts_non_root_user():
    """The env service and its worker as the chart's uid 10001 (no groups, no capabilities, no
    new privileges): the worker's uid protects nothing there, the seal must. Also with Landlock
    capped at ABI 1 (no TCP, signal or abstract-socket scoping): the namespaces and the filter
    cover those."""
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--"]
        + [sys.executable, "-m", "tests.env.rg_seal_probes", str(CHART_UID)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    runs = json.loads(out.stdout)
    held(runs["as_is"])
    held(runs["landlock_abi_1"])


def test_no_text_a_scorer_writes_reaches_the_env():
    """An exception's message, its class's name, or a line written to the verdict pipe by hand
    could carry what the answer read: only a builtin exception's name comes back."""
    secret = f"atgrpo-secret-{uuid.uuid4().hex}"
    answers = {
        f"int({secret!r})": "ValueError",
        f"(_ for _ in ()).throw(type({secret!r}, (Exception,), {{}})())": "an exception",
        f"[__import__('ctypes').CDLL(None).write(fd, b'E{secret}', {len(secret) + 1}) "
        "for fd in range(3, 64)] and 2.0": "an exception",
        f"[__import__('ctypes').CDLL(None).write(fd, b'I{secret}', {len(secret) + 1}) "
        "for fd in range(3, 64)] and 0.0": "(unknown)",
        f"(float('nan') if {secret!r} else 0)": "no score in [0, 1]",
    }
    ds = rg.create_dataset(rg_probe.NAME, seed=0, size=10)
    worker = rg_scorer.ScorerWorker()
    try:
        for answer, said in answers.items():
            with pytest.raises(JudgeError) as err:
                worker.score(ds, rg_probe.NAME, "{}", answer, ds[0])
            assert secret not in str(err.value) and said in str(err.value), (answer, err.value)
    finally:
        worker.stop()


def test_a_seal_step_that_does_not_take_hold_refuses_the_call():
    """Nothing is scored: the call is isolation_failed, with the step named. One worker, whose
    child breaks the step its answer names (tests/env/rg_seal_probes.py: BREAKS)."""
    ds = rg.create_dataset(rg_probe.NAME, seed=0, size=10)
    worker = rg_scorer.ScorerWorker(
        [
            sys.executable,
            "-c",
            "from tests.env import rg_seal_probes; rg_seal_probes.broken_worker_main()",
        ]
    )
    wrong = {}
    try:
        for name, (_, step) in BREAKS.items():
            if step == "uid" and os.geteuid() != 0:
                continue  # the uid is dropped only where the worker is root
            try:
                wrong[name] = worker.score(ds, rg_probe.NAME, "{}", name, ds[0])
            except JudgeError as e:
                if e.reason != "isolation_failed" or f"({step})" not in str(e):
                    wrong[name] = str(e)
    finally:
        worker.stop()
    assert not wrong, wrong


def test_a_worker_that_cannot_hide_proc_refuses_every_call(monkeypatch):
    """The seal's checks read /proc before hiding it; a plan that would leave it is refused."""
    monkeypatch.setattr(rg_seal, "HIDE", ("/tmp",))
    rg_seal.prepare.cache_clear()
    try:
        with pytest.raises(rg_seal.Unsealed) as err:
            rg_seal.prepare()
    finally:
        rg_seal.prepare.cache_clear()
    assert err.value.step == "prepare"
    assert rg_scorer._verdict(b"Iprepare")["error"] == "isolation_failed"
