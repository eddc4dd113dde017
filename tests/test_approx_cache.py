"""Approximate prefix/dual KV caches and the cache-error meter.

Refresh period 1 equals no cache token for token; the meter reads 0 on the
exact caches (refresh 1, the BD3 block cache) and > 0 on approximate ones;
NFE counts real network calls; batch rows equal single-row runs.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models.transformer import Transformer, TransformerConfig
from ddlm_jax.sampling.approx_cache import (
  ApproxCacheSampler,
  kl_divergence,
  measure_block_cache,
)
from ddlm_jax.sampling.registry import get_sampler, samplers_for

V, L, BLOCK = 11, 24, 8
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=V)


def _model(seed=0, block_size=0):
  cfg = TransformerConfig(
    vocab_size=V,
    input_vocab_size=V + 1,
    width=32,
    depth=2,
    num_heads=2,
    tied_embeddings=True,  # the untied head starts at zero: flat logits
    block_size=block_size,
  )
  return Transformer(cfg, rngs=nnx.Rngs(seed))


class Counting:
  """A Transformer whose executed calls are counted per method."""

  def __init__(self, model):
    self.model, self.calls = model, collections.Counter()

  def _hit(self, name, x):
    jax.debug.callback(lambda _: self.calls.update([name]), x[0, 0])

  def __call__(self, z_BxL, t_B=None):
    self._hit('call', z_BxL)
    return self.model(z_BxL, t_B)

  def kv_pass(self, z_BxL, t_B=None):
    self._hit('kv_pass', z_BxL)
    return self.model.kv_pass(z_BxL, t_B)

  def window_logits(self, z_BxN, cache, start, t_B=None):
    self._hit('window', z_BxN)
    return self.model.window_logits(z_BxN, cache, start, t_B)

  def init_cache(self, batch, length):
    return self.model.init_cache(batch, length)


def _prompts(batch):
  prompt = np.full((batch, L), V, np.int32)
  for b in range(batch):
    prompt[b, :3] = [(b + 1) % V, 2, 3]
    prompt[b, 13] = (4 + b) % V
  return prompt


def _decode(sampler, model, prompt, seed=0):
  fn = jax.jit(
    lambda k, p: sampler.generate(model, k, PROCESS, batch=p.shape[0],
                                length=L, prompt_BxL=p)
  )  # fmt: skip
  return fn(jax.random.key(seed), jnp.asarray(prompt))


@pytest.mark.parametrize('cache', ['dual', 'prefix'])
def test_refresh_one_equals_no_cache_token_for_token(cache):
  model = _model()
  prompt = _prompts(2)
  common = dict(block_length=BLOCK, threshold=0.6, temperature=0.5)
  ref = _decode(ApproxCacheSampler(cache='none', **common), model, prompt)
  out = _decode(
    ApproxCacheSampler(cache=cache, refresh=1, meter=True, **common),
    model,
    prompt,
  )
  np.testing.assert_array_equal(out.tokens_BxL, ref.tokens_BxL)
  assert int(out.nfe) == int(ref.nfe) == int(out.full_calls)
  assert int(out.window_calls) == 0
  assert out.meter.summary('exact')['kl_max'] == 0.0
  # The default refresh (block starts only) changes the tokens' path.
  approx = _decode(ApproxCacheSampler(cache=cache, **common), model, prompt)
  assert int(approx.window_calls) > 0
  assert int(approx.full_calls) == L // BLOCK


def test_meter_reads_zero_on_exact_caches_and_more_on_approximate_ones():
  model = _model(2)
  prompt = _prompts(2)
  summaries = {}
  for refresh in (0, 1):
    sampler = ApproxCacheSampler(
      cache='dual', block_length=BLOCK, refresh=refresh, threshold=0.8,
      temperature=0.5, meter=True,
    )  # fmt: skip
    out = _decode(sampler, model, prompt)
    summaries[refresh] = out.meter.summary(sampler.kind)
  assert summaries[1]['cache_kind'] == 'exact'
  assert summaries[1]['kl_mean'] == summaries[1]['kl_max'] == 0.0
  approx = summaries[0]
  assert approx['cache_kind'] == 'approximate'
  assert approx['metered_positions'] > 0 and approx['meter_calls'] > 0
  assert 0 < approx['kl_mean'] <= approx['kl_max']
  # The exact BD3 block cache against its 2L training pass.
  bd3 = _model(3, block_size=BLOCK)
  x = jax.random.randint(jax.random.key(0), (2, L), 0, V)
  z = jnp.where(jax.random.uniform(jax.random.key(1), (2, L)) < 0.5, V, x)
  meter = jax.jit(
    lambda z, x: measure_block_cache(bd3, z, x, BLOCK, mask_id=V)
  )(z, x)  # fmt: skip
  block = meter.summary('exact')
  assert block['metered_positions'] == int((z == V).sum())
  # 0 up to float32 rounding; the approximate cache reads ~1e-3.
  assert block['kl_max'] < 1e-6 < 1e-4 < approx['kl_mean']
  # KL of equal logits is 0; of different ones positive.
  logits = jax.random.normal(jax.random.key(2), (1, 3, V))
  assert float(jnp.max(kl_divergence(logits, logits))) == 0.0
  assert float(jnp.min(kl_divergence(logits, 2 * logits))) > 0.0


@pytest.mark.parametrize('cache', ['dual', 'prefix', 'none'])
def test_nfe_counts_real_network_calls(cache):
  model = Counting(_model())
  sampler = ApproxCacheSampler(
    cache=cache, block_length=BLOCK, refresh=3, threshold=0.5,
    temperature=0.5, meter=True,
  )  # fmt: skip
  out = _decode(sampler, model, _prompts(2))
  jax.effects_barrier()
  calls = model.calls
  assert int(out.nfe) == calls['kv_pass'] + calls['window'] + (
    calls['call'] if cache == 'none' else 0
  )
  # Work: full passes run L tokens against L keys, window calls theirs.
  window = {'dual': BLOCK, 'prefix': None, 'none': 0}[cache]
  pairs = float(out.cost.attention_pairs)
  assert float(out.cost.dense_tokens) * L == pairs
  if window is not None:
    want = int(out.full_calls) * L + int(out.window_calls) * window
    assert float(out.cost.dense_tokens) == want
  if cache != 'none':
    assert int(out.full_calls) == calls['kv_pass']
    assert int(out.window_calls) == calls['window']
    # The meter's exact passes are extra calls, not counted in NFE.
    assert int(out.meter.calls) == calls['call'] == calls['window'] > 0
  # Fewer calls than tokens: several tokens per call.
  assert int(out.nfe) < int((_prompts(2) == V).sum(-1).max())


@pytest.mark.parametrize('cache', ['dual', 'prefix'])
def test_batch_rows_equal_single_row_runs(cache):
  model = _model(1)
  sampler = ApproxCacheSampler(
    cache=cache, block_length=BLOCK, threshold=0.4, greedy=True,
    temperature=0.5,
  )  # fmt: skip
  prompts = _prompts(3)
  batch = np.asarray(_decode(sampler, model, prompts).tokens_BxL)
  for b in range(3):
    single = _decode(sampler, model, prompts[b : b + 1]).tokens_BxL
    np.testing.assert_array_equal(batch[b], np.asarray(single)[0])


def test_registry_and_bad_input():
  assert 'approx_cache' in samplers_for('masked')
  sampler = get_sampler('approx_cache', cache='prefix', refresh=4)
  assert sampler.kind == 'approximate'
  assert get_sampler('approx_cache', cache='none').kind == 'exact'
  assert (
    sampler.kind_for(32) == 'exact' and sampler.kind_for(33) == sampler.kind
  )
  with pytest.raises(ValueError, match="cache='kv'"):
    ApproxCacheSampler(cache='kv')
  with pytest.raises(ValueError, match='refresh must be an integer'):
    ApproxCacheSampler(refresh=-1)
  with pytest.raises(TypeError, match='kv_pass'):
    sampler(lambda z, t: z, jax.random.key(0), PROCESS, batch=1, length=L)
  with pytest.raises(ValueError, match='exact block cache'):
    _model(block_size=BLOCK).kv_pass(jnp.zeros((1, L), jnp.int32))
  from ddlm_jax.models.hybrid import HybridConfig, HybridTransformer

  base = TransformerConfig(
    vocab_size=V, input_vocab_size=V + 1, width=16, depth=2, num_heads=2
  )
  hybrid = HybridTransformer(
    HybridConfig(base=base, pattern='AS', state_size=4), rngs=nnx.Rngs(0)
  )
  with pytest.raises(ValueError, match='state-space layers'):
    hybrid.kv_pass(jnp.zeros((1, L), jnp.int32))


def test_no_cache_is_semi_ar_with_the_threshold_rule():
  """cache='none' decodes like semi_ar with the threshold sampler inside
  each block (greedy: the two loops use their keys differently)."""
  model = _model(4)
  prompt = jnp.asarray(_prompts(2))
  rule = dict(threshold=0.6, greedy=True, temperature=0.5)
  ours = _decode(ApproxCacheSampler(cache='none', block_length=BLOCK, **rule),
                 model, prompt)  # fmt: skip
  semi = get_sampler(
    'semi_ar', block_length=BLOCK, inner='threshold', inner_params=rule,
    temperature=0.5,
  )  # fmt: skip
  tokens, nfe = jax.jit(
    lambda k: semi(model, k, PROCESS, batch=2, length=L, prompt_BxL=prompt)
  )(jax.random.key(0))
  np.testing.assert_array_equal(ours.tokens_BxL, tokens)
  assert int(ours.nfe) == int(nfe)
