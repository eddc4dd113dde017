"""Approximate key/value caches for bidirectional masked diffusion models.

Fast-dLLM's prefix and dual caches, for plain (not block-trained) models
with the `kv_pass` / `window_logits` methods of models.Transformer. The
sequence is decoded semi-autoregressively in blocks of `block_length`;
inside a block each call reveals positions by the threshold or factor rule
of sampling.threshold. The first call of a block, and every `refresh`-th
call after it (refresh > 0), is a full pass that also refreshes the keys
and values of every position. The other calls run only a window against
that cache:

* 'prefix': the window is the block and everything after it; the keys and
  values before the block come from the cache.
* 'dual': the window is the block alone; the positions before and after it
  (the masked suffix too) are read from the cache.
* 'none': every call is a full pass (the reference the caches approximate).

The cache is approximate because a bidirectional model's keys at the
cached positions depend on the tokens revealed since the refresh; refresh=1
makes every call a full pass, so the dual cache then equals 'none' token for
token. NFE counts every network call (full passes and window calls, also
reported apart); a window call costs about window / L of a full pass.

The cache-error meter (`meter=True`) runs, beside every window call, the
full pass it approximates and records KL(exact || cached) of the predicted
distributions (temperature 1, no filtering) at the positions the call reads
(the masked positions of the block): the sum, maximum and count, so the
mean and max per sample are reported (`CacheMeter.summary`), flagged
'exact' for caches that are exact by construction ('none', refresh=1, or
one block covering the sequence: `kind_for`) and 'approximate' otherwise.
The meter's own calls are not in NFE (`meter_calls`).
`measure_block_cache` meters the exact BD3 block cache the same way: it
reads 0 up to float32 rounding (KL < 1e-6, where the dual cache of a small
random model reads ~1e-3).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ddlm_jax.sampling.base import Sampler, require_int
from ddlm_jax.sampling.block import Cost
from ddlm_jax.sampling.common import (
  filtered_log_probs,
  initial_state,
  time_for_masked_fraction,
  uses_feedback,
)
from ddlm_jax.sampling.noise import gumbel
from ddlm_jax.sampling.threshold import check_rule, confidence, parallel_reveal

CACHES = ('dual', 'prefix', 'none')
MODEL_METHODS = ('kv_pass', 'window_logits')


def kl_divergence(exact_BxNxV: jax.Array, cached_BxNxV: jax.Array):
  """KL(softmax(exact) || softmax(cached)) per position, [B, N], >= 0."""
  logp = jax.nn.log_softmax(exact_BxNxV.astype(jnp.float32), axis=-1)
  logq = jax.nn.log_softmax(cached_BxNxV.astype(jnp.float32), axis=-1)
  kl = jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)
  return jnp.maximum(kl, 0.0)  # Rounding can leave -1e-9 for equal inputs.


class CacheMeter(NamedTuple):
  """The cache-error meter's running totals (float32 / int32 scalars).

  Attributes:
    kl_sum: sum of KL(exact || cached) over metered positions.
    kl_max: the largest KL at one position.
    positions: metered (row, position) pairs.
    calls: metered network calls (the meter's own full passes).
  """

  kl_sum: jax.Array
  kl_max: jax.Array
  positions: jax.Array
  calls: jax.Array

  @classmethod
  def zero(cls) -> CacheMeter:
    f, i = jnp.float32(0.0), jnp.int32(0)
    return cls(f, f, i, i)

  def add(self, kl_BxN, read_BxN, calls=1) -> CacheMeter:
    kl_BxN = jnp.where(read_BxN, kl_BxN, 0.0)
    return CacheMeter(
      self.kl_sum + jnp.sum(kl_BxN),
      jnp.maximum(self.kl_max, jnp.max(kl_BxN, initial=0.0)),
      self.positions + jnp.sum(read_BxN).astype(jnp.int32),
      self.calls + jnp.asarray(calls, jnp.int32),
    )

  def summary(self, kind: str) -> dict:
    """{'cache_kind', 'kl_mean', 'kl_max', 'metered_positions',
    'meter_calls'} as Python numbers (kl_mean 0 when nothing was read)."""
    count = int(self.positions)
    return {
      'cache_kind': kind,
      'kl_mean': float(self.kl_sum) / count if count else 0.0,
      'kl_max': float(self.kl_max),
      'metered_positions': count,
      'meter_calls': int(self.calls),
    }


class CacheSample(NamedTuple):
  """What `ApproxCacheSampler.generate` returns.

  Attributes:
    tokens_BxL: the samples.
    nfe: int32, network calls (full passes + window calls).
    full_calls: int32, full passes (refreshes; every call with 'none').
    window_calls: int32, window calls against the cache.
    meter: the cache-error meter (zero unless meter=True).
    cost: per-row work of the counted calls (sampling.block.Cost: a window
      call runs its window's tokens against all L keys), for
      `block.estimate_flops`; the meter's passes are left out.
  """

  tokens_BxL: jax.Array  # noqa: N815
  nfe: jax.Array
  full_calls: jax.Array
  window_calls: jax.Array
  meter: CacheMeter
  cost: Cost


def check_cache_model(model, name: str) -> None:
  """TypeError unless the network is one plain model with cache methods."""
  missing = [m for m in MODEL_METHODS if not hasattr(model, m)]
  if isinstance(model, (tuple, list)) or missing or not callable(model):
    raise TypeError(
      f'sampler {name!r} takes one attention-only network exposing '
      f'{MODEL_METHODS} (models.Transformer with block_size=0); got '
      f'{type(model).__name__}. Use the threshold sampler for other '
      'backbones.'
    )
  if uses_feedback([model]):
    raise ValueError(
      f'sampler {name!r} cannot run a soft-masked network (it reads its '
      'previous prediction); use the threshold sampler.'
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApproxCacheSampler(Sampler):
  """Block-wise threshold decoding with an approximate KV cache.

  `apply` is the network itself (kv_pass, window_logits and __call__).

  Attributes:
    cache: 'dual', 'prefix' or 'none' (see the module doc).
    block_length: positions per semi-autoregressive block (Fast-dLLM: 32).
    refresh: 0 refreshes the cache at each block's first call only; k > 0
      also every k-th call inside a block (1: every call, exact).
    threshold, factor, min_tokens, max_tokens: the reveal rule of
      sampling.threshold.
    greedy: reveal each position's argmax token instead of a sample.
    meter: also run the cache-error meter (extra full passes).
  """

  name: ClassVar[str] = 'approx_cache'
  families: ClassVar[tuple[str, ...]] = ('masked',)

  cache: str = 'dual'
  block_length: int = 32
  refresh: int = 0
  threshold: float = 0.9
  factor: float = 0.0
  min_tokens: int = 1
  max_tokens: int = 0
  greedy: bool = False
  meter: bool = False

  def __post_init__(self):
    super().__post_init__()
    if self.cache not in CACHES:
      raise ValueError(f'cache={self.cache!r}; choose one of {CACHES}.')
    require_int('block_length', self.block_length, 1)
    require_int('refresh', self.refresh, 0)
    check_rule(self.threshold, self.factor, self.min_tokens, self.max_tokens)
    self._set(greedy=bool(self.greedy), meter=bool(self.meter))

  @property
  def kind(self) -> str:
    """'exact' when no call reads a stale cache, else 'approximate'."""
    exact = self.cache == 'none' or self.refresh == 1
    return 'exact' if exact else 'approximate'

  def kind_for(self, length: int) -> str:
    """`kind` for sequences of `length`: one block is exact too (every
    window call then covers the whole sequence)."""
    return 'exact' if self.block_length >= length else self.kind

  def fill(self, apply, key, process, z_BxL, window_BxL):
    out = self.run(apply, key, process, z_BxL, window_BxL)
    return out.tokens_BxL, out.nfe

  def generate(
    self, apply, key, process, *, batch: int, length: int, prompt_BxL=None
  ) -> CacheSample:
    """Like calling the sampler, returning the whole `CacheSample` (the
    interface of the block samplers, whose cost the sample runner reads)."""
    self.check_applies(process)
    z_BxL = initial_state(process, batch, length, prompt_BxL)
    window = jnp.ones((batch, length), bool)
    return self.run(apply, key, process, z_BxL, window)

  def run(self, model, key, process, z_BxL, window_BxL) -> CacheSample:
    check_cache_model(model, self.name)
    mask_id = process.mask_id
    batch, length = z_BxL.shape
    size = min(self.block_length, length)
    free = (z_BxL == mask_id) & window_BxL
    rule = dict(
      threshold=float(self.threshold),
      factor=float(self.factor),
      min_tokens=int(self.min_tokens),
      max_tokens=int(self.max_tokens),
    )
    cache = model.init_cache(batch, length) if self.cache != 'none' else None
    counts = (jnp.int32(0),) * 3  # nfe, full passes, window calls
    meter, cost = CacheMeter.zero(), Cost.zero()
    z = z_BxL.astype(jnp.int32)
    # A Python loop over blocks: the prefix window's length depends on
    # the block, and static starts give compile-time rotary tables.
    for b, start in enumerate(range(0, length, size)):
      stop = min(start + size, length)
      read_BxN = free[:, start:stop]
      z, cache, counts, meter, cost = self._block(
        model, jax.random.fold_in(key, b), process, z, read_BxN,
        (start, stop), cache, counts, meter, cost, rule,
      )  # fmt: skip
    nfe, full, window = counts
    return CacheSample(z, nfe, full, window, meter, cost)

  def _block(
    self, model, key, process, z, read_BxN, span, cache, counts, meter, cost,
    rule,
  ):  # fmt: skip
    """Decodes positions start..stop-1 (the masked ones in read_BxN)."""
    start, stop = span
    mask_id = process.mask_id
    length = z.shape[1]
    window_len = stop - start if self.cache == 'dual' else length - start

    def logits_of(z, t_B, k, cache, meter):
      """(block logits, cache, meter, full pass?) of one call."""
      if self.cache == 'none':
        return model(z, t_B)[:, start:stop], cache, meter, jnp.bool_(True)

      def full():
        logits, new = model.kv_pass(z, t_B)
        return logits[:, start:stop], new, meter

      def window():
        end = stop if self.cache == 'dual' else z.shape[1]
        logits = model.window_logits(z[:, start:end], cache, start, t_B)
        logits = logits[:, : stop - start]
        new_meter = meter
        if self.meter:
          exact = model(z, t_B)[:, start:stop]
          read = (z[:, start:stop] == mask_id) & read_BxN
          new_meter = meter.add(kl_divergence(exact, logits), read)
        return logits, cache, new_meter

      refresh = k == 0
      if self.refresh:
        refresh = refresh | (k % self.refresh == 0)
      logits, cache, meter = jax.lax.cond(refresh, full, window)
      return logits, cache, meter, refresh

    def cond(carry):
      z = carry[0]
      return jnp.any((z[:, start:stop] == mask_id) & read_BxN)

    def body(carry):
      z, key, k, cache, counts, meter, cost = carry
      key, tok_key = jax.random.split(key)
      t_B = time_for_masked_fraction(process.schedule, z, mask_id)
      logits, cache, meter, was_full = logits_of(z, t_B, k, cache, meter)
      logp = filtered_log_probs(logits, **self.filters)
      if self.greedy:
        tokens = jnp.argmax(logp, axis=-1)
      else:
        tokens = jnp.argmax(logp + gumbel(tok_key, logp.shape), axis=-1)
      z_blk = z[:, start:stop]
      masked = (z_blk == mask_id) & read_BxN
      reveal = parallel_reveal(confidence(logp), masked, **rule)
      z_blk = jnp.where(reveal, tokens.astype(jnp.int32), z_blk)
      z = jax.lax.dynamic_update_slice_in_dim(z, z_blk, start, axis=1)
      nfe, full, window = counts
      full_i = was_full.astype(jnp.int32)
      counts = (nfe + 1, full + full_i, window + 1 - full_i)
      cost = cost.add(full_i, length, length)
      cost = cost.add(1 - full_i, window_len, length)
      return z, key, k + 1, cache, counts, meter, cost

    init = (z, key, jnp.int32(0), cache, counts, meter, cost)
    z, _, _, cache, counts, meter, cost = jax.lax.while_loop(cond, body, init)
    return z, cache, counts, meter, cost


def measure_block_cache(
  model, z_BxL: jax.Array, x_BxL: jax.Array, block_size: int, mask_id: int
) -> CacheMeter:
  """The meter on the exact BD3 block cache: block_logits against the 2L
  training pass, at the masked positions of every block of z.

  x_BxL holds the clean tokens, z_BxL a noisy version (mask id where
  masked). Block b is predicted from the cache of the clean blocks before
  it (extend_cache) and, in the 2L pass, from concat(z, x): the same
  function, so the KL reads 0 up to float rounding.
  """
  length = x_BxL.shape[1]
  exact = model(jnp.concatenate([z_BxL, x_BxL], 1), block_size=block_size)
  cache = model.init_cache(x_BxL.shape[0], length)
  meter = CacheMeter.zero()
  for start in range(0, length, block_size):
    stop = start + block_size
    cached = model.block_logits(z_BxL[:, start:stop], cache, start)
    read = z_BxL[:, start:stop] == mask_id
    kl = kl_divergence(exact[:, start:stop], cached)
    meter = meter.add(kl, read)
    cache = model.extend_cache(x_BxL[:, start:stop], cache, start)
  return meter
