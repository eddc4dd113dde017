"""Supervised fine-tuning of masked diffusion on prompt -> response rows.

LLaDA's SFT recipe (its guidelines, section on supervised fine-tuning):
a row is a prompt followed by its response (padded with EOS, which counts
as response so the model learns where to stop). Only response tokens are
ever masked; the prompt stays clean in z_t and never enters the loss. The
loss of a row is the 1/t-weighted cross-entropy of its masked response
tokens divided by the response's length, averaged over the batch:

  loss = mean_b (1 / |r_b|) sum_{i in r_b, z_t^i = m} w(t_b) CE_i

with w(t) = -alpha'(t) / (1 - alpha(t)) (1/t for the 'linear' schedule,
LLaDA's). The batch's `loss_mask` is the response mask (1 on response and
its EOS padding, 0 on the prompt), so the one loop and train step train
it; a row without a mask is all response. The train step divides the sum
of objective_B by the batch's loss tokens (sum_b |r_b|), so objective_B is
scaled by the batch's mean response length to leave LLaDA's mean over
responses (whatever `loss_type` says: this objective is the recipe). The
reported NELBO is the masked-diffusion bound of the response given the
prompt, which is what evaluation reports for these rows.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ddlm_jax.diffusion.base import ProcessConfig
from ddlm_jax.diffusion.masked import (
  MaskedConfig,
  MaskedDiffusion,
  token_cross_entropy,
)


@dataclasses.dataclass(frozen=True)
class ResponseMaskedDiffusion(MaskedDiffusion):
  """Masked diffusion that masks and scores the response only."""

  def response_weights(self, z_BxL, response_BxL):
    """Per-position loss weights [B, L] before w(t): 1 / |r_b| at masked
    response positions, exactly 0 elsewhere (the prompt above all)."""
    masked_BxL = (z_BxL == self.mask_id) & response_BxL
    length_Bx1 = jnp.maximum(response_BxL.sum(-1, keepdims=True), 1)
    return jnp.where(masked_BxL, 1.0 / length_Bx1, 0.0)

  def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
    del step
    if loss_mask_BxL is None:
      response_BxL = jnp.ones(x_BxL.shape, bool)
    else:
      response_BxL = loss_mask_BxL > 0
    t_B, weight_B, z_BxL = self.draw(key, x_BxL)
    z_BxL = jnp.where(response_BxL, z_BxL, x_BxL)  # The prompt stays clean.
    logits_BxLxV = self.network_logits(apply, z_BxL, x_BxL, t_B)
    ce_BxL = token_cross_entropy(logits_BxLxV, x_BxL)
    per_token_BxL = self.response_weights(z_BxL, response_BxL)
    length_B = response_BxL.sum(-1).astype(jnp.float32)
    objective_B = weight_B * jnp.sum(ce_BxL * per_token_BxL, -1)
    objective_B = objective_B * jnp.mean(length_B)
    _, nelbo_B, aux = self.bound(
      logits_BxLxV,
      x_BxL,
      z_BxL,
      t_B,
      weight_B,
      response_BxL.astype(jnp.float32),
    )
    return objective_B, nelbo_B, aux


@ProcessConfig.register('mdlm_sft')
@dataclasses.dataclass(frozen=True)
class ResponseMaskedConfig(MaskedConfig):
  """config.process of supervised fine-tuning ('mdlm_sft'): the masked
  settings, with the batch's loss_mask read as the response mask."""

  def build(self, vocab_size: int) -> ResponseMaskedDiffusion:
    return ResponseMaskedDiffusion(
      **self.scheduled_kwargs(vocab_size),
      num_steps=self.num_steps,
      bound_kind=self.bound,
    )
