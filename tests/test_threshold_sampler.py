"""Confidence-threshold parallel decoding: degeneration to the one-token
confidence sampler, the factor rule, re-editing, NFE as real calls, and
batch rows equal to single-row runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models.transformer import Transformer, TransformerConfig
from ddlm_jax.sampling.block import BlockSampler
from ddlm_jax.sampling.registry import get_sampler, parse_spec, samplers_for
from ddlm_jax.sampling.threshold import (
  ThresholdSampler,
  factor_count,
  parallel_reveal,
  threshold_count,
)

V, L = 11, 16
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=V)


def _model(seed=0):
  cfg = TransformerConfig(
    vocab_size=V,
    input_vocab_size=V + 1,
    width=32,
    depth=2,
    num_heads=2,
    tied_embeddings=True,  # the untied head starts at zero: flat logits
  )
  return Transformer(cfg, rngs=nnx.Rngs(seed))


class Counting:
  """Wraps a network; counts the calls that really execute."""

  def __init__(self, apply):
    self.apply, self.calls = apply, 0

  def _hit(self, _):
    self.calls += 1

  def __call__(self, z_BxL, t_B):
    jax.debug.callback(self._hit, z_BxL[0, 0])
    return self.apply(z_BxL, t_B)


def _prompts(batch):
  prompt = np.full((batch, L), V, np.int32)
  for b in range(batch):
    prompt[b, :3] = [(b + 1) % V, 2, 3]
    prompt[b, 9] = (4 + b) % V
  return prompt


def test_threshold_one_is_the_one_token_confidence_sampler():
  model = _model()
  prompt = jnp.asarray(_prompts(3))
  out = {}
  for name, params in (
    ('threshold', dict(threshold=1.0)),
    ('confidence', dict(tokens_per_step=1, score='max_prob')),
  ):
    sampler = get_sampler(name, temperature=0.7, **params)
    fn = jax.jit(
      lambda k, s=sampler: s(model, k, PROCESS, batch=3, length=L,
                             prompt_BxL=prompt)
    )  # fmt: skip
    out[name] = [np.asarray(x) for x in fn(jax.random.key(5))]
  np.testing.assert_array_equal(out['threshold'][0], out['confidence'][0])
  masked = int((np.asarray(prompt) == V).sum(-1).max())
  assert int(out['threshold'][1]) == int(out['confidence'][1]) == masked


def test_nfe_counts_real_calls_and_a_low_threshold_decodes_in_parallel():
  model = Counting(_model())
  nfes = {}
  for threshold in (1.0, 0.2):
    sampler = ThresholdSampler(threshold=threshold, temperature=0.2)
    model.calls = 0
    tokens, nfe = jax.jit(
      lambda k, s=sampler: s(model, k, PROCESS, batch=2, length=L)
    )(jax.random.key(1))
    jax.effects_barrier()
    assert int(nfe) == model.calls
    assert np.asarray(tokens).max() < V
    nfes[threshold] = int(nfe)
  assert nfes[1.0] == L
  assert nfes[0.2] < L // 2


def test_rules_on_hand_made_confidences():
  conf = jnp.asarray([[0.99, 0.95, 0.91, 0.5, 0.97]])
  eligible = jnp.asarray([[True, True, True, True, False]])
  assert int(threshold_count(conf, eligible, 0.9)[0]) == 3
  # factor 1: c_(n) >= 1 - 1/(n+1): 0.99 >= 0.5, 0.95 >= 0.667,
  # 0.91 >= 0.75, 0.5 < 0.8 -> 3; factor 0.2: 0.95 >= 0.933, 0.91 <
  # 0.95 -> 2; factor 0.1: 0.95 < 0.967 -> 1.
  assert int(factor_count(conf, eligible, 1.0)[0]) == 3
  assert int(factor_count(conf, eligible, 0.2)[0]) == 2
  assert int(factor_count(conf, eligible, 0.1)[0]) == 1
  reveal = parallel_reveal(
    conf, eligible, threshold=0.96, factor=0.0, min_tokens=2, max_tokens=0
  )
  np.testing.assert_array_equal(reveal[0], [True, True, False, False, False])
  reveal = parallel_reveal(
    conf, eligible, threshold=0.0, factor=0.0, min_tokens=1, max_tokens=2
  )
  assert int(reveal.sum()) == 2 and not bool(reveal[0, 4])


@pytest.mark.parametrize(
  'params', [dict(threshold=0.5), dict(factor=1.0, min_tokens=2)]
)
def test_batch_rows_equal_single_row_runs(params):
  model = _model(1)
  sampler = ThresholdSampler(greedy=True, temperature=0.3, **params)
  prompts = _prompts(3)
  run = jax.jit(
    lambda p: sampler(model, jax.random.key(0), PROCESS, batch=p.shape[0],
                      length=L, prompt_BxL=p)[0]
  )  # fmt: skip
  batch = np.asarray(run(jnp.asarray(prompts)))
  for b in range(3):
    single = np.asarray(run(jnp.asarray(prompts[b : b + 1])))
    np.testing.assert_array_equal(batch[b], single[0])


class Flip:
  """Predicts token 5 while most positions are masked, 7 afterwards."""

  def __call__(self, z_BxL, t_B):
    del t_B
    many = jnp.sum(z_BxL == V, -1) > L // 2
    token_B = jnp.where(many, 5, 7)
    logits = 8.0 * jax.nn.one_hot(token_B, V)[:, None]
    return jnp.broadcast_to(logits, z_BxL.shape + (V,))


def test_editing_rewrites_committed_tokens_but_never_the_prompt():
  prompt = np.full((1, L), V, np.int32)
  prompt[0, :2] = [1, 2]
  results = {}
  for editing in (0.0, 0.9):
    sampler = ThresholdSampler(
      threshold=0.5, greedy=True, editing_threshold=editing
    )
    model = Counting(Flip())
    tokens, nfe = sampler(
      model, jax.random.key(0), PROCESS, batch=1, length=L,
      prompt_BxL=jnp.asarray(prompt),
    )  # fmt: skip
    jax.effects_barrier()
    assert int(nfe) == model.calls
    results[editing] = (np.asarray(tokens)[0], int(nfe))
  plain, edited = results[0.0], results[0.9]
  assert (plain[0][2:] == 5).all() and plain[1] == 1
  # Call 1 commits 5s; call 2 edits them to 7; call 3 edits nothing.
  assert (edited[0][2:] == 7).all() and edited[1] == 3
  np.testing.assert_array_equal(edited[0][:2], [1, 2])


def test_registry_specs_errors_and_block_models():
  name, params = parse_spec('threshold:threshold=0.7,factor=0.5')
  assert get_sampler(name, **params).factor == 0.5
  assert 'threshold' in samplers_for('masked')
  with pytest.raises(ValueError, match='threshold must be in'):
    ThresholdSampler(threshold=1.5)
  with pytest.raises(ValueError, match='max_tokens=1 is below min_tokens'):
    ThresholdSampler(min_tokens=2, max_tokens=1)
  with pytest.raises(ValueError, match='editing_threshold'):
    ThresholdSampler(editing_threshold=-0.1)
  # Block-diffusion models run it inside each block, semi_ar too.
  block = BlockSampler(inner='threshold', inner_params={'threshold': 0.5})
  assert block.inner_sampler == ThresholdSampler(threshold=0.5)
  semi = get_sampler('semi_ar', inner='threshold')
  assert semi.inner_sampler.name == 'threshold'
