"""Masked (absorbing-state) diffusion: forward process, NELBO, reverse step.

Each token independently stays itself with probability alpha(t) and otherwise
becomes the mask token m = vocab_size. The network predicts the clean token
at every position (V logits, no mask class), which is the SUBS
parameterisation of MDLM: the mask class has zero probability and unmasked
positions carry over their input. Notation and formulas follow
shared/REFERENCE.md, section 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.schedules import Schedule

# apply(z_BxL, t_B) -> logits_BxLxV. Time-free networks ignore t_B.
ApplyFn = Callable[[jax.Array, jax.Array], jax.Array]

LOSS_TYPES = ('elbo', 'simple_ce')


def antithetic_uniform(key: jax.Array, batch: int) -> jax.Array:
  """Stratified uniforms t_b = (u + b / B) mod 1 (MD4's variance reduction)."""
  u = jax.random.uniform(key, ())
  return jnp.mod(u + jnp.arange(batch, dtype=jnp.float32) / batch, 1.0)


def subs_logits(
  logits_BxLxV: jax.Array, z_BxL: jax.Array, mask_id: int
) -> jax.Array:
  """SUBS: unmasked positions put all mass on their current token."""
  vocab = logits_BxLxV.shape[-1]
  onehot_BxLxV = jax.nn.one_hot(jnp.minimum(z_BxL, vocab - 1), vocab)
  carry_BxLxV = jnp.where(onehot_BxLxV > 0, 0.0, -jnp.inf)
  is_masked_BxLx1 = (z_BxL == mask_id)[..., None]
  return jnp.where(is_masked_BxLx1, logits_BxLxV, carry_BxLxV)


def token_cross_entropy(logits_BxLxV: jax.Array, x_BxL: jax.Array) -> jax.Array:
  """-log softmax(logits)[x] per position, computed in float32."""
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  # A one-hot product rather than a gather: its gradient is elementwise, not
  # a scatter (several times faster on XLA's CPU backend).
  onehot_BxLxV = jax.nn.one_hot(x_BxL, logp_BxLxV.shape[-1], dtype=jnp.float32)
  return -jnp.sum(onehot_BxLxV * logp_BxLxV, axis=-1)


@dataclasses.dataclass(frozen=True)
class MaskedDiffusion:
  """Absorbing-state diffusion over V tokens with mask id V.

  Attributes:
    schedule: the keep-probability schedule alpha(t).
    vocab_size: V, the number of data tokens (the mask id is V).
    num_steps: 0 for the continuous-time NELBO, T > 0 for the T-step one.
    t_min: times are drawn from [t_min, 1] (MDLM clips at 1e-3).
    antithetic: stratify the batch's times (MD4).
    loss_type: 'elbo' trains on the NELBO; 'simple_ce' on unweighted
      cross-entropy over masked tokens averaged over all tokens. Both report
      the NELBO.
  """

  schedule: Schedule
  vocab_size: int
  num_steps: int = 0
  t_min: float = 0.0
  antithetic: bool = True
  loss_type: str = 'elbo'

  causal = False
  family = 'masked'
  requires_time_conditioning = False

  def __post_init__(self):
    if self.loss_type not in LOSS_TYPES:
      raise ValueError(
        f'loss_type={self.loss_type!r}; choose one of {LOSS_TYPES}.'
      )
    if self.num_steps < 0:
      raise ValueError(f'num_steps must be >= 0, got {self.num_steps}.')

  @property
  def mask_id(self) -> int:
    return self.vocab_size

  @property
  def input_vocab_size(self) -> int:
    """Embedding rows the network needs: V data tokens plus the mask."""
    return self.vocab_size + 1

  def reconstruction_nats(self, length):
    """MD4's constant term: tokens masked at t = 0 cost log V each.

    `length` is the number of (valid) tokens, a number or an array.
    """
    with jax.ensure_compile_time_eval():
      alpha0 = float(self.schedule.alpha(jnp.float32(0.0)))
    return length * (1.0 - alpha0) * math.log(self.vocab_size)

  def sample_times(self, key: jax.Array, batch: int):
    """Returns (t_B, weight_B): the diffusion times and their ELBO weights."""
    if self.antithetic:
      u_B = antithetic_uniform(key, batch)
    else:
      u_B = jax.random.uniform(key, (batch,))
    if self.num_steps:
      steps = self.num_steps
      t_B = (jnp.floor(u_B * steps) + 1.0) / steps
      t_B = jnp.minimum(t_B, 1.0)
      s_B = t_B - 1.0 / steps
      weight_B = steps * self.schedule.discrete_weight(s_B, t_B)
      return t_B, weight_B
    t_B = self.t_min + (1.0 - self.t_min) * u_B
    return t_B, self.schedule.weight(t_B)

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_B: jax.Array):
    """Samples z_t ~ q(z_t | x): each token masked w.p. 1 - alpha(t)."""
    alpha_Bx1 = self.schedule.alpha(t_B)[:, None]
    keep_BxL = jax.random.uniform(key, x_BxL.shape) < alpha_Bx1
    return jnp.where(keep_BxL, x_BxL, self.mask_id)

  def loss(
    self,
    apply: ApplyFn,
    key: jax.Array,
    x_BxL: jax.Array,
    loss_mask_BxL: jax.Array | None = None,
  ):
    """One Monte-Carlo sample of the loss.

    `loss_mask_BxL` (1 = real token, 0 = padding) removes padded positions
    from the bound; padding is still corrupted and seen by the network.

    Returns:
      (objective_B, nelbo_B, aux): the per-sequence training objective, the
      per-sequence NELBO in nats, and auxiliary per-sequence statistics.
    """
    t_B, weight_B, z_BxL = self.draw(key, x_BxL)
    logits_BxLxV = apply(z_BxL, t_B)
    return self.bound(logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_mask_BxL)

  def draw(self, key: jax.Array, x_BxL: jax.Array):
    """(t_B, weight_B, z_BxL): diffusion times, ELBO weights and z_t."""
    t_key, mask_key = jax.random.split(key)
    t_B, weight_B = self.sample_times(t_key, x_BxL.shape[0])
    return t_B, weight_B, self.corrupt(mask_key, x_BxL, t_B)

  def bound(self, logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_mask_BxL):
    """(objective_B, nelbo_B, aux) of one prediction at z_t (see loss)."""
    batch, length = x_BxL.shape
    masked_BxL = (z_BxL == self.mask_id).astype(jnp.float32)
    valid_B = jnp.full((batch,), float(length))
    if loss_mask_BxL is not None:
      masked_BxL = masked_BxL * loss_mask_BxL
      valid_B = loss_mask_BxL.sum(-1)
    ce_BxL = token_cross_entropy(logits_BxLxV, x_BxL) * masked_BxL
    ce_B = ce_BxL.sum(-1)
    nelbo_B = weight_B * ce_B + self.reconstruction_nats(valid_B)
    if self.loss_type == 'elbo':
      objective_B = nelbo_B
    else:
      objective_B = ce_B
    aux = {'masked_fraction': masked_BxL.sum(-1) / valid_B, 't': t_B}
    return objective_B, nelbo_B, aux

  def reverse_probs(
    self,
    probs_BxLxV: jax.Array,
    z_BxL: jax.Array,
    s: jax.Array,
    t: jax.Array,
  ) -> jax.Array:
    """Ancestral step s < t: distribution over V + 1 ids for masked tokens.

    p(z_s = v) = (alpha(s) - alpha(t)) / (1 - alpha(t)) p_theta(v | z_t),
    p(z_s = m) = (1 - alpha(s)) / (1 - alpha(t)). Unmasked positions are left
    to the caller (they never change).
    """
    del z_BxL
    a_s, a_t = self.schedule.alpha(s), self.schedule.alpha(t)
    unmask = (a_s - a_t) / (1.0 - a_t)
    stay = (1.0 - a_s) / (1.0 - a_t)
    stay_BxLx1 = jnp.full(probs_BxLxV.shape[:-1] + (1,), stay)
    return jnp.concatenate([unmask * probs_BxLxV, stay_BxLx1], axis=-1)
