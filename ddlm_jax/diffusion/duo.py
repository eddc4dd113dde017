"""Duo: uniform-state diffusion as the argmax of a Gaussian diffusion.

Duo (Sahoo et al. 2025, arXiv 2506.10892) observes that if
w_t = a e_x + s eps with eps ~ N(0, I_V), then z_t = argmax(w_t) is exactly
a uniform-state diffusion: z_t = x with probability P[argmax w_t = x] and
every other class equally likely, i.e. q(z_t | x) = alpha x + (1 - alpha) / V
with alpha = (V P - 1) / (V - 1). Duo parameterises the Gaussian process by
gamma_t = gamma_min + t (gamma_max - gamma_min), a = sqrt(sigmoid(-gamma)),
s = sqrt(sigmoid(gamma)), so the argmax only depends on the mean shift
m = a / s = exp(-gamma / 2), and

  P(m) = int phi(z - m) Phi(z)^(V - 1) dz.

This module tabulates P and dP/dm once per (V, grid) in float64 numpy, looks
them up in JAX by linear interpolation (jit-friendly), and uses the map for
two things: a schedule (`GaussianArgmaxSchedule`) that plugs into the
uniform process, and Duo's curriculum (`DuoDiffusion`), which trains the
network on the tempered softmax of w_t while scoring the discrete bound at
argmax(w_t). Facts from Duo (arXiv 2506.10892).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.diffusion.base import ApplyFn, DiffusionProcess, ProcessConfig
from ddlm_jax.diffusion.schedules import Schedule
from ddlm_jax.diffusion.uniform import UniformConfig, UniformDiffusion

# phi(10) ~ 8e-23: the quadrature ignores |z - m| > 10 (float64 can't tell).
DEFAULT_HALF_WIDTH = 10.0
# Step of the quadrature grid and of the table in m. The trapezoid rule on
# this smooth, fast-decaying integrand is accurate to ~1e-13 already at
# step 0.02; the step mainly bounds the linear-interpolation error of the
# lookups (~ step^2 / 8 |alpha''| < 1e-5).
DEFAULT_GRID_STEP = 0.005

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _log_ndtr(z: np.ndarray) -> np.ndarray:
  """log Phi(z) in float64, accurate in both tails (numpy has no erf)."""
  z = np.asarray(z, np.float64)
  tail = _erfc(np.abs(z) / math.sqrt(2.0)).astype(np.float64)
  with np.errstate(divide='ignore'):
    return np.where(z > 0, np.log1p(-0.5 * tail), np.log(0.5 * tail))


class ArgmaxTable(NamedTuple):
  """P(m) = P[argmax(m e_x + eps) = x] and dP/dm on a uniform grid in m.

  mean_shift starts at 0 (P = 1 / V) and ends where P is 1 to float64
  precision. alpha = (V P - 1) / (V - 1) and dalpha = d alpha / dm are
  stored as well, computed in float64: near alpha = 0 the float32
  difference V P - 1 would cancel.
  """

  mean_shift: np.ndarray
  prob: np.ndarray
  dprob: np.ndarray
  alpha: np.ndarray
  dalpha: np.ndarray


def _check_vocab(vocab_size: int):
  if int(vocab_size) != vocab_size or vocab_size < 2:
    raise ValueError(
      f'vocab_size must be an integer >= 2, got {vocab_size!r}; the argmax '
      'map needs at least two classes.'
    )


def argmax_table(
  vocab_size: int,
  grid_step: float = DEFAULT_GRID_STEP,
  half_width: float = DEFAULT_HALF_WIDTH,
) -> ArgmaxTable:
  """P(m) and its analytic derivative, tabulated once per (V, grid).

  The arguments are normalised before the cache (functools.lru_cache keys
  f(13) and f(13, 0.005) apart), so every spelling shares one table.
  """
  _check_vocab(vocab_size)
  return _build_table(int(vocab_size), float(grid_step), float(half_width))


@functools.lru_cache(maxsize=64)
def _build_table(
  vocab_size: int, grid_step: float, half_width: float
) -> ArgmaxTable:
  """Tabulates P(m) and P'(m) by quadrature (see argmax_table).

  With u = z - m on the grid u_i = -W + i h and m_j = j h, both integrals

    P(m_j)     = sum_i h phi(u_i)     Phi(u_i + m_j)^(V-1)
    P'(m_j)    = sum_i h u_i phi(u_i) Phi(u_i + m_j)^(V-1)

  are correlations of the fixed kernel with one vector Phi(z_k)^(V-1),
  z_k = -W + k h, so one FFT computes every m at once (trapezoid rule; the
  end points are below 1e-22). P' is d/dm int phi(z - m) Phi(z)^(V-1) dz =
  int (z - m) phi(z - m) Phi(z)^(V-1) dz, differentiated under the integral.
  The arrays are read-only: the table is shared by every caller.
  """
  if not 0.0 < grid_step <= 0.05:
    raise ValueError(
      f'grid_step must be in (0, 0.05], got {grid_step}; a coarser grid '
      'makes the interpolated lookups inaccurate.'
    )
  if not half_width >= 8.0:
    raise ValueError(
      f'half_width must be >= 8, got {half_width}; the Gaussian tail beyond '
      'it must be negligible.'
    )
  v = int(vocab_size)
  # The max of V - 1 standard normals stays below sqrt(2 log V) + a few, so
  # beyond m_end = that + W the keep probability is 1 in float64.
  m_end = math.sqrt(2.0 * math.log(v)) + half_width
  num_m = int(math.ceil(m_end / grid_step)) + 1
  num_u = int(round(2.0 * half_width / grid_step)) + 1
  u = -half_width + grid_step * np.arange(num_u)
  z = -half_width + grid_step * np.arange(num_u + num_m - 1)
  cdf_pow = np.exp((v - 1) * _log_ndtr(z))
  kernel = grid_step * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
  size = 1 << (z.size + u.size - 1).bit_length()
  cdf_fft = np.fft.rfft(cdf_pow, size)

  def correlate(k):
    full = np.fft.irfft(cdf_fft * np.fft.rfft(k[::-1], size), size)
    return full[num_u - 1 : num_u - 1 + num_m]

  # P rises from 1 / V (exact at m = 0: all classes alike) to 1; the clip
  # and the running maximum only remove FFT rounding (~1e-13).
  prob = np.clip(correlate(kernel), 1.0 / v, 1.0)
  prob[0] = 1.0 / v
  prob = np.maximum.accumulate(prob)
  dprob = np.maximum(correlate(u * kernel), 0.0)
  mean_shift = grid_step * np.arange(num_m)
  alpha = (v * prob - 1.0) / (v - 1.0)
  dalpha = v / (v - 1.0) * dprob
  table = ArgmaxTable(mean_shift, prob, dprob, alpha, dalpha)
  for arr in table:
    arr.flags.writeable = False
  return table


def latent_coefficients(gamma):
  """(a, s) = (sqrt(sigmoid(-gamma)), sqrt(sigmoid(gamma))): a^2 + s^2 = 1."""
  gamma = jnp.asarray(gamma, jnp.float32)
  return jnp.sqrt(jax.nn.sigmoid(-gamma)), jnp.sqrt(jax.nn.sigmoid(gamma))


def mean_shift(gamma):
  """m = a / s = exp(-gamma / 2): the only thing the argmax depends on."""
  return jnp.exp(-0.5 * jnp.asarray(gamma, jnp.float32))


def _lookup(values: np.ndarray, grid_step: float, m, right: float):
  """Linear interpolation of a table on the uniform grid m_j = j h.

  The same numbers as jnp.interp(m, mean_shift, values), but the cell is
  floor(m / h) instead of a binary search: a few element-wise ops, which
  compile and run several times faster (the loss looks alpha up often).
  Beyond the last node it returns `right`.
  """
  table = jnp.asarray(values, jnp.float32)  # a few thousand constants
  last = table.shape[0] - 1
  pos = jnp.clip(m / grid_step, 0.0, float(last))
  cell = jnp.minimum(jnp.floor(pos).astype(jnp.int32), last - 1)
  frac = pos - cell
  # Monotone tables give monotone lookups: within a cell frac * diff grows
  # with frac, and at frac = 1 the sum is the next node exactly (the
  # difference of neighbouring nodes is exact in float32, Sterbenz).
  inside = table[cell] + frac * (table[cell + 1] - table[cell])
  return jnp.where(m / grid_step > last, right, inside)


def keep_probability(
  gamma, vocab_size: int, grid_step: float = DEFAULT_GRID_STEP
):
  """Discrete alpha = (V P - 1) / (V - 1) of argmax(w) at log-SNR -gamma."""
  table = argmax_table(vocab_size, grid_step)
  return _lookup(table.alpha, grid_step, mean_shift(gamma), right=1.0)


def keep_probability_dgamma(
  gamma, vocab_size: int, grid_step: float = DEFAULT_GRID_STEP
):
  """d alpha / d gamma = V / (V - 1) P'(m) dm/dgamma, dm/dgamma = -m / 2.

  P' comes from its own (analytic) table, interpolated like P; it is zero
  beyond the table's end, where alpha is 1.
  """
  table = argmax_table(vocab_size, grid_step)
  m = mean_shift(gamma)
  return _lookup(table.dalpha, grid_step, m, right=0.0) * (-0.5 * m)


def gaussian_latent(key, x_BxL, gamma_B, vocab_size: int):
  """w_t = a e_x + s eps, eps ~ N(0, I_V): float32 [B, L, V]."""
  a_B, s_B = latent_coefficients(gamma_B)
  onehot_BxLxV = jax.nn.one_hot(x_BxL, vocab_size, dtype=jnp.float32)
  eps_BxLxV = jax.random.normal(key, onehot_BxLxV.shape, jnp.float32)
  return a_B[:, None, None] * onehot_BxLxV + s_B[:, None, None] * eps_BxLxV


@dataclasses.dataclass(frozen=True)
class GaussianArgmaxSchedule(Schedule):
  """alpha(t) of argmax(w_t) with gamma_t linear in t (Duo's schedule).

  alpha decreases from keep_probability(gamma_min) at t = 0 to
  keep_probability(gamma_max) at t = 1; in a uniform process it makes the
  discrete bound at z_t = argmax(w_t) exactly that process's bound.
  """

  vocab_size: int
  gamma_min: float = -3.55
  gamma_max: float = -1.85
  grid_step: float = DEFAULT_GRID_STEP

  def __post_init__(self):
    _check_vocab(self.vocab_size)
    if not (math.isfinite(self.gamma_min) and math.isfinite(self.gamma_max)):
      raise ValueError(
        f'gamma_min={self.gamma_min}, gamma_max={self.gamma_max}: both must '
        'be finite.'
      )
    if self.gamma_min >= self.gamma_max:
      raise ValueError(
        f'gamma_min={self.gamma_min} must be < gamma_max={self.gamma_max} '
        '(noise grows with t); swap them or widen the window.'
      )
    argmax_table(self.vocab_size, self.grid_step)  # validates the grid

  def gamma(self, t):
    return self.gamma_min + jnp.asarray(t, jnp.float32) * (
      self.gamma_max - self.gamma_min
    )

  def alpha(self, t):
    return keep_probability(self.gamma(t), self.vocab_size, self.grid_step)

  def dalpha(self, t):
    # Chain rule: d alpha/dt = d alpha/d gamma * (gamma_max - gamma_min).
    return (self.gamma_max - self.gamma_min) * keep_probability_dgamma(
      self.gamma(t), self.vocab_size, self.grid_step
    )


# The cache statistics of the shared tables (tests check they are reused).
argmax_table.cache_info = _build_table.cache_info


def equivalent_time(schedule: Schedule, alpha_B, iters: int = 32):
  """The t in [0, 1] with schedule.alpha(t) = alpha, by bisection.

  Any decreasing schedule works (no closed-form inverse needed); 32 halvings
  reach float32 resolution. Values outside the schedule's range clamp to
  t = 0 or 1.
  """
  alpha_B = jnp.asarray(alpha_B, jnp.float32)

  def halve(_, bounds):
    lo_B, hi_B = bounds
    mid_B = 0.5 * (lo_B + hi_B)
    later_B = schedule.alpha(mid_B) > alpha_B  # too little noise at mid
    return jnp.where(later_B, mid_B, lo_B), jnp.where(later_B, hi_B, mid_B)

  lo_B, hi_B = jax.lax.fori_loop(
    0, iters, halve, (jnp.zeros_like(alpha_B), jnp.ones_like(alpha_B))
  )
  return 0.5 * (lo_B + hi_B)


CURRICULUM_NELBOS = ('base', 'window')


@dataclasses.dataclass(frozen=True)
class DuoDiffusion(DiffusionProcess):
  """A uniform process trained with Duo's Gaussian curriculum first.

  While step < curriculum_steps, a training step draws t ~ U[0, 1] (the
  base's antithetic setting), w_t = a e_x + s eps at gamma_t = gamma_min +
  t (gamma_max - gamma_min), feeds the network the tempered softmax
  softmax(w_t / tau) [B, L, V] as a soft input, and trains on the bound of
  the *window* process (`window`: the base with `GaussianArgmaxSchedule`,
  continuous time, t in [0, 1]) at z_t = argmax(w_t), whose marginal is
  exactly the window's q(z_t | x). The network is told the base time with
  the same alpha (`equivalent_time`), so its time input means the same
  noise level in both phases. After the curriculum, and always when step is
  None (evaluation, sampling), the loss is exactly `base.loss`; the
  evaluator scores `evaluation_process`, the base.

  What nelbo_B is during the curriculum (`curriculum_nelbo`):
    'base' (default): the base's NELBO of a separate draw (the draw
      base.loss(key) makes), scored with a gradient-free forward pass on
      the discrete z_t. A valid bound of the uniform process, the same
      estimate the evaluator makes; costs one forward pass per step.
    'window': the window process's full NELBO (reconstruction at
      alpha_window(0) with the fixed Bayes decoder, the diffusion term over
      the window, the prior KL at alpha_window(1)) of the curriculum's own
      prediction. Free, but a bound only for a network that reads z_t
      alone; the soft input tends to one_hot(z_t) as tau -> 0, not exactly.

  Everything else (vocab_size, input_vocab_size, schedule, num_steps,
  loss_type, parameterization, denoiser_log_probs, posterior_probs, ...) is
  the base's, so samplers treat this process as the base.

  Attributes:
    base: the uniform-state process trained after the curriculum.
    curriculum_steps: training steps with the Gaussian input (0 = none).
    tau: temperature of the tempered softmax (Duo: 1e-3).
    gamma_min, gamma_max: the curriculum's window of gamma (Duo OWT:
      -3.55, -1.85).
    curriculum_nelbo: 'base' or 'window', see above.
  """

  base: UniformDiffusion
  curriculum_steps: int = 0
  tau: float = 1e-3
  gamma_min: float = -3.55
  gamma_max: float = -1.85
  curriculum_nelbo: str = 'base'

  causal = False
  family = 'uniform'
  requires_time_conditioning = True
  uses_step = True

  def __post_init__(self):
    if not isinstance(self.base, UniformDiffusion):
      raise ValueError(
        f'DuoDiffusion wraps a UniformDiffusion, got '
        f'{type(self.base).__name__}; build the uniform process first.'
      )
    steps = self.curriculum_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
      raise ValueError(
        f'curriculum_steps must be an int >= 0 (0 = no curriculum), got '
        f'{steps!r}.'
      )
    if not (math.isfinite(self.tau) and self.tau > 0):
      raise ValueError(
        f'tau must be a finite number > 0 (Duo uses 1e-3), got {self.tau}.'
      )
    if self.curriculum_nelbo not in CURRICULUM_NELBOS:
      raise ValueError(
        f'curriculum_nelbo={self.curriculum_nelbo!r}; choose one of '
        f'{CURRICULUM_NELBOS}.'
      )
    self.window_schedule  # noqa: B018 (validates the gamma window)

  # Everything but the training loss is the base's, so samplers and the
  # evaluator treat this process as the base; the contract's members are
  # forwarded explicitly (and the base's extra methods by __getattr__).
  @property
  def vocab_size(self) -> int:
    return self.base.vocab_size

  @property
  def schedule(self) -> Schedule:
    return self.base.schedule

  @property
  def input_vocab_size(self) -> int:
    return self.base.input_vocab_size

  def corrupt(self, key, x_BxL, t):
    return self.base.corrupt(key, x_BxL, t)

  def draw(self, key, x_BxL):
    return self.base.draw(key, x_BxL)

  def bound(self, logits_BxLxV, x_BxL, z_BxL, t, weight, loss_mask_BxL):
    return self.base.bound(logits_BxLxV, x_BxL, z_BxL, t, weight, loss_mask_BxL)

  def forward_marginal(self, x_probs_BxLxV, alpha):
    return self.base.forward_marginal(x_probs_BxLxV, alpha)

  def prior_sample(self, key, shape):
    return self.base.prior_sample(key, shape)

  def denoiser_log_probs(self, logits_BxLxV, z_BxL, t_B):
    return self.base.denoiser_log_probs(logits_BxLxV, z_BxL, t_B)

  def __getattr__(self, name):
    # Only reached when normal lookup fails: the base's own methods
    # (loo_log_probs, posterior_probs, num_steps, ...).
    if name == 'base' or name.startswith('__'):
      raise AttributeError(name)
    return getattr(self.base, name)

  @property
  def evaluation_process(self) -> UniformDiffusion:
    """The evaluator scores the base process (its bound, no curriculum)."""
    return self.base

  @property
  def window_schedule(self) -> GaussianArgmaxSchedule:
    return GaussianArgmaxSchedule(
      self.base.vocab_size, self.gamma_min, self.gamma_max
    )

  @property
  def window(self) -> UniformDiffusion:
    """The curriculum's uniform process: the window schedule on [0, 1]."""
    return dataclasses.replace(
      self.base, schedule=self.window_schedule, num_steps=0, t_min=0.0
    )

  def curriculum_draw(self, key: jax.Array, x_BxL: jax.Array):
    """(t_B, weight_B, z_BxL, soft_BxLxV, t_net_B) of one curriculum step.

    t_B and weight_B are the window's time and bound weight; z_t =
    argmax(w_t); soft = softmax(w_t / tau); t_net_B is the base time with
    the window's alpha(t), the network's time input.
    """
    window = self.window
    t_key, eps_key = jax.random.split(key)
    t_B, weight_B = window.sample_times(t_key, x_BxL.shape[0])
    w_BxLxV = gaussian_latent(
      eps_key, x_BxL, window.schedule.gamma(t_B), self.base.vocab_size
    )
    z_BxL = jnp.argmax(w_BxLxV, axis=-1).astype(x_BxL.dtype)
    soft_BxLxV = jax.nn.softmax(w_BxLxV / self.tau, axis=-1)
    t_net_B = equivalent_time(self.base.schedule, window.schedule.alpha(t_B))
    return t_B, weight_B, z_BxL, soft_BxLxV, t_net_B

  def loss(
    self,
    apply: ApplyFn,
    key: jax.Array,
    x_BxL: jax.Array,
    loss_mask_BxL: jax.Array | None = None,
    *,
    step=None,
  ):
    """(objective_B, nelbo_B, aux); `step` is the global training step.

    step None (evaluation) or >= curriculum_steps: exactly base.loss with
    the same key. Otherwise the curriculum objective (class docstring).
    A traced step (the train step's) goes through one lax.cond, so one
    compiled program serves both phases; a Python int picks its branch.
    aux adds 'duo_curriculum' (1 in the curriculum), and its 't' is always
    the network's (base) time.
    """

    def plain():
      objective_B, nelbo_B, aux = self.base.loss(
        apply, key, x_BxL, loss_mask_BxL
      )
      return objective_B, nelbo_B, {**aux, 'duo_curriculum': jnp.float32(0)}

    if step is None or self.curriculum_steps == 0:
      return plain()

    def curriculum():
      t_B, weight_B, z_BxL, soft_BxLxV, t_net_B = self.curriculum_draw(
        jax.random.fold_in(key, 1), x_BxL
      )
      logits_BxLxV = apply(soft_BxLxV, t_net_B)
      objective_B, nelbo_B, aux = self.window.bound(
        logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_mask_BxL
      )
      if self.curriculum_nelbo == 'base':
        nelbo_B = jax.lax.stop_gradient(
          self.base.loss(apply, key, x_BxL, loss_mask_BxL)[1]
        )
      aux = {**aux, 't': t_net_B, 'duo_curriculum': jnp.float32(1)}
      return objective_B, nelbo_B, aux

    if isinstance(step, int | np.integer):  # a known step: one branch
      return curriculum() if step < self.curriculum_steps else plain()
    in_curriculum = jnp.asarray(step) < self.curriculum_steps
    return jax.lax.cond(in_curriculum, curriculum, plain)


@ProcessConfig.register('duo')
@dataclasses.dataclass(frozen=True)
class DuoConfig(UniformConfig):
  """config.process of Duo: UDLM trained with the Gaussian curriculum.

  curriculum_steps: steps with the Gaussian-relaxed input (0 = none); tau:
  the tempered softmax's temperature; gamma_min, gamma_max: the
  curriculum's window (Duo OWT: -3.55, -1.85).
  """

  curriculum_steps: int = 0
  tau: float = 1e-3
  gamma_min: float = -3.55
  gamma_max: float = -1.85

  def build(self, vocab_size: int) -> DuoDiffusion:
    return DuoDiffusion(
      base=super().build(vocab_size),
      curriculum_steps=self.curriculum_steps,
      tau=self.tau,
      gamma_min=self.gamma_min,
      gamma_max=self.gamma_max,
    )
