"""Conditional masked diffusion: a plan generated for a clean question.

`MaskedDiffusion.loss` corrupts every position, so the planner's loss lives
here: the question positions (`cond_BxL`) are never masked and carry no
loss; plan positions are masked with probability 1 - alpha(t) and scored
with the process' own time sampling and ELBO weights. Plan sampling reuses
the registry samplers, whose prompts keep every non-mask position fixed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.masked import MaskedDiffusion, token_cross_entropy
from ddlm_jax.sampling.base import Sampler


def conditional_loss(
  process: MaskedDiffusion,
  apply,
  key: jax.Array,
  x_BxL: jax.Array,
  cond_BxL: jax.Array,
):
  """One Monte-Carlo sample of the plan NELBO given the clean condition.

  Args:
    process: the masked-diffusion process (schedule, times, weights).
    apply: apply(z_BxL, t_B) -> logits_BxLxV.
    key: randomness for the times and the masks.
    x_BxL: clean [question, plan] tokens.
    cond_BxL: True where the token is conditioning (never masked).

  Returns:
    (objective_B, nelbo_B, aux) like MaskedDiffusion.loss; the NELBO counts
    the plan tokens only.
  """
  batch = x_BxL.shape[0]
  t_key, mask_key = jax.random.split(key)
  t_B, weight_B = process.sample_times(t_key, batch)
  z_BxL = process.corrupt(mask_key, x_BxL, t_B)
  z_BxL = jnp.where(cond_BxL, x_BxL, z_BxL)
  logits_BxLxV = apply(z_BxL, t_B)
  masked_BxL = (z_BxL == process.mask_id).astype(jnp.float32)
  ce_B = (token_cross_entropy(logits_BxLxV, x_BxL) * masked_BxL).sum(-1)
  plan_B = (~cond_BxL).sum(-1)
  nelbo_B = weight_B * ce_B + process.reconstruction_nats(plan_B)
  objective_B = nelbo_B if process.loss_type == 'elbo' else ce_B
  aux = {'masked_fraction': masked_BxL.sum(-1) / plan_B, 't': t_B}
  return objective_B, nelbo_B, aux


def plan_prompt(question_BxQ: jax.Array, plan_len: int, mask_id: int):
  """[question, mask * P]: the prompt whose masked part is the plan."""
  mask_BxP = jnp.full((question_BxQ.shape[0], plan_len), mask_id, jnp.int32)
  return jnp.concatenate([question_BxQ.astype(jnp.int32), mask_BxP], axis=1)


def sample_plan(
  sampler: Sampler,
  apply,
  key: jax.Array,
  process: MaskedDiffusion,
  question_BxQ: jax.Array,
  plan_len: int,
):
  """Samples plans for fixed questions: (plan_BxP, nfe, z_BxL)."""
  prompt = plan_prompt(question_BxQ, plan_len, process.mask_id)
  batch, length = prompt.shape
  z_BxL, nfe = sampler(
    apply, key, process, batch=batch, length=length, prompt_BxL=prompt
  )
  return z_BxL[:, -plan_len:], nfe, z_BxL
