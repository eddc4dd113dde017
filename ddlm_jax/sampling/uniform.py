"""Samplers for uniform-state and interpolating diffusion.

Positions to generate start from the process's prior (`prior_sample`:
uniform tokens; for interpolating processes the mask or a uniform token),
drawn where z holds the generate id V (see common.initial_state: a prompt
is an array with V at the positions to generate, or a pair (tokens_BxL,
keep_BxL)); prompt positions never change and the network never sees V as
an input it cannot embed.

* uniform_ancestral: T steps t_i = 1 - i / T -> s_i = t_{i+1}. Each step
  calls the network once at (z_t, t), turns its output into the DENOISER
  p_theta(x^i | z_t) (`process.denoiser_log_probs`, whatever the network's
  parameterisation), filters it (temperature, top-k, top-p) and draws every
  generated position from q(z_s | z_t, p_theta) (`process.posterior_probs`,
  the mixture sum_x p_theta(x) q(z_s | z_t, x), which is the exact reverse
  marginal for an exact denoiser). The last step is the noise removal: it
  targets alpha = 1, i.e. draws from p_theta itself, or takes its argmax
  with greedy_tail (Duo's "greedy" noise removal, lower gen. perplexity).
  NFE = T. Uniform-state networks are time-conditioned, so no caching.
* loo_gibbs: the same predictor; after every predictor step but the last,
  `corrector_steps` informed Gibbs steps at the new time s, each one
  network call: the LOO posterior p(x^i | z^{-i}) (`process.loo_log_probs`,
  optionally tempered by loo_temperature) gives the conditional of the
  marginal, p_s(z^i | z^{-i}) = alpha_s p_LOO + (1 - alpha_s) pi (pi =
  uniform; for interpolating processes (1 - p_u) e_m + p_u / V), and the k
  positions with the lowest log-margin log p(z^i) - max_{v != z^i} log p(v)
  of their current token are redrawn from it (select='margin'), or k
  uniformly chosen positions (select='random'; with k = 1 random-scan
  Gibbs, which leaves p_s exactly invariant for an exact LOO model; the
  margin rule is a heuristic that does not). NFE = T + (T - 1) C.

Randomness: the prior, the predictor and the corrector draw from separate
subkeys of `key`; tokens are drawn by Gumbel-max (float64-grade tails,
noise.gumbel) with noise keyed by the step, so loo_gibbs with
corrector_steps = 0 returns exactly the tokens of uniform_ancestral, and psi
(psi.py) with kappa = 1 as well. (Unlike the masked samplers the noise is
not keyed per row: these networks are time-conditioned, so no per-row
cache can skip steps, and one draw per step is much cheaper.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.sampling.base import Sampler, require_int
from ddlm_jax.sampling.common import (
  generate_id,
  select_top,
)
from ddlm_jax.sampling.noise import filter_logits, gumbel

# The non-absorbing families: z_t may hold any data token.
FAMILIES = ('uniform', 'interpolating')
SELECTIONS = ('margin', 'random')


def uniform_times(num_steps: int) -> np.ndarray:
  """t_i = 1 - i / T for i = 0..T (float64)."""
  return 1.0 - np.arange(num_steps + 1, dtype=np.float64) / num_steps


TAILS = ('denoiser', 'plugin')


def denoiser_log_probs(
  apply, process, z_BxL, t_B, filters: dict, source: str = 'denoiser'
):
  """One network call: the filtered log p_theta(x^i | z_t), [B, L, V].

  source='plugin' returns the LOO probabilities p(x^i | z^{-i}) instead:
  what a sampler uses when it takes the output of a network trained on the
  plug-in NELBO (whose optimum is the LOO posterior) as its clean-data
  prediction without the LOO -> denoiser conversion.
  """
  logits_BxLxV = apply(z_BxL, t_B.astype(jnp.float32))
  if source == 'plugin':
    logp_BxLxV = process.loo_log_probs(logits_BxLxV, z_BxL, t_B)
  else:
    logp_BxLxV = process.denoiser_log_probs(logits_BxLxV, z_BxL, t_B)
  return jax.nn.log_softmax(filter_logits(logp_BxLxV, **filters), axis=-1)


def _gumbel_argmax(log_probs_BxLxK, key, step) -> jax.Array:
  """A categorical draw per position; the noise is keyed by the step."""
  noise = gumbel(jax.random.fold_in(key, step), log_probs_BxLxK.shape)
  return jnp.argmax(log_probs_BxLxK + noise, axis=-1).astype(jnp.int32)


def _safe_log(p: jax.Array) -> jax.Array:
  return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)


# corrector(key, i, z_BxL, s_B, free_BxL) -> z_BxL, run after predictor step
# i (all but the last) with the corrector's own subkey of the sampler's key.
Corrector = Callable[..., jax.Array]


def categorical_fill(
  apply,
  key: jax.Array,
  process,
  z_BxL: jax.Array,
  window_BxL: jax.Array,
  t_grid: np.ndarray,
  kappa_T: np.ndarray,
  *,
  greedy_tail: bool,
  filters: dict,
  corrector: Corrector | None = None,
  tail: str = 'denoiser',
) -> jax.Array:
  """The step loop of uniform_ancestral, psi (non-masked) and loo_gibbs.

  Step i goes from t_grid[i] to t_grid[i + 1] and draws z_s from
  kappa_i q(z_s | z_t, p0) + (1 - kappa_i) (alpha_s p0 + (1 - alpha_s) pi)
  with p0 the filtered denoiser; the last step is the noise removal (p0 or
  its argmax). Only positions inside the window holding the generate id
  change (they start from the prior). `corrector`, if given, runs after
  every step but the last. tail='plugin' takes the last step from the LOO
  probabilities instead of the denoiser (see denoiser_log_probs). Returns
  z_BxL; every step is one network call.
  """
  steps = int(kappa_T.shape[0])
  if t_grid.shape[0] != steps + 1:
    raise ValueError('t_grid needs one more entry than kappa_T.')
  batch = z_BxL.shape[0]
  free_BxL = window_BxL & (z_BxL == generate_id(process))
  prior_key, draw_key, corr_key = jax.random.split(key, 3)
  prior_BxL = process.prior_sample(prior_key, z_BxL.shape).astype(jnp.int32)
  z_BxL = jnp.where(free_BxL, prior_BxL, z_BxL)
  t_T = jnp.asarray(t_grid[:-1], jnp.float32)
  s_T = jnp.asarray(t_grid[1:], jnp.float32)
  kappa_T = np.asarray(kappa_T, np.float64)
  mixes = bool(np.any(kappa_T[:-1] != 1.0))
  kappa_j = jnp.asarray(kappa_T, jnp.float32)

  def step(i, z):
    t_B = jnp.full((batch,), t_T[i])
    s_B = jnp.full((batch,), s_T[i])
    p0_BxLxV = jnp.exp(denoiser_log_probs(apply, process, z, t_B, filters))
    probs_BxLxK = process.posterior_probs(p0_BxLxV, z, s_B, t_B)
    if mixes:
      a_s_B = process.schedule.alpha(s_B)
      pc_BxLxK = process.forward_marginal(p0_BxLxV, a_s_B)
      probs_BxLxK = kappa_j[i] * probs_BxLxK + (1.0 - kappa_j[i]) * pc_BxLxK
    tokens = _gumbel_argmax(_safe_log(probs_BxLxK), draw_key, i)
    z = jnp.where(free_BxL, tokens, z)
    if corrector is not None:
      z = corrector(corr_key, i, z, s_B, free_BxL)
    return z

  z_BxL = jax.lax.fori_loop(0, steps - 1, step, z_BxL)
  last = steps - 1
  t_B = jnp.full((batch,), t_T[last])
  logp_BxLxV = denoiser_log_probs(apply, process, z_BxL, t_B, filters, tail)
  if greedy_tail:
    tokens = jnp.argmax(logp_BxLxV, axis=-1).astype(jnp.int32)
  else:
    tokens = _gumbel_argmax(logp_BxLxV, draw_key, last)
  return jnp.where(free_BxL, tokens, z_BxL)


def gibbs_probs(process, loo_log_probs_BxLxV, alpha_B, temperature=1.0):
  """p_s(z^i | z^{-i}) = forward(softmax(log p_LOO / temperature), alpha_s)."""
  loo_BxLxV = jax.nn.softmax(loo_log_probs_BxLxV / temperature, axis=-1)
  return process.forward_marginal(loo_BxLxV, alpha_B)


def log_margin(log_probs_BxLxK: jax.Array, z_BxL: jax.Array) -> jax.Array:
  """log p(z^i) - max_{v != z^i} log p(v): how much z^i is preferred."""
  k = log_probs_BxLxK.shape[-1]
  is_z = jax.nn.one_hot(z_BxL, k, dtype=bool)
  cur_BxL = jnp.max(jnp.where(is_z, log_probs_BxLxK, -jnp.inf), axis=-1)
  other_BxL = jnp.max(jnp.where(is_z, -jnp.inf, log_probs_BxLxK), axis=-1)
  return cur_BxL - other_BxL


def gibbs_step(
  apply,
  key: jax.Array,
  process,
  z_BxL: jax.Array,
  t_B: jax.Array,
  free_BxL: jax.Array,
  *,
  k: int,
  select: str = 'margin',
  loo_temperature: float = 1.0,
) -> jax.Array:
  """One informed Gibbs corrector step at time t (one network call).

  Redraws up to k free positions per row, chosen by the lowest log-margin
  of the current token (select='margin') or uniformly (select='random'),
  each from its conditional given all other positions.
  """
  if select not in SELECTIONS:
    raise ValueError(f'select={select!r}; choose one of {SELECTIONS}.')
  require_int('k', k, 1)
  logits_BxLxV = apply(z_BxL, t_B.astype(jnp.float32))
  loo_BxLxV = process.loo_log_probs(logits_BxLxV, z_BxL, t_B)
  probs_BxLxK = gibbs_probs(
    process, loo_BxLxV, process.schedule.alpha(t_B), loo_temperature
  )
  logp_BxLxK = _safe_log(probs_BxLxK)
  pick_key, draw_key = jax.random.split(key)
  if select == 'margin':
    score_BxL = -log_margin(logp_BxLxK, z_BxL)
  else:
    score_BxL = jax.random.uniform(pick_key, z_BxL.shape)
  n_B = jnp.minimum(k, jnp.sum(free_BxL, axis=-1))
  chosen_BxL = select_top(score_BxL, free_BxL, n_B)
  tokens = _gumbel_argmax(logp_BxLxK, draw_key, 0)
  return jnp.where(chosen_BxL, tokens, z_BxL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformAncestralSampler(Sampler):
  """T-step ancestral sampling for uniform-state / interpolating processes.

  Attributes:
    num_steps: T (the last step is the noise removal).
    greedy_tail: the last step takes the denoiser's argmax.
    tail: 'denoiser' (exact) or 'plugin': the last step reads the LOO
      probabilities as if they were the denoiser, as samplers that take a
      plug-in-NELBO network's output for p(x | z_t) do (the comparison of
      arXiv 2605.22765, on one trained model).
  """

  name: ClassVar[str] = 'uniform_ancestral'
  families: ClassVar[tuple[str, ...]] = FAMILIES

  num_steps: int = 128
  greedy_tail: bool = False
  tail: str = 'denoiser'

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    self._set(greedy_tail=bool(self.greedy_tail))
    if self.tail not in TAILS:
      raise ValueError(
        f'tail={self.tail!r}; choose one of {TAILS} (denoiser: exact; '
        'plugin: the LOO probabilities read as the denoiser).'
      )

  def nfe(self) -> int:
    """Network calls: one per step."""
    return self.num_steps

  def corrector(self, apply, process) -> Corrector | None:
    """The corrector run after each predictor step (none here)."""
    del apply, process
    return None

  def fill(self, apply, key, process, z_BxL, window_BxL):
    apply = self._applies(apply)[0]
    steps = self.num_steps
    z_BxL = categorical_fill(
      apply,
      key,
      process,
      z_BxL,
      window_BxL,
      uniform_times(steps),
      np.ones(steps),
      greedy_tail=self.greedy_tail,
      filters=self.filters,
      corrector=self.corrector(apply, process),
      tail=self.tail,
    )
    return z_BxL, jnp.int32(self.nfe())


@dataclasses.dataclass(frozen=True, kw_only=True)
class LOOGibbsSampler(UniformAncestralSampler):
  """Uniform ancestral predictor + informed Gibbs corrector (LOO model).

  Attributes:
    corrector_steps: C Gibbs steps after each predictor step but the last.
    k: positions redrawn per corrector step (at most the free ones).
    select: 'margin' (lowest log-margin of the current token) or 'random'.
    loo_temperature: divides the LOO log-probabilities in the corrector
      (the predictor's filters do not apply there).
  """

  name: ClassVar[str] = 'loo_gibbs'

  corrector_steps: int = 2
  k: int = 12
  select: str = 'margin'
  loo_temperature: float = 1.0

  def __post_init__(self):
    super().__post_init__()
    require_int('corrector_steps', self.corrector_steps, 0)
    require_int('k', self.k, 1)
    if self.select not in SELECTIONS:
      raise ValueError(
        f'select={self.select!r}; choose one of {SELECTIONS} (margin: the '
        'informed corrector; random: random-scan Gibbs).'
      )
    if not float(self.loo_temperature) > 0:
      raise ValueError(
        f'loo_temperature must be > 0, got {self.loo_temperature}; use 1 '
        'for exact Gibbs, < 1 to sharpen.'
      )

  def nfe(self) -> int:
    """T predictor calls and C corrector calls after all steps but the last."""
    return self.num_steps + (self.num_steps - 1) * self.corrector_steps

  def corrector(self, apply, process) -> Corrector | None:
    if not self.corrector_steps:
      return None
    steps_c = self.corrector_steps
    params = dict(
      k=self.k, select=self.select, loo_temperature=float(self.loo_temperature)
    )

    def run(key, i, z_BxL, s_B, free_BxL):
      def body(c, z):
        step_key = jax.random.fold_in(key, i * steps_c + c)
        return gibbs_step(apply, step_key, process, z, s_B, free_BxL, **params)

      return jax.lax.fori_loop(0, steps_c, body, z_BxL)

    return run


__all__ = [
  'LOOGibbsSampler',
  'UniformAncestralSampler',
  'categorical_fill',
  'gibbs_probs',
  'gibbs_step',
  'log_margin',
]
