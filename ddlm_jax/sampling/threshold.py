"""Confidence-threshold parallel decoding, with optional re-editing.

Fast-dLLM's rule for masked diffusion: each network call reveals every
masked position whose confidence (the largest predicted probability) is
above a threshold, and at least `min_tokens` (the most confident ones), so
easy stretches of text are written several tokens per call and hard ones
one at a time. The factor rule (`factor` > 0) instead reveals the n most
confident positions for the largest n whose n-th confidence c_(n) is
>= 1 - factor / (n + 1): the more tokens revealed together, the surer each
must be. Threshold 1.0 never fires (probabilities are <= 1), so the floor
reveals one token per call: the one-token-per-step confidence sampler
(`confidence` with tokens_per_step=1), token for token with the same key.

Re-editing (`editing_threshold` > 0, LLaDA2 / BlockRefinement style): a
call also rewrites a committed generated token when the model's draw there
differs from it with probability above the editing threshold; after the
last mask is filled, up to `edit_calls` more calls run while the previous
call changed something. Prompt positions are never edited. NFE counts
every call, editing calls included.

The selection rules are pure functions (`threshold_count`,
`factor_count`, `parallel_reveal`) shared with the cached samplers of
sampling.approx_cache.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.sampling.base import Sampler, require_float, require_int
from ddlm_jax.sampling.common import (
  init_feedback,
  predict,
  select_top,
  time_for_masked_fraction,
)
from ddlm_jax.sampling.noise import gumbel


def confidence(logp_BxLxV: jax.Array) -> jax.Array:
  """The largest predicted probability at each position, [B, L]."""
  return jnp.max(jnp.exp(logp_BxLxV), axis=-1)


def threshold_count(conf_BxL, eligible_BxL, threshold: float) -> jax.Array:
  """Eligible positions per row whose confidence is above the threshold."""
  return jnp.sum(eligible_BxL & (conf_BxL > threshold), axis=-1)


def factor_count(conf_BxL, eligible_BxL, factor: float) -> jax.Array:
  """Largest n with c_(n) >= 1 - factor / (n + 1), at least 1.

  c_(n) is the n-th largest eligible confidence. The bound rises with n
  and c_(n) falls, so the admissible n form a prefix.
  """
  sorted_BxL = -jnp.sort(-jnp.where(eligible_BxL, conf_BxL, -jnp.inf), -1)
  n_L = jnp.arange(1, conf_BxL.shape[-1] + 1, dtype=jnp.float32)
  ok_BxL = sorted_BxL >= 1.0 - factor / (n_L + 1.0)
  ok_BxL = ok_BxL & jnp.isfinite(sorted_BxL)
  prefix = jnp.cumprod(ok_BxL.astype(jnp.int32), axis=-1)
  return jnp.maximum(jnp.sum(prefix, axis=-1), 1)


def parallel_reveal(
  conf_BxL,
  eligible_BxL,
  *,
  threshold: float,
  factor: float,
  min_tokens: int,
  max_tokens: int,
) -> jax.Array:
  """Boolean [B, L]: the positions one call reveals (see module doc)."""
  if factor > 0:
    n_B = factor_count(conf_BxL, eligible_BxL, factor)
  else:
    n_B = threshold_count(conf_BxL, eligible_BxL, threshold)
  n_B = jnp.maximum(n_B, min_tokens)
  if max_tokens:
    n_B = jnp.minimum(n_B, max_tokens)
  return select_top(conf_BxL, eligible_BxL, n_B)


def check_rule(threshold, factor, min_tokens, max_tokens) -> None:
  """ValueError for a bad threshold/factor/floor/cap, before compute."""
  require_float('threshold', threshold, 0.0, 1.0)
  require_float('factor', factor, 0.0, float('inf'))
  require_int('min_tokens', min_tokens, 1)
  require_int('max_tokens', max_tokens, 0)
  if max_tokens and max_tokens < min_tokens:
    raise ValueError(
      f'max_tokens={max_tokens} is below min_tokens={min_tokens}; raise '
      'the cap or lower the floor (max_tokens=0: no cap).'
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThresholdSampler(Sampler):
  """Reveals every masked position above a confidence threshold per call.

  The loop is the one of the unmasking samplers (sampling.unmasking): one
  network call per iteration at t = alpha^-1(1 - masked fraction), a
  Gumbel-max draw (argmax when greedy) at every position, the reveal rule,
  with the same key use, so threshold 1.0 draws the one-token confidence
  sampler's tokens.

  Attributes:
    threshold: reveal positions with confidence > threshold (Fast-dLLM:
      0.9); 1.0 gives one token per call.
    factor: > 0 uses the factor rule instead of the threshold.
    min_tokens: the floor of reveals per call.
    max_tokens: the cap of reveals per call (0: none).
    greedy: reveal each position's argmax token instead of a sample.
    editing_threshold: > 0 re-edits committed tokens whose new draw has
      probability above it (0: off).
    edit_calls: extra calls allowed after the last mask, while they change
      something.
  """

  name: ClassVar[str] = 'threshold'
  families: ClassVar[tuple[str, ...]] = ('masked',)

  threshold: float = 0.9
  factor: float = 0.0
  min_tokens: int = 1
  max_tokens: int = 0
  greedy: bool = False
  editing_threshold: float = 0.0
  edit_calls: int = 4

  def __post_init__(self):
    super().__post_init__()
    check_rule(self.threshold, self.factor, self.min_tokens, self.max_tokens)
    require_float('editing_threshold', self.editing_threshold, 0.0, 1.0)
    require_int('edit_calls', self.edit_calls, 0)
    self._set(greedy=bool(self.greedy))

  @property
  def rule(self) -> dict:
    return dict(
      threshold=float(self.threshold),
      factor=float(self.factor),
      min_tokens=int(self.min_tokens),
      max_tokens=int(self.max_tokens),
    )

  def fill(self, apply, key, process, z_BxL, window_BxL):
    """Fills the window's masked positions; with editing, then re-edits
    while calls change something, at most `edit_calls` calls after the
    last mask (so at least one checking call when edit_calls > 0)."""
    apply = self._applies(apply)[0]
    mask_id = process.mask_id
    free = (z_BxL == mask_id) & window_BxL
    editing = bool(self.editing_threshold)

    def cond(carry):
      z, _, _, changed, extra, _ = carry
      masks_left = jnp.any((z == mask_id) & free)
      if not editing:
        return masks_left
      return masks_left | (changed & (extra < self.edit_calls))

    def body(carry):
      z, key, nfe, _, extra, memory = carry
      key, tok_key, _, _ = jax.random.split(key, 4)
      masked = (z == mask_id) & free
      t_B = time_for_masked_fraction(process.schedule, z, mask_id)
      logp, memory = predict(apply, z, t_B, memory, **self.filters)
      if self.greedy:
        tokens = jnp.argmax(logp, axis=-1)
      else:
        tokens = jnp.argmax(logp + gumbel(tok_key, logp.shape), axis=-1)
      tokens = tokens.astype(jnp.int32)
      change = parallel_reveal(confidence(logp), masked, **self.rule)
      masks_before = jnp.any(masked)
      if editing:
        probs = jnp.exp(logp)
        p_tok = jnp.take_along_axis(probs, tokens[..., None], -1)[..., 0]
        edit = (free & ~masked) & (tokens != z)
        change = change | (edit & (p_tok > self.editing_threshold))
      changed = jnp.any(change & (tokens != z))
      z = jnp.where(change, tokens, z)
      extra = extra + (~masks_before).astype(jnp.int32)
      return z, key, nfe + 1, masks_before | changed, extra, memory

    memory = init_feedback([apply], z_BxL, process.vocab_size)
    init = (z_BxL, key, jnp.int32(0), jnp.bool_(False), jnp.int32(0), memory)
    z_BxL, _, nfe, _, _, _ = jax.lax.while_loop(cond, body, init)
    return z_BxL, nfe
