"""What every layer of one update reads (UpdateContext): the model and the step's samples, the
router's settings of the step and the trainer's own (TrainerUpdateSettings), where and how the
model runs, its clock and the decoupled loss's proximal policy."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from atgrpo.contract.trainer import TrainSample, UpdateConfig
from atgrpo.perf import PhaseClock, forward_flops, model_size, update_flops
from trainer_svc.logprobs import chunked_head_available
from trainer_svc.prompt_sharing import prefix_sharing_available
from trainer_svc.sharding import is_sharded, world

# The micro-batch token budget when neither the pool's setup nor the service's flag sets one.
DEFAULT_MICRO_BATCH_TOKENS = 8192

# The frozen reference for the KL term: a context that yields the model to score with (a LoRA
# pool's base with its adapters off, or a full pool's initial weights).
Reference = Callable[[], contextlib.AbstractContextManager]
# Activates an agent's LoRA adapter for the block.
Adapter = Callable[[str], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class TrainerUpdateSettings:
    """The trainer's own settings of every update of its pool, fixed when the pool is set up
    (PoolState.update_settings); the router's per-step settings are UpdateConfig."""

    micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS
    """the token budget of one forward/backward"""
    grad_clip: float = 1.0
    """the gradient norm each clip group (the model, or one agent's adapter) is clipped to"""
    autocast_bf16: bool = False
    """bf16 mixed precision for forward/backward (float32 master weights)"""


DEFAULT_SETTINGS = TrainerUpdateSettings()


@dataclass(frozen=True)
class Proximal:
    """The trainer's own log-probs of the samples under the weights the update starts from, for
    every epoch: the decoupled loss's proximal policy, the PPO ratio's old log-probs. On-policy
    (max_staleness 0) these weights drew the samples, so they are the trainer's behaviour
    log-probs, which the engine's are compared with (atgrpo.algo.mismatch).

    The first optimizer step's forwards run on those weights, so its rows' log-probs come from
    them, detached, at no cost: a one-step update scores nothing else (`scored` None), a longer
    one scores only the other rows before it starts (`pending`: the first step's rows, filled in
    after that step by trainer_svc.behaviour.settle)."""

    scored: list[torch.Tensor] | None
    """every sample's log-probs under those weights (proximal_logprobs; a pending row's once
    settled). None when the update is one optimizer step: every forward then runs on the weights
    it starts from, so each micro-batch's own log-probs, detached, are the proximal policy's"""
    pending: set[int] = field(default_factory=set)
    """rows of the first optimizer step that `scored` does not hold yet"""
    seen: dict[int, torch.Tensor] = field(default_factory=dict)
    """the log-probs the training forwards gave the rows scored that way (float32, on the CPU,
    each its response's length): this rank's rows only"""

    def _from_forward(self, r: int) -> bool:
        return self.scored is None or r in self.pending

    def logprobs(self, micro: Sequence[int], lp: torch.Tensor) -> torch.Tensor:
        """Rows `micro`'s proximal log-probs, shaped like `lp` (their log-probs under training)."""
        if self.scored is None:
            return lp.detach()
        scored = self.scored
        rows = [lp[i].detach() if self._from_forward(r) else scored[r] for i, r in enumerate(micro)]
        return padded(rows, lp)

    def keep(self, micro: Sequence[int], prox: torch.Tensor, lengths: Sequence[int]) -> None:
        """Keep the log-probs the training forward gave rows `micro` that are scored that way."""
        for i, (r, n) in enumerate(zip(micro, lengths, strict=True)):
            if self._from_forward(r):
                self.seen[r] = prox[i, :n].float().cpu()


class UpdateClock(PhaseClock):
    """Where one update's time goes (forward, backward, optimizer) and the positions its forwards
    took, for the step's breakdown and the update's model FLOPs (atgrpo.perf). `shared`: the
    forward runs each distinct prompt of a micro-batch once (shares_prompts)."""

    def __init__(self, device: str, shared: bool):
        super().__init__(device)
        self.shared = shared
        self.tokens = {True: [0, 0], False: [0, 0]}  # grad -> [positions, positions with logits]

    def count(self, batch: Sequence[TrainSample], grad: bool) -> None:
        prompts = (
            {tuple(s.prompt_ids) for s in batch} if self.shared else [s.prompt_ids for s in batch]
        )
        responses = sum(len(s.response_ids) for s in batch)
        self.tokens[grad][0] += sum(len(p) for p in prompts) + responses
        self.tokens[grad][1] += responses

    def report(self, model) -> dict[str, float]:
        """time_forward_s (scoring without gradient included), time_backward_s, time_optimizer_s,
        update_tokens (positions of the forwards with gradient) and update_flops."""
        size = model_size(model)
        (tokens, head), (scored, scored_head) = self.tokens[True], self.tokens[False]
        return {
            "time_forward_s": self.seconds["forward"],
            "time_backward_s": self.seconds["backward"],
            "time_optimizer_s": self.seconds["optimizer"],
            "update_tokens": float(tokens),
            "update_flops": update_flops(size, tokens, head)
            + forward_flops(size, scored, scored_head),
        }


@dataclass(frozen=True)
class UpdateContext:
    """What every layer of one update reads: the model and the step's samples, the router's
    settings (`cfg`) and the trainer's (`settings`), and where and how the model runs. The fields
    after `proximal` follow from the model and the process group."""

    model: torch.nn.Module
    samples: Sequence[TrainSample]
    cfg: UpdateConfig = field(default_factory=UpdateConfig)
    settings: TrainerUpdateSettings = field(default_factory=TrainerUpdateSettings)
    device: str = "cpu"
    adapter: Adapter | None = None
    """activates an agent's LoRA adapter; None: one shared model"""
    reference: Reference | None = None
    """the frozen reference for the KL term (used only when kl_coef > 0)"""
    clock: UpdateClock | None = None
    """times the forwards, backwards and optimizer steps; None: untimed"""
    proximal: Proximal | None = None
    """the decoupled loss's proximal policy; None: the synchronous loss"""
    sharded: bool = field(init=False)
    shared: bool = field(init=False)
    """the forward runs each distinct prompt of a micro-batch once (shares_prompts)"""
    rank: int = field(init=False)
    world_size: int = field(init=False)

    def __post_init__(self) -> None:
        rank, world_size = world()
        object.__setattr__(self, "sharded", is_sharded(self.model))
        object.__setattr__(self, "shared", shares_prompts(self.model))
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "world_size", world_size)

    @property
    def per_agent(self) -> bool:
        """Whether each agent's policy updates on its own (a LoRA pool's adapters)."""
        return self.adapter is not None

    def as_agent(self, agent: str | None) -> contextlib.AbstractContextManager:
        """`agent`'s adapter active for the block (None: the model as it is)."""
        return self.adapter(agent) if agent is not None else contextlib.nullcontext()

    def rows(self, micro: Sequence[int]) -> list[TrainSample]:
        return [self.samples[r] for r in micro]

    @contextlib.contextmanager
    def timed(self, part: str, batch: Sequence[TrainSample] | None = None, *, grad: bool = True):
        """Time the block as `part` of the update; a forward also counts `batch`'s positions."""
        if self.clock is None:
            yield
            return
        if batch is not None:
            self.clock.count(batch, grad)
        with self.clock.phase(part):
            yield


def shares_prompts(model) -> bool:
    """Whether response_logprobs runs each distinct prompt of a micro-batch once for `model`."""
    return chunked_head_available(model) and prefix_sharing_available(model)


def padded(rows: Sequence[Sequence[float] | torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Per-sample values as a (B, T) tensor shaped, typed and placed like `like`; 0 past each
    row."""
    out = torch.zeros_like(like)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row if isinstance(row, torch.Tensor) else list(row))
    return out
