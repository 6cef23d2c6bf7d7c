"""What `atgrpo env check` (check.py) reports: the rules it holds an environment to, each with what
it asks, and the findings and the report a check returns.

Kept apart from the checker's calls (check_driver.py) and its episodes (check.py) so that what a
caller reads, `report.ok`, `report.render()` and each finding's rule, is one short module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atgrpo.sdk.env import REWARD_RANGE

STEP_MS_WARN = 1000.0  # tree sampling steps K x agents x turns times per task

# rule -> what it asks; a finding names its rule, so a failure reads with its fix.
RULES: dict[str, str] = {
    "builds": "the class builds from the options and sets self.spec = EnvSpec(...)",
    "sandbox": "an env that runs code is checked with a sandbox",
    "wire": "the options, the spec, the prompts and the step results survive the wire unchanged",
    "config": "the spec agrees with the run config (turn_order, parallel, max_turns)",
    "task-ids": "task_ids(split) is None or a non-empty list of distinct strings",
    "reset-deterministic": "reset(task, seed, split) twice gives the same prompts",
    "splits-differ": "train and eval tasks of the same index differ (warning)",
    "observe": "observe(agent) returns chat messages with known roles, of a sane size",
    "never-raises": "reset, observe, step and fork do not raise, whatever text an agent sends",
    "rewards-finite": "team_reward and local_reward are finite numbers",
    "reward-range": f"rewards stay in {list(REWARD_RANGE)} (warning)",
    "flags": "success is a bool; a success comes with done (warning)",
    "step-deterministic": "the same answers from the same state give the same results and prompts",
    "fork-independent": "stepping a fork changes nothing its parent shows",
    "replays": "a fork shows the agent about to act what its parent shows (an agent program, run "
    "again with the recorded answers, makes the same calls)",
    "parallel-resolves-last": "in a parallel turn, no agent's step changes what the agents see "
    "until the turn's last agent steps",
    "time-per-step": f"step takes under {STEP_MS_WARN:.0f} ms (warning)",
}
WARNINGS = frozenset({"splits-differ", "reward-range", "flags", "time-per-step"})


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str

    @property
    def warning(self) -> bool:
        return self.rule in WARNINGS


@dataclass
class Report:
    env: str
    findings: list[Finding] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)  # mean ms per call
    steps: int = 0

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.warning]

    @property
    def ok(self) -> bool:
        return not self.failures

    def render(self) -> str:
        lines = [
            f"{'warn' if f.warning else 'FAIL'} {f.rule}: {f.message}"
            for f in sorted(self.findings, key=lambda f: f.warning)
        ]
        took = "".join(f", {k} {v:.1f} ms" for k, v in self.timings_ms.items())
        failed = {f.rule for f in self.failures}
        verdict = (
            f"env {self.env!r}: {len(failed)} of {len(RULES)} rules broken"
            if failed
            else f"env {self.env!r}: ok, every rule kept"
        )
        return "\n".join([*lines, f"{verdict} ({self.steps} steps played{took})"])
