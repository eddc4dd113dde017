"""Logits at chosen positions (`Transformer.logits_at`) and the ancestral
sampler that calls the network only where a step reveals tokens.

The shortcut must be invisible in the samples: the same key gives the same
tokens as the full pass, with filters, prompts, the full-pass fallback for
steps that reveal more than the budget, and model scheduling.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.models.hybrid import HybridTransformer, hybrid_config
from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.registry import get_sampler

VOCAB, LENGTH, BATCH = 11, 48, 3
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=VOCAB)


def _randomised(model, seed):
  """The model with every parameter perturbed (zero-init heads and
  modulations would hide mistakes)."""
  graphdef, state = nnx.split(model)
  leaves, tree = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [
    x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)
  ]
  return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))


def _config(**kw):
  return TransformerConfig(
    vocab_size=VOCAB,
    input_vocab_size=VOCAB + 1,
    width=32,
    depth=2,
    num_heads=2,
    **kw,
  )


def _transformer(seed=0, **kw):
  return _randomised(Transformer(_config(**kw), rngs=nnx.Rngs(seed)), seed)


def _hybrid(seed=0):
  cfg = hybrid_config(_config(), {'pattern': 'AS', 'state_size': 4})
  return _randomised(HybridTransformer(cfg, rngs=nnx.Rngs(seed)), seed)


@pytest.mark.parametrize(
  'make',
  [
    lambda: _transformer(),
    lambda: _transformer(time_conditioning=True),
    _hybrid,
  ],
  ids=['transformer', 'adaln', 'hybrid'],
)
def test_logits_at_equals_the_full_pass_at_those_positions(make):
  model = make()
  z_BxL = jax.random.randint(jax.random.key(1), (BATCH, LENGTH), 0, VOCAB + 1)
  t_B = jnp.array([0.2, 0.5, 0.9])
  idx_BxN = jnp.array([[0, 5, 47, 5], [3, 3, 7, 1], [47, 2, 1, 0]])
  full_BxLxV = model(z_BxL, t_B)
  want = jnp.take_along_axis(full_BxLxV, idx_BxN[..., None], axis=1)
  got = model.logits_at(z_BxL, t_B, idx_BxN)
  assert got.shape == (BATCH, 4, VOCAB)
  # Shorter matmuls and the per-token first block round differently (up
  # to ~1.4e-5 on logits of size ~4 with jax 0.12); a wrong path is O(1).
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert float(jnp.max(jnp.abs(want))) > 0.1  # Not a trivially zero head.


def test_first_block_from_tokens_equals_the_block_on_embeddings():
  """The per-token input norm and Q/K/V of a time-free first block (what
  logits_at runs) give the block's output on the gathered embeddings."""
  model = _transformer(seed=3)
  z_BxL = jax.random.randint(jax.random.key(2), (BATCH, LENGTH), 0, VOCAB + 1)
  table_VxD = model.embedding[...]
  want = model.blocks[0](model.embed(z_BxL))
  got = model.blocks[0].from_tokens(z_BxL, table_VxD)
  # Matmuls over V rows instead of B * L round differently (~1e-5 here).
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert float(jnp.max(jnp.abs(want - model.embed(z_BxL)))) > 0.1
  adaln = _transformer(time_conditioning=True)
  with pytest.raises(ValueError, match='time-free'):
    adaln.blocks[0].from_tokens(z_BxL, adaln.embedding[...])


def test_logits_at_is_refused_where_it_does_not_apply():
  for kw in (dict(causal=True), dict(block_size=8)):
    model = Transformer(_config(**kw), rngs=nnx.Rngs(0))
    assert not model.supports_logits_at()
    assert grid_lib.positional_logits(model) is None
    with pytest.raises(ValueError, match='bidirectional plain'):
      model.logits_at(
        jnp.zeros((1, 16), jnp.int32), None, jnp.zeros((1, 2), jnp.int32)
      )
  assert grid_lib.positional_logits(lambda z, t: z) is None


def test_reveal_budget_follows_the_grid():
  def budget(steps, length):
    sampler = get_sampler('ancestral', num_steps=steps)
    return grid_lib.reveal_budget(sampler.grid(PROCESS), length)

  # Loglinear on a uniform grid reveals length / T per step on average.
  assert budget(256, 256) == 16  # mu = 1: 1 + 4 + 4 -> 16
  assert budget(1024, 256) == 8  # mu = 1/4
  assert budget(32, 256) == 24  # mu = 8: 8 + 11.3 + 4
  assert budget(2, 256) is None  # half the length per step: no saving


def _sample(apply, key, steps, prompt=None, **kw):
  sampler = get_sampler('ancestral', num_steps=steps, **kw)
  fn = jax.jit(
    lambda k, p: sampler(
      apply, k, PROCESS, batch=BATCH, length=LENGTH, prompt_BxL=p
    )
  )
  tokens, nfe = fn(key, prompt)
  return np.asarray(tokens), int(nfe)


def _prompt():
  prompt = np.full((BATCH, LENGTH), VOCAB, np.int32)
  prompt[:, :3] = [1, 2, 3]
  prompt[1, 20] = 4
  return jnp.asarray(prompt)


@pytest.mark.parametrize(
  'steps, filters, prompted',
  [
    (64, {}, False),
    (200, dict(top_k=3), True),
    (16, dict(temperature=0.7, top_p=0.9), True),
  ],
)
def test_cached_ancestral_with_logits_at_draws_the_same_tokens(
  steps, filters, prompted
):
  model = _transformer(seed=2)
  full = lambda z, t: model(z, t)  # Hides logits_at: the full pass.
  key = jax.random.key(7)
  prompt = _prompt() if prompted else None
  want, nfe_full = _sample(full, key, steps, prompt, **filters)
  got, nfe = _sample(model, key, steps, prompt, **filters)
  np.testing.assert_array_equal(got, want)
  assert nfe == nfe_full
  assert not np.any(got == VOCAB)
  if prompted:
    np.testing.assert_array_equal(got[:, :3], np.asarray(_prompt())[:, :3])
  # The uncached, walk-every-step sampler never takes the positional path.
  uncached, _ = _sample(model, key, steps, prompt, use_cache=False, **filters)
  np.testing.assert_array_equal(got, uncached)


@pytest.mark.parametrize('budget', [1, 2])
def test_steps_over_the_budget_take_the_full_pass(monkeypatch, budget):
  """With a budget of 1-2 positions most T = 8 steps (~6 reveals per row)
  overflow and take the full pass, the rest the positional one."""
  model = _transformer(seed=3)
  key = jax.random.key(11)
  want, _ = _sample(lambda z, t: model(z, t), key, 8)
  calls = {'at': 0}
  at = model.logits_at

  def counting_at(*args):
    calls['at'] += 1  # Traced once per compilation of the branch.
    return at(*args)

  monkeypatch.setattr(grid_lib, 'reveal_budget', lambda g, n: budget)
  monkeypatch.setattr(grid_lib, 'positional_logits', lambda a: counting_at)
  got, _ = _sample(model, key, 8)
  np.testing.assert_array_equal(got, want)
  assert calls['at'] == 1


def test_scheduled_networks_each_use_their_own_logits_at():
  heavy, light = _transformer(seed=4), _transformer(seed=5)
  sampler = get_sampler(
    'scheduled', num_steps=96, pattern='light:0.25,heavy:0.5,light:0.25'
  )
  key = jax.random.key(3)
  run = lambda pair: jax.jit(
    lambda k: sampler(pair, k, PROCESS, batch=BATCH, length=LENGTH)
  )(key)
  want = run((lambda z, t: heavy(z, t), lambda z, t: light(z, t)))
  got = run((heavy, light))
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
