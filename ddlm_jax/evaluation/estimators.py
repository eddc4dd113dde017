"""Lower-variance Monte-Carlo estimates of the masked-diffusion bound.

The bound of a text is an expectation over the diffusion time t and the
mask drawn at t. A plain estimate averages S i.i.d. draws of (t, mask);
the estimators here spend the same S network calls better:

  'iid'         u_s ~ U[0, 1] independently (the baseline).
  'stratified'  one time per stratum: u_s = (s + U_s) / S. The per-sample
                NELBO varies most with t (few masks near t = 0, many near
                1), and stratifying removes the part of the variance that
                is between strata. Its standard error is the collapsed-
                strata estimate (adjacent strata paired), which is
                conservative.
  'antithetic'  pairs (u, 1 - u): a high-t and a low-t draw whose errors
                are negatively correlated. Pair means are i.i.d., so the
                standard error is the usual one over pairs.
  'counts'      t integrated out: for a time-free network the bound is
                sum_k c_k A_k, with A_k the expected masked cross-entropy
                of a uniformly random mask of k of the n scored positions
                and c_k = E_t[weight(t) P(k masks | t)] computed once by
                quadrature. Each draw takes k from stratified uniforms
                over 1..n and a random k-subset, weighted n c_k. This is
                the one that pays: with the 1/t weight of the log-linear
                schedule most of the variance is the mask draw at small t
                (one masked token weighted 1/t), which stratifying t alone
                cannot remove (tests/test_estimators.py measures all four).
                It needs continuous time and a time-free network.

Time u in [0, 1] maps to the process's t (and bound weight) exactly as
`MaskedDiffusion.sample_times` maps it, so every estimator is unbiased for
the same bound the suite reports.

Mask randomness: position l of sample s is masked iff r_{s,l} < 1 -
alpha(t_s), with r drawn from the seed, the sample index and the position
only, never from the text or the batch it sits in: the estimate of a
request does not depend on its batch, and requests scored with the same
seed share their draws (common random numbers). The mask is NOT shared
across the samples of one estimate: with r fixed, the S samples only
average over t and the variance over r would not shrink with S
(`share_across_samples=True` exists to measure that; the variance
benchmark reports it).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.training.config import ConfigError

ESTIMATORS = ('iid', 'stratified', 'antithetic', 'counts')


def check_estimator(estimator: str, samples: int) -> None:
  """ConfigError unless `estimator` is known and `samples` suits it."""
  if estimator not in ESTIMATORS:
    raise ConfigError(f'estimator={estimator!r}; choose one of {ESTIMATORS}.')
  if samples < 1:
    raise ConfigError(f'samples={samples}: need at least 1 draw.')
  if estimator != 'iid' and samples % 2:
    raise ConfigError(
      f'estimator={estimator!r} pairs its draws: samples={samples} must be '
      'even (e.g. 2, 16, 128).'
    )


def time_uniforms(estimator: str, key: jax.Array, samples: int) -> jax.Array:
  """u_S in [0, 1): the time draws of one estimate (see module docstring)."""
  if estimator == 'iid':
    return jax.random.uniform(key, (samples,))
  if estimator == 'stratified':
    u_S = jax.random.uniform(key, (samples,))
    return (jnp.arange(samples, dtype=jnp.float32) + u_S) / samples
  if estimator == 'antithetic':
    u_H = jax.random.uniform(key, (samples // 2,))
    return jnp.concatenate([u_H, 1.0 - u_H])
  if estimator == 'counts':  # Stratified too: over the mask counts.
    return time_uniforms('stratified', key, samples)
  raise ValueError(f'estimator={estimator!r}; choose one of {ESTIMATORS}.')


def masked_times(process: MaskedDiffusion, u_S: jax.Array):
  """(t_S, weight_S) of uniforms u_S, as `sample_times` maps its draws."""
  if process.num_steps:
    steps = process.num_steps
    t_S = jnp.minimum((jnp.floor(u_S * steps) + 1.0) / steps, 1.0)
    s_S = t_S - 1.0 / steps
    return t_S, steps * process.schedule.discrete_weight(s_S, t_S)
  t_S = process.t_min + (1.0 - process.t_min) * u_S
  return t_S, process.time_weight(t_S)


def count_weights(process: MaskedDiffusion, length: int) -> np.ndarray:
  """c_NxK (float64, [length + 1, length + 1]): c[n, k] = E_t[weight(t)
  P(k of n positions masked at t)], t ~ U[t_min, 1] as the process draws.

  For a time-free network, E[nelbo] = sum_k c[n, k] A_k + constants, with
  A_k the expected masked cross-entropy of a uniform k-subset. Gauss-
  Legendre quadrature over [t_min, 1] (exact for the log-linear schedule,
  whose integrand is a polynomial of degree < n).
  """
  if process.num_steps:
    raise ConfigError(
      "estimator='counts' integrates continuous time; this run has "
      f'process.num_steps={process.num_steps}: use estimator=stratified.'
    )
  lo = process.t_min
  nodes, weights = np.polynomial.legendre.leggauss(max(64, length + 2))
  t_Q = lo + (1.0 - lo) * 0.5 * (nodes + 1.0)
  w_Q = 0.5 * weights  # Density 1 / (1 - lo) times the Jacobian.
  with jax.ensure_compile_time_eval():
    alpha_Q = np.asarray(process.schedule.alpha(jnp.asarray(t_Q)), np.float64)
    tw_Q = np.asarray(process.time_weight(jnp.asarray(t_Q)), np.float64)
  alpha_Q = np.clip(alpha_Q, 1e-300, 1.0)
  mask_Q = np.clip(1.0 - alpha_Q, 1e-300, 1.0)
  c = np.zeros((length + 1, length + 1))
  for n in range(1, length + 1):
    k = np.arange(n + 1)
    log_binom = _lgamma(n + 1) - _lgamma(k + 1) - _lgamma(n - k + 1)  # [K]
    log_p_KxQ = (
      log_binom[:, None]
      + k[:, None] * np.log(mask_Q)[None]
      + (n - k)[:, None] * np.log(alpha_Q)[None]
    )
    c[n, : n + 1] = np.exp(log_p_KxQ) @ (w_Q * tw_Q)
  return c


def _lgamma(x):
  return np.vectorize(math.lgamma)(np.asarray(x, np.float64))


def mask_uniforms(
  key: jax.Array, samples: int, length: int, *, share_across_samples=False
) -> jax.Array:
  """r_SxL: position l of sample s is masked iff r < 1 - alpha(t_s)."""
  if share_across_samples:
    return jnp.broadcast_to(
      jax.random.uniform(key, (length,)), (samples, length)
    )
  return jax.random.uniform(key, (samples, length))


def mean_and_stderr(values_SxB, estimator: str):
  """(mean_B, stderr_B) of S draws per column, as `estimator` drew them.

  iid: sample standard deviation / sqrt(S). antithetic: the same over the
  S/2 pair means (draw s pairs with s + S/2). stratified: the collapsed-
  strata estimate sqrt(sum_k (y_2k - y_2k+1)^2) / S, which overstates the
  error a little (it counts the spread between adjacent strata).
  """
  y = np.asarray(values_SxB, np.float64)
  squeeze = y.ndim == 1
  if squeeze:
    y = y[:, None]
  s = y.shape[0]
  mean = y.mean(0)
  if s < 2:
    stderr = np.zeros_like(mean)
  elif estimator == 'iid':
    stderr = y.std(0, ddof=1) / math.sqrt(s)
  elif estimator == 'antithetic':
    pairs = 0.5 * (y[: s // 2] + y[s // 2 :])
    if len(pairs) < 2:
      stderr = np.abs(y[0] - y[1]) / 2.0
    else:
      stderr = pairs.std(0, ddof=1) / math.sqrt(len(pairs))
  elif estimator in ('stratified', 'counts'):
    diff = y[0::2] - y[1::2]
    stderr = np.sqrt(np.sum(diff**2, 0)) / s
  else:
    raise ValueError(f'estimator={estimator!r}; choose one of {ESTIMATORS}.')
  if squeeze:
    return float(mean[0]), float(stderr[0])
  return mean, stderr


def masked_bound_draws(
  process: MaskedDiffusion,
  apply,
  key: jax.Array,
  x_BxL: jax.Array,
  loss_mask_BxL: jax.Array,
  keep_BxL: jax.Array | None = None,
  *,
  samples: int,
  estimator: str = 'stratified',
  share_across_samples: bool = False,
) -> jax.Array:
  """nelbo_SxB: S draws of the (conditional) masked-diffusion bound.

  Positions with `keep_BxL` = 1 are never masked (the context of a
  conditional bound); positions with `loss_mask_BxL` = 0 are left out of
  the bound (context, padding). Positions neither kept nor in the loss
  (the rest of a row after a continuation) are masked at every t: the
  network sees them as unknown, which marginalises them out. Without
  `keep_BxL` every position is masked at random, as `corrupt` draws, so
  the bound is the one `sequence_nll` estimates. The mean over
  draws is an unbiased estimate of the bound on -log p(x[loss] | x[keep]).
  """
  batch, length = x_BxL.shape
  loss_BxL = jnp.asarray(loss_mask_BxL, jnp.float32)
  conditional = keep_BxL is not None
  if conditional:
    keep_BxL = jnp.asarray(keep_BxL, jnp.float32) > 0
  t_key, m_key = jax.random.split(key)
  u_S = time_uniforms(estimator, t_key, samples)
  r_SxL = mask_uniforms(
    m_key, samples, length, share_across_samples=share_across_samples
  )
  if estimator == 'counts':
    return _count_draws(
      process,
      apply,
      x_BxL,
      loss_BxL,
      keep_BxL if conditional else None,
      u_S,
      r_SxL,
    )
  t_S, weight_S = masked_times(process, u_S)

  def one(args):
    t, weight, r_L = args
    drawn_BxL = jnp.broadcast_to(r_L >= process.schedule.alpha(t), x_BxL.shape)
    if conditional:
      hidden_BxL = ~keep_BxL & ((loss_BxL <= 0) | drawn_BxL)
    else:  # As `corrupt` draws: every position, padding included.
      hidden_BxL = drawn_BxL
    z_BxL = jnp.where(hidden_BxL, process.mask_id, x_BxL)
    t_B = jnp.full((batch,), t, jnp.float32)
    logits_BxLxV = process.network_logits(apply, z_BxL, x_BxL, t_B)
    weight_B = jnp.full((batch,), weight, jnp.float32)
    return process.bound(logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_BxL)[1]

  return jax.lax.map(one, (t_S, weight_S, r_SxL))


def _count_draws(process, apply, x_BxL, loss_BxL, keep_BxL, u_S, r_SxL):
  """nelbo_SxB of the 'counts' estimator (see the module docstring).

  Scored positions not kept are the n candidates; positions neither kept
  nor scored stay masked at every draw.
  """
  batch, length = x_BxL.shape
  with jax.ensure_compile_time_eval():
    c_NxK = jnp.asarray(count_weights(process, length), jnp.float32)
  kept_BxL = jnp.zeros(x_BxL.shape, bool) if keep_BxL is None else keep_BxL
  free_BxL = (loss_BxL > 0) & ~kept_BxL
  n_B = free_BxL.sum(-1)

  def one(args):
    u, r_L = args
    k_B = jnp.clip(1 + jnp.floor(u * n_B).astype(jnp.int32), 1, length)
    k_B = jnp.minimum(k_B, jnp.maximum(n_B, 1))
    order_BxL = jnp.where(free_BxL, r_L[None, :], 2.0)
    rank_BxL = jnp.argsort(jnp.argsort(order_BxL, axis=-1), axis=-1)
    chosen_BxL = free_BxL & (rank_BxL < k_B[:, None])
    hidden_BxL = chosen_BxL | (~kept_BxL & ~free_BxL)
    z_BxL = jnp.where(hidden_BxL, process.mask_id, x_BxL)
    t_B = k_B / jnp.maximum(n_B, 1).astype(jnp.float32)  # Unread by the net.
    logits_BxLxV = process.network_logits(apply, z_BxL, x_BxL, t_B)
    weight_B = c_NxK[n_B, k_B] * n_B
    return process.bound(logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_BxL)[1]

  return jax.lax.map(one, (u_S, r_SxL))


@functools.partial(
  jax.jit,
  static_argnames=(
    'graphdef',
    'process',
    'samples',
    'estimator',
    'share_across_samples',
  ),
)
def bound_draws(
  params,
  key,
  x_BxL,
  loss_mask_BxL,
  keep_BxL=None,
  *,
  graphdef,
  process,
  samples: int,
  estimator: str = 'stratified',
  share_across_samples: bool = False,
):
  """nelbo_SxB of a network given by (graphdef, params); see
  `masked_bound_draws`. Processes other than plain masked diffusion draw
  i.i.d. through their own `loss` (and refuse a kept context)."""
  apply = nnx.merge(graphdef, params)
  if supports_estimators(process):
    return masked_bound_draws(
      process,
      apply,
      key,
      x_BxL,
      loss_mask_BxL,
      keep_BxL,
      samples=samples,
      estimator=estimator,
      share_across_samples=share_across_samples,
    )
  if keep_BxL is not None:
    raise ValueError(
      f'a kept context needs masked diffusion; {type(process).__name__} '
      'has no conditional bound here.'
    )

  def one(k):
    return process.loss(apply, k, x_BxL, loss_mask_BxL)[1]

  return jax.lax.map(one, jax.random.split(key, samples))


def supports_estimators(process) -> bool:
  """Plain masked diffusion: its draws can be steered (t and masks)."""
  return type(process) is MaskedDiffusion


__all__ = [
  'ESTIMATORS',
  'bound_draws',
  'check_estimator',
  'mask_uniforms',
  'masked_bound_draws',
  'masked_times',
  'mean_and_stderr',
  'supports_estimators',
  'time_uniforms',
]
