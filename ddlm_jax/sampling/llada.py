"""LLaDA's semi-autoregressive block decoding with low-confidence remasking.

The span to generate (from a row's first to its last masked position in
the window) is cut into blocks of `block_length` positions, filled left to
right. The `num_steps` network calls are split evenly across a row's
blocks (the first `steps % blocks` blocks take one more); inside a block
the number of tokens committed per call is the block's masked count split
evenly over its calls, the first `count % calls` calls taking one more
(LLaDA's `get_num_transfer_tokens`), so a block is complete after its last
call. Each call draws a token for every masked position (Gumbel-max at
`temperature`; argmax at temperature 0), scores it by its softmax
probability ('low_confidence') or a uniform draw ('random'), gives
positions after the current block -inf, and commits the best-scoring
masked positions. NFE equals num_steps (when num_steps >= the number of
blocks; otherwise every block takes one call).

Positions are counted from each row's own first masked position, so rows
with prompts of different lengths decode their own blocks, as LLaDA's
`generate` does for a batch of left-padded prompts.
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

REMASKING = ('low_confidence', 'random')


def transfer_counts(masked_B: jax.Array, calls_B: jax.Array, j_B: jax.Array):
  """Tokens to commit at call j of a block with `masked_B` masked tokens
  spread over `calls_B` calls: masked // calls, plus one for the first
  masked % calls calls (so the counts add up to masked_B)."""
  calls_B = jnp.maximum(calls_B, 1)
  base_B = masked_B // calls_B
  return base_B + (j_B < masked_B % calls_B).astype(base_B.dtype)


def span_of(masked_BxL: jax.Array):
  """(first masked position, one past the last) per row; (0, 0) if none."""
  length = masked_BxL.shape[1]
  pos_L = jnp.arange(length)
  has_B = jnp.any(masked_BxL, axis=-1)
  first = jnp.min(jnp.where(masked_BxL, pos_L, length), axis=-1)
  last = jnp.max(jnp.where(masked_BxL, pos_L, -1), axis=-1)
  return jnp.where(has_B, first, 0), jnp.where(has_B, last + 1, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LLaDASampler(Sampler):
  """Block-by-block decoding with a fixed number of commits per call.

  Attributes:
    block_length: positions per block (the last one may be shorter).
    num_steps: network calls in all, split evenly across the blocks.
    temperature: Gumbel-max sampling temperature; 0 takes the argmax.
    remasking: 'low_confidence' (commit the most probable drawn tokens)
      or 'random' (commit uniformly chosen masked positions).
  """

  name: ClassVar[str] = 'llada'

  block_length: int = 32
  num_steps: int = 64
  remasking: str = 'low_confidence'
  temperature: float = 0.0

  def __post_init__(self):
    # Temperature 0 (greedy) is LLaDA's default, so the base class's
    # temperature > 0 check does not apply; top-k/top-p still do.
    require_float('temperature', self.temperature, 0.0, float('inf'))
    require_int('top_k', self.top_k, 0)
    require_float('top_p', self.top_p, 0.0, 1.0)
    require_int('block_length', self.block_length, 1)
    require_int('num_steps', self.num_steps, 1)
    if self.remasking not in REMASKING:
      raise ValueError(
        f'remasking={self.remasking!r}; choose one of {REMASKING}.'
      )

  @property
  def filters(self) -> dict:
    # Confidence is the softmax of the (top-k/top-p filtered) logits at
    # temperature 1; the temperature only scales the Gumbel noise.
    return dict(temperature=1.0, top_k=int(self.top_k), top_p=float(self.top_p))

  def _draw(self, key, logp_BxLxV):
    if self.temperature == 0:
      return jnp.argmax(logp_BxLxV, axis=-1)
    noisy = logp_BxLxV / self.temperature + gumbel(key, logp_BxLxV.shape)
    return jnp.argmax(noisy, axis=-1)

  def fill(self, apply, key, process, z_BxL, window_BxL):
    apply = self._applies(apply)[0]
    mask_id = process.mask_id
    batch, length = z_BxL.shape
    pos_L = jnp.arange(length)
    start_B, end_B = span_of((z_BxL == mask_id) & window_BxL)
    blocks_B = -(-(end_B - start_B) // self.block_length)
    steps = self.num_steps
    per_block_B = jnp.maximum(steps // jnp.maximum(blocks_B, 1), 1)
    extra_B = jnp.where(steps >= blocks_B, steps % jnp.maximum(blocks_B, 1), 0)

    def cond(carry):
      return jnp.any(carry[2] < blocks_B)

    def body(carry):
      z, key, b_B, j_B, count_B, nfe, memory = carry
      key, tok_key, rnd_key = jax.random.split(key, 3)
      lo_B = start_B + b_B * self.block_length
      hi_B = jnp.minimum(lo_B + self.block_length, end_B)
      masked = (z == mask_id) & window_BxL
      in_block = (pos_L >= lo_B[:, None]) & (pos_L < hi_B[:, None])
      count_B = jnp.where(
        j_B == 0, jnp.sum(masked & in_block, axis=-1), count_B
      )
      calls_B = per_block_B + (b_B < extra_B).astype(per_block_B.dtype)
      k_B = transfer_counts(count_B, calls_B, j_B)
      active_B = b_B < blocks_B
      t_B = time_for_masked_fraction(process.schedule, z, mask_id)
      logp, memory = predict(apply, z, t_B, memory, **self.filters)
      tokens = self._draw(tok_key, logp)
      if self.remasking == 'low_confidence':
        conf = jnp.take_along_axis(jnp.exp(logp), tokens[..., None], -1)[..., 0]
      else:
        conf = jax.random.uniform(rnd_key, masked.shape)
      # Positions after the block get -inf; before it nothing is masked.
      eligible = masked & (pos_L < hi_B[:, None]) & active_B[:, None]
      commit = select_top(conf, eligible, jnp.where(active_B, k_B, 0))
      z = jnp.where(commit, tokens.astype(jnp.int32), z)
      j_B = j_B + active_B.astype(j_B.dtype)
      done_B = j_B >= calls_B
      b_B = jnp.where(done_B, b_B + 1, b_B)
      j_B = jnp.where(done_B, 0, j_B)
      return z, key, b_B, j_B, count_B, nfe + 1, memory

    zeros_B = jnp.zeros((batch,), jnp.int32)
    memory = init_feedback([apply], z_BxL, process.vocab_size)
    init = (z_BxL, key, zeros_B, zeros_B, zeros_B, jnp.int32(0), memory)
    z_BxL, *_, nfe, _ = jax.lax.while_loop(cond, body, init)
    return z_BxL, nfe
