"""What a reasoning-gym dataset's own score pays, once it comes back from the scorer worker: its
verdict that the answer is right, and partial credit only where we audited it as progress.

A constant-answer sweep (tests/env/test_integrity_rg_constants.py: every dataset, twenty entries,
answers such as "0", "yes", "[]", a grid of zeros) found that most partial credit in
reasoning-gym 0.1.19 pays answers that know nothing about the question:

- format rewards, 0.01-0.05 for any readable answer (arc_agi, rearc, color_cube_rotation,
  emoji_mystery, fraction_simplification, graph_color, group_anagrams, gsm_symbolic, jugs,
  palindrome_generation, power_function, prime_factorization, propositional_logic, rubiks_cube,
  rush_hour, sentence_reordering, tsumego, ...);
- closeness to a number, which a constant near the typical answer collects: rectangle_count
  (0.25-0.31 for "1" or "2"), time_intervals (0.44 for "00:00"), polynomial_equations (0.35
  for "0"), calendar_arithmetic, complex_arithmetic;
- similarity that a fixed answer shares with most references: game_of_life's cell-wise credit
  (0.96 for a grid of zeros), the sudoku family's positional credit (0.23 for a mini_sudoku grid
  of ones), spell_backward and figlet_font's matching letters, manipulate_matrix's substring
  credit, propositional_logic's 0.25 for a tautology such as "P ∨ ¬P", calendar_arithmetic's 0.1
  for any weekday.

So the default is the dataset's verdict of right (1.0) or nothing, and `PARTIAL` lists the
datasets whose lesser credit is a real part of the task (a valid solution longer than the optimum,
boxes actually moved) with the format reward each pays below it. A dataset new to a later
reasoning-gym gets the default until someone audits it. Where the dataset's 1.0 is itself wrong
(game_of_life_halting, coin_flip) or its right answers score just under 1.0, rg_safe.py has a
scorer of ours or `NEAR` says how close counts as right.
"""

from __future__ import annotations

import math

# dataset: the most its scorer pays an answer with no progress in it (a format reward); credit
# above that is progress the task means and is paid as the dataset scores it.
PARTIAL: dict[str, float] = {
    "boxnet": 0.05,  # the fraction of boxes the plan delivers; 0.05 for any JSON plan
    "knight_swap": 0.05,  # optimal/len for a longer solution; 0.05 for legal moves that fail
    "tower_of_hanoi": 0.05,  # optimal/len for a longer solution; 0.05 for legal moves that fail
    "quantum_lock": 0.0,  # 0.5 for a button sequence that reaches the target, not the shortest
    "shortest_path": 0.0,  # 0.5 for a valid path longer than the shortest
    "word_ladder": 0.0,  # a valid ladder, halved for each word outside its word list
    "advanced_geometry": 0.05,  # 0.5 for an incircle radius right to 2 decimals only
}

# dataset: the dataset's score from which an answer is right (1.0): its scorer decays with the
# distance from the reference, so a right answer written with other rounding scores just under 1.
NEAR: dict[str, float] = {
    "complex_arithmetic": math.exp(-0.01),  # exp(-|answer - result|): within 0.01
    # the mean of exp(-10 |root - reference root|), less 0.5 per root missing or extra: every
    # root, within 0.001 on average (the question asks for 4 decimals, oddly rounded)
    "polynomial_equations": math.exp(-0.01),
}

# dataset: why the env refuses it (check_dataset's ValueError)
REFUSED: dict[str, str] = {
    "composite": "it mixes datasets and scores each entry with its source dataset's own scorer, "
    "around this env's judge (our safe scorers and credit rules), and its config needs Python "
    "objects the env's JSON options cannot carry; name one dataset per env instead",
}


def credit(name: str, score: float) -> float:
    """What the env pays for `score`, dataset `name`'s own score of an answer."""
    if name in NEAR and score >= NEAR[name]:
        return 1.0
    if name in PARTIAL:
        return score if score > PARTIAL[name] else 0.0
    return 1.0 if score >= 1.0 else 0.0
