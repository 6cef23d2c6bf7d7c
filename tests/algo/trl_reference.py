"""TRL's own GRPO loss (GRPOTrainer._compute_loss), called on given tensors.

The method reads many trainer attributes; this stands in a minimal trainer whose model "outputs"
exactly the log-probs we pass, so the loss TRL computes is its real code on our numbers.
"""

from collections import defaultdict
from types import SimpleNamespace

import torch
from trl.trainer.grpo_trainer import GRPOTrainer


class _Accelerator:
    num_processes = 1

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


class _StandIn:
    def __init__(self, logprobs, eps_low, eps_high, beta=0.0):
        self._logprobs = logprobs
        self.aux_loss_enabled = False
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.importance_sampling_level = "token"
        self.beta = beta
        self.loss_type = "bnpo"  # sum over all tokens / number of tokens: token-mean
        self.epsilon_low, self.epsilon_high = eps_low, eps_high
        self.args = SimpleNamespace(delta=None, use_bias_correction_kl=False)
        self.use_vllm = False
        self.model = SimpleNamespace(training=True)
        self.current_gradient_accumulation_steps = 1
        self._entropy_bonus_enabled = False
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.accelerator = _Accelerator()

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, **kw
    ):
        return self._logprobs, torch.zeros_like(self._logprobs), None

    def __getattr__(self, name):  # any other helper TRL reaches for
        return getattr(GRPOTrainer, name).__get__(self)


def trl_loss(
    logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.2, ref_logprobs=None, beta=0.0
):
    B, T = logprobs.shape
    inputs = {
        "prompt_ids": torch.zeros((B, 1), dtype=torch.long),
        "prompt_mask": torch.ones((B, 1), dtype=torch.long),
        "completion_ids": torch.zeros((B, T), dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old_logprobs,
    }
    if ref_logprobs is not None:
        inputs["ref_per_token_logps"] = ref_logprobs
    return GRPOTrainer._compute_loss(_StandIn(logprobs, eps_low, eps_high, beta), None, inputs)
