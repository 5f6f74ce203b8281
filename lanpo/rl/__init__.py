"""GRPO maths as pure tensor functions: group advantages, clipped policy loss with a k3 KL penalty, log-probs."""

from lanpo.rl.advantages import group_advantages
from lanpo.rl.logprobs import entropy_from_logits, token_logprobs
from lanpo.rl.loss import kl_k3, policy_loss

__all__ = ["entropy_from_logits", "group_advantages", "kl_k3", "policy_loss", "token_logprobs"]
