"""Samplers that reveal a chosen number of tokens per network call.

Each iteration calls the network once on the whole batch, draws a token for
every masked position from p_theta (Gumbel-max, or argmax when greedy) and
reveals a subset chosen per row; the loop ends when no masked position is
left in the window, so every call is a real one and NFE = iterations.

* first_hitting: one uniformly chosen position per call, at the time the
  next reveal would happen in continuous time (Zheng et al.'s first-hitting
  sampler): with n masked at time t, s = alpha^-1(1 - (1 - alpha(t)) u^(1/n)).
  For a time-free network this is exact ancestral sampling in the limit of
  infinitely many steps, with NFE = number of masked tokens.
* confidence (MaskGIT / LLaDA): reveals the most confident positions, by max
  probability, margin (top-1 minus top-2 probability) or low entropy; a fixed
  tokens_per_step, or num_steps with a 'linear', 'cosine' or 'process'
  schedule of the masked fraction.
* eb (EB-sampler, arXiv 2505.24857): sorts masked positions by entropy
  ascending and reveals the largest prefix whose entropy sum minus its max is
  <= gamma, at least one; gamma = 0 reveals one token per call.

Networks that take time get t = alpha^-1(1 - masked fraction) (first_hitting:
the hitting time), so time-conditioned models work too.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.sampling.base import Sampler, require_float, require_int
from ddlm_jax.sampling.common import (
  alpha_inverse,
  entropy,
  init_feedback,
  predict,
  select_top,
  time_for_masked_fraction,
)
from ddlm_jax.sampling.noise import gumbel

SCORES = ('max_prob', 'margin', 'entropy')
COUNT_SCHEDULES = ('linear', 'cosine', 'process')


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Unmasking(Sampler):
  """Shared loop; subclasses choose which positions to reveal.

  Attributes:
    greedy: reveal each position's argmax token instead of a sample.
  """

  greedy: bool = False

  def __post_init__(self):
    super().__post_init__()
    self._set(greedy=bool(self.greedy))

  def _times(self, process, z, t_B, masked, key):
    """(time for the network call, new carried time)."""
    del masked, key
    t = time_for_masked_fraction(process.schedule, z, process.mask_id)
    return t, t_B

  @abc.abstractmethod
  def _select(self, key, logp, masked, step, count0_B, process):
    """Boolean [B, L] of the masked positions to reveal this step."""

  def fill(self, apply, key, process, z_BxL, window_BxL):
    apply = self._applies(apply)[0]
    mask_id = process.mask_id
    batch = z_BxL.shape[0]
    count0_B = jnp.sum((z_BxL == mask_id) & window_BxL, axis=-1)

    def cond(carry):
      z = carry[0]
      return jnp.any((z == mask_id) & window_BxL)

    def body(carry):
      z, key, nfe, t_B, memory = carry
      key, tok_key, sel_key, t_key = jax.random.split(key, 4)
      masked = (z == mask_id) & window_BxL
      t_call, t_B = self._times(process, z, t_B, masked, t_key)
      logp, memory = predict(apply, z, t_call, memory, **self.filters)
      if self.greedy:
        tokens = jnp.argmax(logp, axis=-1)
      else:
        tokens = jnp.argmax(logp + gumbel(tok_key, logp.shape), axis=-1)
      reveal = self._select(sel_key, logp, masked, nfe, count0_B, process)
      # Guard: a row with masks always reveals at least one position.
      none = jnp.any(masked, -1) & ~jnp.any(reveal, -1)
      first = select_top(jnp.zeros(z.shape), masked, jnp.ones(batch, int))
      reveal = (reveal & masked) | (none[:, None] & first)
      z = jnp.where(reveal, tokens.astype(jnp.int32), z)
      return z, key, nfe + 1, t_B, memory

    memory = init_feedback([apply], z_BxL, process.vocab_size)
    init = (z_BxL, key, jnp.int32(0), jnp.ones((batch,), jnp.float32), memory)
    z_BxL, _, nfe, _, _ = jax.lax.while_loop(cond, body, init)
    return z_BxL, nfe


@dataclasses.dataclass(frozen=True, kw_only=True)
class FirstHittingSampler(_Unmasking):
  """Exact one-token-at-a-time sampling at first-hitting times."""

  name: ClassVar[str] = 'first_hitting'

  def _times(self, process, z, t_B, masked, key):
    n_B = jnp.sum(masked, axis=-1).astype(jnp.float32)
    u_B = jax.random.uniform(key, t_B.shape, minval=1e-12)
    a_t = process.schedule.alpha(t_B)
    a_s = 1.0 - (1.0 - a_t) * u_B ** (1.0 / jnp.maximum(n_B, 1.0))
    s_B = alpha_inverse(process.schedule, a_s)
    s_B = jnp.where(n_B > 0, jnp.minimum(s_B, t_B), t_B)
    return s_B, s_B

  def _select(self, key, logp, masked, step, count0_B, process):
    score = jax.random.uniform(key, masked.shape)
    return select_top(score, masked, jnp.ones(masked.shape[0], jnp.int32))


def _remaining_fraction(schedule_name: str, u, process):
  """Fraction of the initially masked tokens still masked at progress u."""
  if schedule_name == 'linear':
    return 1.0 - u
  if schedule_name == 'cosine':
    return jnp.cos(0.5 * math.pi * u)
  a1 = process.schedule.alpha(jnp.float32(1.0))
  return (1.0 - process.schedule.alpha(1.0 - u)) / (1.0 - a1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfidenceSampler(_Unmasking):
  """Reveals the most confident masked positions each call.

  Attributes:
    score: 'max_prob', 'margin' or 'entropy' (lowest entropy first).
    tokens_per_step: k > 0 reveals k per call (NFE = ceil(masked / k)).
    num_steps: with tokens_per_step = 0, the number of calls; the masked
      count follows `schedule` ('linear', 'cosine' or the process's own
      alpha, 'process').
  """

  name: ClassVar[str] = 'confidence'

  score: str = 'max_prob'
  tokens_per_step: int = 0
  num_steps: int = 64
  schedule: str = 'linear'

  def __post_init__(self):
    super().__post_init__()
    if self.score not in SCORES:
      raise ValueError(f'score={self.score!r}; choose one of {SCORES}.')
    if self.schedule not in COUNT_SCHEDULES:
      raise ValueError(
        f'schedule={self.schedule!r}; choose one of {COUNT_SCHEDULES}.'
      )
    require_int('tokens_per_step', self.tokens_per_step, 0)
    require_int('num_steps', self.num_steps, 1)

  def _score(self, logp):
    if self.score == 'entropy':
      return -entropy(logp)
    probs = jnp.exp(logp)
    if self.score == 'max_prob':
      return jnp.max(probs, axis=-1)
    top2 = jax.lax.top_k(probs, 2)[0]
    return top2[..., 0] - top2[..., 1]

  def _select(self, key, logp, masked, step, count0_B, process):
    del key
    masked_B = jnp.sum(masked, axis=-1)
    if self.tokens_per_step:
      n_B = jnp.full_like(masked_B, self.tokens_per_step)
    else:
      u = jnp.minimum((step + 1) / self.num_steps, 1.0)
      frac = jnp.where(
        u >= 1.0, 0.0, _remaining_fraction(self.schedule, u, process)
      )
      left_B = jnp.floor(count0_B * frac).astype(masked_B.dtype)
      n_B = jnp.maximum(masked_B - left_B, 1)
    return select_top(self._score(logp), masked, n_B)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EBSampler(_Unmasking):
  """Entropy-bounded unmasking.

  Attributes:
    gamma: the bound on (sum - max) of the revealed entropies, in nats.
    max_tokens_per_step: cap on reveals per call (0: no cap).
  """

  name: ClassVar[str] = 'eb'

  gamma: float = 0.1
  max_tokens_per_step: int = 0

  def __post_init__(self):
    super().__post_init__()
    require_float('gamma', self.gamma, 0.0, math.inf)
    require_int('max_tokens_per_step', self.max_tokens_per_step, 0)

  def _select(self, key, logp, masked, step, count0_B, process):
    del key, step, count0_B, process
    h_BxL = entropy(logp)
    n_B = eb_prefix_size(h_BxL, masked, self.gamma)
    if self.max_tokens_per_step:
      n_B = jnp.minimum(n_B, self.max_tokens_per_step)
    return select_top(-h_BxL, masked, n_B)


def eb_prefix_size(h_BxL, eligible_BxL, gamma: float) -> jax.Array:
  """Largest k with sum of the k smallest entropies minus their max <= gamma.

  Sorted ascending, sum - max of a prefix is the sum of all but its last
  entry, which grows with k, so the admissible k form a prefix. At least 1;
  gamma = 0 gives exactly 1.
  """
  if gamma == 0:
    return jnp.ones(h_BxL.shape[0], jnp.int32)
  h_sorted = jnp.sort(jnp.where(eligible_BxL, h_BxL, jnp.inf), axis=-1)
  finite = jnp.isfinite(h_sorted)
  before = jnp.cumsum(jnp.where(finite, h_sorted, 0.0), axis=-1) - jnp.where(
    finite, h_sorted, 0.0
  )
  ok = finite & (before <= gamma)
  return jnp.maximum(jnp.sum(ok, axis=-1), 1).astype(jnp.int32)
