"""Masked (absorbing-state) diffusion: forward process, NELBO, reverse step.

Each token independently stays itself with probability alpha(t) and otherwise
becomes the mask token m = vocab_size. The network predicts the clean token
at every position (V logits, no mask class), which is the SUBS
parameterisation of MDLM: the mask class has zero probability and unmasked
positions carry over their input. Notation and formulas follow
MD4 (arXiv 2406.04329) and MDLM (arXiv 2406.07524).

The reported NELBO (`bound_kind='full'`) is a true upper bound on -log p(x)
of the generative model "z_1 ~ p(z_1), the reverse chain from t = 1 to
t_lo, then a decoder p(x | z_{t_lo})", with t_lo = t_min in continuous
time and 0 for T steps. Per token, with a_1 = alpha(1) and a_lo =
alpha(t_lo):

  -log p(x) <= KL(q(z_1 | x) || p(z_1))                       (prior)
             + int_{t_lo}^1 -alpha'(t) E[-log p_theta(x | z_t) | masked] dt
             + E_{q(z_lo | x)}[-log p(x | z_lo)]               (reconstruction)

* Prior: p(z_1) puts 1 - a_1 on m and a_1 / V on every data token (the
  factorised prior closest to q(z_1 | x) = a_1 e_x + (1 - a_1) e_m for
  unknown x). The mask terms cancel and the data term is a_1 log(a_1 /
  (a_1 / V)), so KL = a_1 log V per token (log-linear: a_1 = eps = 1e-3).
  The samplers start from all masks, which differs from this prior on a
  fraction a_1 of the tokens.
* Diffusion: t ~ U[t_lo, 1] has density 1 / (1 - t_lo), so the one-sample
  estimate is (1 - t_lo) w(t) sum_{masked} -log p_theta(x_l | z_t), with
  w = -alpha' / (1 - alpha) (the masked fraction 1 - alpha(t) turns w into
  -alpha'). T steps: T (alpha(s) - alpha(t)) / (1 - alpha(t)), s = t - 1/T.
* Reconstruction: tokens kept at t_lo cost nothing (SUBS), masked ones get
  the uniform decoder: (1 - a_lo) log V per token.

With the tight schedule (a_1 = 0, a_lo = 1) the bound of the exact denoiser
is -log p(x) itself (the integral averages the chain rule over orders).
`bound_kind='mdlm'` is the published MDLM/MD4 convention: no prior, the
diffusion weight w(t) without the (1 - t_min) factor, and MD4's constant
(1 - alpha(0)) log V per token. With alpha(1) > 0 or t_min > 0 it is not
guaranteed to be a bound (tests/test_full_bound.py finds x where it falls
below -log p(x)), but it is what published numbers report.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import (
  ApplyFn,  # noqa: F401  (re-exported: masked.ApplyFn)
  DiffusionProcess,
  ProcessConfig,
  ScheduledConfig,
)
from ddlm_jax.diffusion.schedules import Schedule

LOSS_TYPES = ('elbo', 'simple_ce')
BOUND_KINDS = ('full', 'mdlm')


def check_loss_and_times(loss_type: str, t_min: float) -> None:
  """The checks every process trained on the masked losses shares."""
  if loss_type not in LOSS_TYPES:
    raise ValueError(f'loss_type={loss_type!r}; choose one of {LOSS_TYPES}.')
  if not 0.0 <= t_min < 1.0:
    raise ValueError(
      f't_min must lie in [0, 1) (times are drawn from [t_min, 1]), got '
      f'{t_min}.'
    )


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


def _alpha_at(schedule: Schedule, t: float) -> float:
  """alpha(t) as a Python float, even while tracing.

  A Python-float argument keeps closed-form schedules in double precision:
  in float32, log-linear alpha(1) = 1 - (1 - 1e-3) loses 4 digits.
  """
  with jax.ensure_compile_time_eval():
    return float(schedule.alpha(float(t)))


@dataclasses.dataclass(frozen=True)
class MaskedDiffusion(DiffusionProcess):
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
    bound_kind: 'full' reports the true bound (prior term, (1 - t_min)
      factor, reconstruction at t_min); 'mdlm' the published convention
      (see the module docstring).
  """

  schedule: Schedule
  vocab_size: int
  num_steps: int = 0
  t_min: float = 0.0
  antithetic: bool = True
  loss_type: str = 'elbo'
  bound_kind: str = 'full'

  causal = False
  family = 'masked'
  requires_time_conditioning = False

  def __post_init__(self):
    check_loss_and_times(self.loss_type, self.t_min)
    if self.num_steps < 0:
      raise ValueError(f'num_steps must be >= 0, got {self.num_steps}.')
    if self.bound_kind not in BOUND_KINDS:
      raise ValueError(
        f'bound_kind={self.bound_kind!r}; choose one of {BOUND_KINDS} '
        "('full': the true bound, 'mdlm': the published convention)."
      )

  @property
  def mask_id(self) -> int:
    return self.vocab_size

  @property
  def input_vocab_size(self) -> int:
    """Embedding rows the network needs: V data tokens plus the mask."""
    return self.vocab_size + 1

  def reconstruction_nats(self, length):
    """MD4's constant term: tokens masked at t = 0 cost log V each.

    `length` is the number of (valid) tokens, a number or an array. This is
    the 'mdlm' convention's constant; `constant_nats` gives the bound's.
    """
    with jax.ensure_compile_time_eval():
      alpha0 = float(self.schedule.alpha(jnp.float32(0.0)))
    return length * (1.0 - alpha0) * math.log(self.vocab_size)

  def constant_nats(self) -> tuple[float, float]:
    """(reconstruction, prior) nats per token of the reported NELBO.

    'full': ((1 - alpha(t_lo)) log V, alpha(1) log V) with t_lo = t_min in
    continuous time and 0 for T steps; 'mdlm': ((1 - alpha(0)) log V, 0).
    """
    log_v = math.log(self.vocab_size)
    if self.bound_kind == 'mdlm':
      return (1.0 - _alpha_at(self.schedule, 0.0)) * log_v, 0.0
    t_lo = 0.0 if self.num_steps else self.t_min
    recon = (1.0 - _alpha_at(self.schedule, t_lo)) * log_v
    return recon, _alpha_at(self.schedule, 1.0) * log_v

  def time_weight(self, t_B: jax.Array) -> jax.Array:
    """Continuous-time estimator weight of t ~ U[t_min, 1] (see docstring).

    'full': (1 - t_min) w(t), so its mean is the integral over [t_min, 1];
    'mdlm': w(t).
    """
    weight_B = self.schedule.weight(t_B)
    if self.bound_kind == 'full' and self.t_min > 0.0:
      weight_B = (1.0 - self.t_min) * weight_B
    return weight_B

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
    return t_B, self.time_weight(t_B)

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_B: jax.Array):
    """Samples z_t ~ q(z_t | x): each token masked w.p. 1 - alpha(t)."""
    alpha_Bx1 = self.schedule.alpha(t_B)[:, None]
    keep_BxL = jax.random.uniform(key, x_BxL.shape) < alpha_Bx1
    return jnp.where(keep_BxL, x_BxL, self.mask_id)

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
    if self.bound_kind == 'mdlm':
      nelbo_B = weight_B * ce_B + self.reconstruction_nats(valid_B)
    else:
      recon, prior = self.constant_nats()
      nelbo_B = weight_B * ce_B + (recon + prior) * valid_B
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


@ProcessConfig.register('mdlm', 'md4')
@dataclasses.dataclass(frozen=True)
class MaskedConfig(ScheduledConfig):
  """config.process of masked diffusion ('mdlm' and 'md4' build the same).

  num_steps: 0 = continuous-time NELBO, T = T-step; bound: 'full' (a true
  bound) | 'mdlm' (the published convention, no prior term); the shared
  settings as in ScheduledConfig.
  """

  num_steps: int = 0
  bound: str = 'full'

  family: ClassVar[str] = 'masked'
  supports_soft_mask: ClassVar[bool] = True

  def build(self, vocab_size: int) -> MaskedDiffusion:
    return MaskedDiffusion(
      **self.scheduled_kwargs(vocab_size),
      num_steps=self.num_steps,
      bound_kind=self.bound,
    )
