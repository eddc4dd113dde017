"""Uniform-state diffusion (UDLM / Duo) with the leave-one-out view.

Each token independently stays itself with probability alpha(t) and is
otherwise redrawn uniformly over the V data tokens (there is no mask token):
q(z_t | x) = alpha_t x + (1 - alpha_t) / V. Notation and formulas follow
UDLM (arXiv 2412.10193) and Duo (arXiv 2506.10892).

Two predictors matter, and they differ (Uniform Diffusion Models Revisited):

- the denoiser p(x^i | z_t), which sees the noisy token z_t^i, and
- the leave-one-out (LOO) posterior p(x^i | z_t^{-i}), which does not.

They are related exactly by Bayes' rule at one position,
p(x^i = v | z_t) ~ p(x^i = v | z_t^{-i}) q(z_t^i | v), i.e.
denoiser_logits = loo_logits + log(1 + V alpha_t / (1 - alpha_t)) 1[v = z_t^i].
The exact reverse marginal p(z_s | z_t) = sum_v p(v | z_t) q(z_s | z_t, v) is
linear in the denoiser, and it equals the plug-in posterior of REFERENCE
(Duo's `_posterior_from_x0`, a ratio of two linear forms) evaluated at the
LOO probabilities. Hence the plug-in NELBO is minimised by the LOO posterior,
so the bound here always plugs LOO probabilities into the posterior, the
samplers mix the posterior linearly with denoiser probabilities
(`posterior_probs` on `denoiser_log_probs`), and the Gibbs corrector uses
`loo_log_probs`. The network may output either (`parameterization`); the
conversion is exact.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import (
  DiffusionProcess,
  ProcessConfig,
  ScheduledConfig,
)
from ddlm_jax.diffusion.masked import antithetic_uniform, check_loss_and_times
from ddlm_jax.diffusion.schedules import Schedule

PARAMETERIZATIONS = ('denoiser', 'loo')


def broadcast_alpha(alpha, ndim: int = 3):
  """Scalar -> scalar; [B] -> [B, 1, 1]; [B, L] -> [B, L, 1] (float32+)."""
  alpha = as_float(alpha)
  return alpha.reshape(alpha.shape + (1,) * (ndim - alpha.ndim))


def as_float(x: jax.Array) -> jax.Array:
  """x in at least float32 (bf16 logits up-cast; float64 kept under x64)."""
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def log_prob_cross_entropy(logp_BxLxV: jax.Array, x_BxL: jax.Array):
  """-logp[x] per position; -inf entries elsewhere give no 0 * inf NaN."""
  is_x_BxLxV = jax.nn.one_hot(x_BxL, logp_BxLxV.shape[-1], dtype=bool)
  return -jnp.sum(jnp.where(is_x_BxLxV, logp_BxLxV, 0.0), -1)


def _xlogy(x: float, y: float) -> float:
  """x log y with 0 log 0 = 0, in Python floats (compile-time constants)."""
  return 0.0 if x == 0.0 else x * math.log(y)


def check_common(process) -> None:
  """Shared range checks of the non-masked processes (ValueError)."""
  check_loss_and_times(process.loss_type, process.t_min)
  if process.parameterization not in PARAMETERIZATIONS:
    raise ValueError(
      f'parameterization={process.parameterization!r}; choose one of '
      f'{PARAMETERIZATIONS} (what the network outputs).'
    )
  if isinstance(process.num_steps, bool) or not isinstance(
    process.num_steps, int
  ):
    raise ValueError(
      f'num_steps must be an int (0 for continuous time), got '
      f'{process.num_steps!r}.'
    )
  if process.num_steps < 0:
    raise ValueError(
      f'num_steps must be >= 0 (0 for continuous time), got '
      f'{process.num_steps}.'
    )
  if isinstance(process.vocab_size, bool) or not isinstance(
    process.vocab_size, int
  ):
    raise ValueError(f'vocab_size must be an int, got {process.vocab_size!r}.')
  if process.vocab_size < 2:
    raise ValueError(
      f'vocab_size must be >= 2 (one token cannot be noised), got '
      f'{process.vocab_size}.'
    )


def uniform_marginal(x_probs_BxLxV: jax.Array, alpha) -> jax.Array:
  """q(z_t | x) = alpha x + (1 - alpha) / V (x one-hot or probabilities)."""
  vocab = x_probs_BxLxV.shape[-1]
  alpha = broadcast_alpha(alpha, x_probs_BxLxV.ndim)
  return alpha * x_probs_BxLxV + (1.0 - alpha) / vocab


def uniform_posterior(
  x_probs_BxLxV: jax.Array, z_BxL: jax.Array, alpha_s, alpha_t
) -> jax.Array:
  """q(z_s | z_t, x) [B, L, V] for s < t, linear in x.

  For one-hot x this is Bayes' rule (UDLM, arXiv 2412.10193):
    [alpha_t V x[z_t] e_{z_t} + (a_ts - alpha_t) e_{z_t} + (alpha_s - alpha_t)
     x + (1 - a_ts)(1 - alpha_s) / V] / (V alpha_t x[z_t] + 1 - alpha_t),
  a_ts = alpha_t / alpha_s. For a probability vector x (a model's denoiser
  p(x | z_t)) it is the mixture sum_y x_y q(z_s | z_t, y), the exact reverse
  marginal; it equals the REFERENCE ratio evaluated at the LOO probabilities
  (see the module docstring). alpha_s / alpha_t are scalars or [B] arrays
  (broadcast to [B, 1, 1]) or [B, L].
  """
  vocab = x_probs_BxLxV.shape[-1]
  x_probs_BxLxV = as_float(x_probs_BxLxV)
  a_s = broadcast_alpha(alpha_s, x_probs_BxLxV.ndim)
  a_t = broadcast_alpha(alpha_t, x_probs_BxLxV.ndim)
  a_ts = a_t / a_s
  is_z_BxLxV = jax.nn.one_hot(z_BxL, vocab, dtype=x_probs_BxLxV.dtype)
  # c_y = x_y / (V q(z_t | y)): each clean token's weight over its likelihood.
  c_BxLxV = x_probs_BxLxV / (1.0 - a_t + vocab * a_t * is_z_BxLxV)
  c_z_BxLx1 = jnp.sum(c_BxLxV * is_z_BxLxV, -1, keepdims=True)
  total_BxLx1 = jnp.sum(c_BxLxV, -1, keepdims=True)
  stay_BxLx1 = vocab * a_t * c_z_BxLx1 + (a_ts - a_t) * total_BxLx1
  return (
    stay_BxLx1 * is_z_BxLxV
    + (a_s - a_t) * c_BxLxV
    + (1.0 - a_ts) * (1.0 - a_s) / vocab * total_BxLx1
  )


def _log_bump(alpha_t, vocab: int):
  """log(1 + V alpha / (1 - alpha)) = log V q(z | z) - log V q(z | y != z)."""
  return jnp.log1p(vocab * alpha_t / (1.0 - alpha_t))


def loo_to_denoiser_logits(
  loo_logits_BxLxV: jax.Array, z_BxL: jax.Array, alpha_t
) -> jax.Array:
  """Denoiser logits from LOO logits: Bayes with the likelihood of z_t^i."""
  vocab = loo_logits_BxLxV.shape[-1]
  loo_BxLxV = as_float(loo_logits_BxLxV)
  bump = _log_bump(broadcast_alpha(alpha_t, loo_BxLxV.ndim), vocab)
  return loo_BxLxV + bump * jax.nn.one_hot(z_BxL, vocab, dtype=jnp.float32)


def denoiser_to_loo_logits(
  logits_BxLxV: jax.Array, z_BxL: jax.Array, alpha_t
) -> jax.Array:
  """LOO logits from denoiser logits (the inverse of loo_to_denoiser_logits)."""
  vocab = logits_BxLxV.shape[-1]
  den_BxLxV = as_float(logits_BxLxV)
  bump = _log_bump(broadcast_alpha(alpha_t, den_BxLxV.ndim), vocab)
  return den_BxLxV - bump * jax.nn.one_hot(z_BxL, vocab, dtype=jnp.float32)


def uniform_nelbo_rate(
  loo_log_probs_BxLxV: jax.Array, x_BxL: jax.Array, z_BxL: jax.Array, alpha_t
) -> jax.Array:
  """Continuous-time NELBO integrand per position, per unit of -alpha'(t).

  The T -> infinity limit of the per-step KLs: with xbar = V alpha x + 1 -
  alpha for the true one-hot x and xhat for the plugged-in LOO probabilities,
    (1 / (V alpha)) [ (1 / xbar_z) sum_{v != z} xbar_v log(xbar_v / xhat_v)
                      + (V / xbar_z - 1) log(xhat_z / xbar_z)
                      + V / xhat_z - V / xbar_z ],
  a generalised KL between the jump rates out of z_t, so it is >= 0 and zero
  iff xhat = xbar. The NELBO is the integral over t of -alpha'(t) times this.
  """
  vocab = loo_log_probs_BxLxV.shape[-1]
  logr_BxLxV = as_float(loo_log_probs_BxLxV)
  a_t = broadcast_alpha(alpha_t, logr_BxLxV.ndim)
  log_hat_BxLxV = jnp.logaddexp(
    jnp.log(vocab * a_t) + logr_BxLxV, jnp.log(1.0 - a_t)
  )
  is_x_BxLxV = jax.nn.one_hot(x_BxL, vocab, dtype=jnp.float32)
  is_z_BxLxV = jax.nn.one_hot(z_BxL, vocab, dtype=jnp.float32)
  bar_BxLxV = 1.0 - a_t + vocab * a_t * is_x_BxLxV
  bar_z_BxL = jnp.sum(bar_BxLxV * is_z_BxLxV, -1)
  log_hat_z_BxL = jnp.sum(log_hat_BxLxV * is_z_BxLxV, -1)
  jumps_BxL = jnp.sum(
    (1.0 - is_z_BxLxV) * bar_BxLxV * (jnp.log(bar_BxLxV) - log_hat_BxLxV), -1
  )
  rate_BxL = (
    jumps_BxL / bar_z_BxL
    + (vocab / bar_z_BxL - 1.0) * (log_hat_z_BxL - jnp.log(bar_z_BxL))
    + vocab * jnp.exp(-log_hat_z_BxL)
    - vocab / bar_z_BxL
  )
  return rate_BxL / (vocab * a_t[..., 0])


def marginal_step_kl(
  post_BxLxK: jax.Array,
  log_q_s_x_BxLxK: jax.Array,
  log_q_s_r_BxLxK: jax.Array,
  log_q_t_x_BxL: jax.Array,
  log_q_t_r_BxL: jax.Array,
) -> jax.Array:
  """KL(q(z_s | z_t, x) || q(z_s | z_t, r)) from marginals alone.

  With both posteriors by Bayes through the same transition q(z_t | z_s),
  the transition cancels in the log-ratio:
    sum_w q_w log(q_s(w | x) / q_s(w | r)) + log(q_t(z_t | r) / q_t(z_t | x)),
  which has no 0 log 0 or -inf where the transition vanishes.
  """
  diff_BxLxK = jnp.where(post_BxLxK > 0, log_q_s_x_BxLxK - log_q_s_r_BxLxK, 0.0)
  return jnp.sum(post_BxLxK * diff_BxLxK, -1) + log_q_t_r_BxL - log_q_t_x_BxL


def uniform_step_kl(
  loo_log_probs_BxLxV: jax.Array,
  x_BxL: jax.Array,
  z_BxL: jax.Array,
  alpha_s,
  alpha_t,
) -> jax.Array:
  """Per-position KL(q(z_s | z_t, x) || q(z_s | z_t, r)), r = LOO probs."""
  vocab = loo_log_probs_BxLxV.shape[-1]
  logr_BxLxV = as_float(loo_log_probs_BxLxV)
  a_s = broadcast_alpha(alpha_s, 3)
  a_t = broadcast_alpha(alpha_t, 3)
  is_x_BxLxV = jax.nn.one_hot(x_BxL, vocab, dtype=jnp.float32)
  is_z_BxLxV = jax.nn.one_hot(z_BxL, vocab, dtype=jnp.float32)
  post_BxLxV = uniform_posterior(is_x_BxLxV, z_BxL, a_s, a_t)
  # log q(w | r) = log(alpha r_w + (1 - alpha) / V), in log space.
  log_s_r = jnp.logaddexp(
    jnp.log(a_s) + logr_BxLxV, jnp.log1p(-a_s) - math.log(vocab)
  )
  log_t_r = jnp.logaddexp(
    jnp.log(a_t) + logr_BxLxV, jnp.log1p(-a_t) - math.log(vocab)
  )
  log_s_x = jnp.log(a_s * is_x_BxLxV + (1.0 - a_s) / vocab)
  log_t_x = jnp.log(a_t * is_x_BxLxV + (1.0 - a_t) / vocab)
  pick_z = lambda a_BxLxV: jnp.sum(jnp.where(is_z_BxLxV > 0, a_BxLxV, 0.0), -1)
  return marginal_step_kl(
    post_BxLxV, log_s_x, log_s_r, pick_z(log_t_x), pick_z(log_t_r)
  )


def mixture_constants(alpha: float, vocab: int, mixing: float):
  """(reconstruction, prior) nats per token for pi = (1-p_u) e_m + p_u / V.

  reconstruction: E_{z ~ q(z | x)}[-log p(x | z)] with the fixed Bayes
  decoder p(x | z) ~ q(z | x) under a uniform prior over x, at keep-
  probability alpha (the same for every x by symmetry). prior: KL(q(z_1 | x)
  || p(z_1)) with p(z_1) = q(z_1 | uniform x), the closest factorised prior.
  mixing = 1 is the uniform process, mixing = 0 the masked one (MD4's
  (1 - alpha) log V and alpha(1) log V).
  """
  keep = alpha + (1.0 - alpha) * mixing / vocab  # q(z = x | x)
  other = (1.0 - alpha) * mixing / vocab  # q(z = v | x), v != x data token
  masked = (1.0 - alpha) * (1.0 - mixing)  # q(z = m | x)
  data = alpha + (1.0 - alpha) * mixing  # sum_y q(z = v | y), v data
  recon = masked * math.log(vocab)
  if keep > 0:
    recon -= _xlogy(keep, keep / data)
  if other > 0:
    recon -= (vocab - 1) * _xlogy(other, other / data)
  prior = 0.0
  if keep > 0:
    prior += _xlogy(keep, keep * vocab / data)
  if other > 0:
    prior += (vocab - 1) * _xlogy(other, other * vocab / data)
  return recon, prior


def schedule_alpha(schedule: Schedule, t: float) -> float:
  """alpha(t) as a Python float, even while tracing."""
  with jax.ensure_compile_time_eval():
    return float(schedule.alpha(float(t)))


class PluginNELBO(DiffusionProcess):
  """loss / draw / bound of the processes that plug the LOO into the bound.

  Shared by UniformDiffusion and InterpolatingDiffusion, which supply the
  fields num_steps, t_min, antithetic, schedule, loss_type and corrupt,
  diffusion_terms (per-position rate or step KL),
  constant_nats (reconstruction and prior nats per token),
  denoiser_log_probs, aux_stats and the loss_type field.
  """

  def sample_times(self, key: jax.Array, batch: int):
    """(t_B, weight_B): times and the weight of the per-position terms."""
    if self.antithetic:
      u_B = antithetic_uniform(key, batch)
    else:
      u_B = jax.random.uniform(key, (batch,))
    if self.num_steps:
      steps = self.num_steps
      t_B = jnp.minimum((jnp.floor(u_B * steps) + 1.0) / steps, 1.0)
      return t_B, jnp.full((batch,), float(steps))
    t_B = self.t_min + (1.0 - self.t_min) * u_B
    return t_B, -(1.0 - self.t_min) * self.schedule.dalpha(t_B)

  def draw(self, key: jax.Array, x_BxL: jax.Array):
    """(t_B, weight_B, z_BxL), with MaskedDiffusion.draw's key use."""
    t_key, noise_key = jax.random.split(key)
    t_B, weight_B = self.sample_times(t_key, x_BxL.shape[0])
    return t_B, weight_B, self.corrupt(noise_key, x_BxL, t_B)

  def bound(self, logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_mask_BxL):
    """(objective_B, nelbo_B, aux) of one prediction at z_t (see loss).

    weight_B is sample_times' weight: (1 - t_min)(-alpha'(t)) in continuous
    time, T for T steps (s = t - 1/T).
    """
    batch, length = x_BxL.shape
    valid_BxL = jnp.ones((batch, length), jnp.float32)
    if loss_mask_BxL is not None:
      valid_BxL = as_float(loss_mask_BxL)
    valid_B = valid_BxL.sum(-1)
    terms_BxL = self.diffusion_terms(logits_BxLxV, x_BxL, z_BxL, t_B)
    recon, prior = self.constant_nats()
    nelbo_B = (
      weight_B * jnp.sum(terms_BxL * valid_BxL, -1) + (recon + prior) * valid_B
    )
    if self.loss_type == 'elbo':
      objective_B = nelbo_B
    else:
      logp_BxLxV = self.denoiser_log_probs(logits_BxLxV, z_BxL, t_B)
      ce_BxL = log_prob_cross_entropy(logp_BxLxV, x_BxL)
      objective_B = jnp.sum(ce_BxL * valid_BxL, -1)
    aux = {**self.aux_stats(x_BxL, z_BxL, valid_BxL), 't': t_B}
    return objective_B, nelbo_B, aux


@dataclasses.dataclass(frozen=True)
class UniformDiffusion(PluginNELBO):
  """Uniform-state diffusion over V tokens (no mask token).

  The reported NELBO is a full bound, in nats per sequence:
    reconstruction at t_min (continuous) or t = 0 (T steps), with the fixed
      Bayes decoder p(x | z) ~ q(z | x) in closed form (`constant_nats`);
    + the diffusion term: continuous time, (1 - t_min) E_t[-alpha'(t)
      sum_i uniform_nelbo_rate] with t ~ U[t_min, 1]; T steps, T E_t[sum_i
      KL(q(z_s | z_t, x) || q(z_s | z_t, r))] on t in {1/T, ..., 1};
    + the prior term KL(q(z_1 | x) || uniform) per token.
  r is always the LOO probability vector (see the module docstring).

  Attributes:
    schedule: keep-probability alpha(t) (log-linear, cosine, ... all work).
    vocab_size: V; the network sees and predicts V tokens.
    num_steps: 0 for the continuous-time NELBO, T > 0 for the T-step one
      (which ignores t_min).
    t_min: continuous times are drawn from [t_min, 1].
    antithetic: stratify the batch's times (MD4).
    loss_type: 'elbo' trains on the NELBO; 'simple_ce' on the cross-entropy
      of the denoiser at every position. Both report the NELBO.
    parameterization: what the network's logits are, 'denoiser'
      p(x^i | z_t) or 'loo' p(x^i | z_t^{-i}).
  """

  schedule: Schedule
  vocab_size: int
  num_steps: int = 0
  t_min: float = 1e-3
  antithetic: bool = True
  loss_type: str = 'elbo'
  parameterization: str = 'denoiser'

  causal = False
  requires_time_conditioning = True
  family = 'uniform'

  def __post_init__(self):
    check_common(self)

  @property
  def input_vocab_size(self) -> int:
    """Embedding rows the network needs: the V data tokens only."""
    return self.vocab_size

  def constant_nats(self):
    """(reconstruction, prior) nats per token (see mixture_constants)."""
    t_rec = 0.0 if self.num_steps else self.t_min
    recon, _ = mixture_constants(
      schedule_alpha(self.schedule, t_rec), self.vocab_size, 1.0
    )
    _, prior = mixture_constants(
      schedule_alpha(self.schedule, 1.0), self.vocab_size, 1.0
    )
    return recon, prior

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_B: jax.Array):
    """z_t ~ q(z_t | x): keep w.p. alpha(t), else uniform over V.

    The keep draw uses `key` itself (as MaskedDiffusion.corrupt does), so the
    interpolating process at its ends reproduces both processes' z_t.
    """
    alpha_Bx1 = self.schedule.alpha(t_B)[:, None]
    keep_BxL = jax.random.uniform(key, x_BxL.shape) < alpha_Bx1
    noise_BxL = jax.random.randint(
      jax.random.fold_in(key, 1),
      x_BxL.shape,
      0,
      self.vocab_size,
      dtype=x_BxL.dtype,
    )
    return jnp.where(keep_BxL, x_BxL, noise_BxL)

  def forward_marginal(self, x_probs_BxLxV, alpha) -> jax.Array:
    """q(z | x) = alpha x + (1 - alpha) / V over the V data tokens."""
    return uniform_marginal(x_probs_BxLxV, alpha)

  def prior_sample(self, key: jax.Array, shape) -> jax.Array:
    """z_1 from the prior: uniform tokens."""
    return jax.random.randint(key, shape, 0, self.vocab_size, dtype=jnp.int32)

  def denoiser_log_probs(self, logits_BxLxV, z_BxL, t_B) -> jax.Array:
    """log p(x^i | z_t) (converted when the network outputs LOO logits)."""
    logits = as_float(logits_BxLxV)
    if self.parameterization == 'loo':
      logits = loo_to_denoiser_logits(logits, z_BxL, self.schedule.alpha(t_B))
    return jax.nn.log_softmax(logits, axis=-1)

  def loo_log_probs(self, logits_BxLxV, z_BxL, t_B) -> jax.Array:
    """log p(x^i | z_t^{-i}) (converted when the network is a denoiser)."""
    logits = as_float(logits_BxLxV)
    if self.parameterization == 'denoiser':
      logits = denoiser_to_loo_logits(logits, z_BxL, self.schedule.alpha(t_B))
    return jax.nn.log_softmax(logits, axis=-1)

  def posterior_probs(self, x_probs_BxLxV, z_BxL, s_B, t_B) -> jax.Array:
    """q(z_s | z_t, x) with the schedule's alphas; linear in x (a denoiser)."""
    return uniform_posterior(
      x_probs_BxLxV,
      z_BxL,
      self.schedule.alpha(jnp.asarray(s_B)),
      self.schedule.alpha(jnp.asarray(t_B)),
    )

  def diffusion_terms(self, logits_BxLxV, x_BxL, z_BxL, t_B) -> jax.Array:
    """Per-position diffusion terms (rate, or one step's KL), LOO plugged in."""
    loo_BxLxV = self.loo_log_probs(logits_BxLxV, z_BxL, t_B)
    alpha_t = self.schedule.alpha(t_B)
    if self.num_steps:
      s_B = jnp.maximum(t_B - 1.0 / self.num_steps, 0.0)
      return uniform_step_kl(
        loo_BxLxV, x_BxL, z_BxL, self.schedule.alpha(s_B), alpha_t
      )
    return uniform_nelbo_rate(loo_BxLxV, x_BxL, z_BxL, alpha_t)

  def aux_stats(self, x_BxL, z_BxL, valid_BxL) -> dict:
    """Per-sequence statistics logged with the loss."""
    changed_BxL = (z_BxL != x_BxL).astype(jnp.float32) * valid_BxL
    return {
      'changed_fraction': changed_BxL.sum(-1)
      / jnp.maximum(valid_BxL.sum(-1), 1.0)
    }


@dataclasses.dataclass(frozen=True)
class PluginConfig(ScheduledConfig):
  """Settings the uniform-state and interpolating families add: num_steps
  (0 = continuous-time NELBO, T = T-step) and parameterization (what the
  network outputs: 'denoiser' | 'loo')."""

  num_steps: int = 0
  parameterization: str = 'denoiser'

  def process_kwargs(self, vocab_size: int) -> dict:
    return dict(
      self.scheduled_kwargs(vocab_size),
      num_steps=self.num_steps,
      parameterization=self.parameterization,
    )


@ProcessConfig.register('udlm')
@dataclasses.dataclass(frozen=True)
class UniformConfig(PluginConfig):
  """config.process of uniform-state diffusion (UDLM)."""

  family: ClassVar[str] = 'uniform'
  requires_time_conditioning: ClassVar[bool] = True

  def build(self, vocab_size: int) -> UniformDiffusion:
    return UniformDiffusion(**self.process_kwargs(vocab_size))
