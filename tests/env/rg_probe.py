"""A reasoning-gym dataset for the integrity tests: a future third-party scorer that eval()s the
answer, as spiral_matrix and n_queens do, but one no safe scorer of ours knows. Importing this
module registers it (the scorer worker imports it too, by the dataset class's module name)."""

from dataclasses import dataclass
from random import Random
from typing import Any

from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS, register_dataset

NAME = "integrity_probe_eval"


@dataclass
class ProbeConfig:
    seed: int | None = None
    size: int = 10

    def validate(self) -> None:
        pass


class ProbeDataset(ProceduralDataset):
    def __init__(self, config: ProbeConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        value = Random(self.seed + idx).randint(1, 9)
        return {
            "question": f"What is {value} + 0? Answer with a number.",
            "answer": str(value),
            "metadata": {"source_dataset": NAME, "source_index": idx},
        }

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        if answer == entry["answer"]:
            return 1.0
        return float(eval(answer))  # the hole: whatever the answer computes is its score


if NAME not in DATASETS:
    register_dataset(NAME, ProbeDataset, ProbeConfig)
