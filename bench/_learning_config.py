"""One run's config in bench/real_learning.py (and the benches that reuse its runs:
bench/paper_table.py, bench/real_speed.py, the trl variant): the defaults a user tunes (Knobs)
and run_config, the AT-GRPO baseline with a variant's one change. The examples' smollm2 configs
are this config written out (tests/cli checks that they still are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._learning_variants import GROUPING, TASKS, pools_of

K, TASKS_PER_STEP = 4, 8
LR = 1e-5  # full weights of a 135M model over tens of steps (1e-6 barely moves it here)
# The pool's dtype: the update under bf16 autocast over float32 masters and the engine's weights in
# bf16. This CPU (AMD EPYC, avx512_bf16) multiplies bf16 matrices ~2.5x faster than float32 ones;
# a CPU without bf16 instructions would be slower in bf16 (--dtype float32 there).
DTYPE = "bfloat16"
# A program's closing fence; the opening one ("```python" + newline) does not contain it.
FENCE_END = "\n```\n"
PARAGRAPH_END = "\n\n"


@dataclass(frozen=True)
class Knobs:
    """What a user tunes (the time-to-accuracy sweep): the learning rate, K, tasks a step (L0
    takes twice as many, for as many samples), the seed and max_staleness (collecting the next
    step while this one trains) and stop_at_fence (the tool agent's generation ends at its program's
    closing fence: only the program runs, so what the untrained model writes after it, up to
    max_tokens, cost decode and update time for nothing) and eval_overlap (an evaluation runs
    beside the next step's collection; its cost then shows in that step's seconds) and min_lr_ratio
    (below 1, the learning rate decays on a cosine to that fraction of itself over --steps: smaller
    steps once the run is near its target, where constant ones overshot) and stop_at_paragraph (the
    reasoner's generation ends at its first blank line: the judge reads the last answer phrase of
    the text, and a greedy reasoner that gave the right number went on to max_tokens restating it
    until a cut or a paraphrase was the last one it read). `label` names
    a run made with other knobs than the defaults, so it keeps its own directory and table row."""

    lr: float = LR
    k: int = K
    tasks_per_step: int = TASKS_PER_STEP
    seed: int = 0
    max_staleness: int = 0
    stop_at_fence: bool = False
    label: str = ""
    eval_overlap: bool = False
    min_lr_ratio: float = 1.0
    stop_at_paragraph: bool = False


def run_config(
    task: str,
    variant: str,
    model: str,
    run_dir: Path,
    steps: int,
    eval_every: int,
    eval_tasks: int,
    dtype: str = DTYPE,
    knobs: Knobs = Knobs(),
    checkpoint_every: int = 0,
) -> dict[str, Any]:
    """One run's config: the AT-GRPO baseline with `variant`'s one change. `checkpoint_every`:
    steps between checkpoints (0: none), what a resumed run starts from."""
    spec = TASKS[task]
    agents = [spec.single] if variant == "L0" else list(spec.team)
    env_options = {**spec.options, "max_turns": spec.max_turns, "turn_order": agents}
    if spec.env == "reasoning_gym":  # its eval split is a dataset of this size; others generate
        env_options["eval_size"] = eval_tasks
    sampling = {
        a: {"temperature": 1.0, "max_tokens": spec.max_tokens[a], "max_prompt_tokens": 1024}
        for a in agents
    }
    if knobs.stop_at_fence and "tool" in sampling:
        sampling["tool"]["stop"] = [FENCE_END]
    if knobs.stop_at_paragraph and "reasoner" in sampling:
        sampling["reasoner"]["stop"] = [PARAGRAPH_END]
    return {
        "run": {
            "name": f"real-{task}-{variant.lower()}",
            "seed": knobs.seed,
            "steps": steps,
            "tasks_per_step": knobs.tasks_per_step * (2 if variant == "L0" else 1),
            "eval_every_steps": eval_every,
            "eval_tasks": eval_tasks,
            "checkpoint_every_steps": checkpoint_every,
            # what a resume loads (and the best): ~2 GB each at 135M
            **({"keep_checkpoints": 1} if checkpoint_every else {}),
            "run_dir": str(run_dir),
            "save_eval_samples": True,
            # only when asked, as max_staleness
            **({"eval_overlap": True} if knobs.eval_overlap else {}),
        },
        "env": {
            "name": spec.env,
            "max_turns": spec.max_turns,
            "turn_order": agents,
            "options": env_options,
        },
        **pools_of(variant, agents, model, dtype, knobs.lr, knobs.min_lr_ratio),
        "agents": {
            a: {
                "pool": a if variant == "L3" else "shared",
                "train_sampling": sampling[a],
                "eval_sampling": {**sampling[a], "temperature": 0.0},
            }
            for a in agents
        },
        # One optimizer step a step, on the groups whose rewards differ: the others' advantages are
        # 0 and their update would be all cost (most groups, early on).
        "algorithm": {
            "k": knobs.k,
            "alpha": 1.0,
            "mini_batch_size": 1024,
            "filter": "zero_variance",
            "grouping": GROUPING.get(variant, "turn"),
            # only when asked: the examples carry the bench's default config as it stands
            **({"max_staleness": knobs.max_staleness} if knobs.max_staleness else {}),
        },
    }
