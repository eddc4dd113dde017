"""Transformer structure: attention masks by gradients, conditioning, axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.models.attention import rotary
from ddlm_jax.parallel.rules import DEFAULT_RULES, logical_names


def _model(**kw):
  cfg = dict(vocab_size=11, input_vocab_size=12, width=32, depth=2, num_heads=2)
  cfg.update(kw)
  return Transformer(TransformerConfig(**cfg), rngs=nnx.Rngs(0))


def _input_jacobian_support(model, length=8):
  """[out_pos, in_pos] boolean: does logits[i] depend on embedding[j]?"""
  graphdef, params = nnx.split(model)

  @jax.jit
  def jacobian(params):
    m = nnx.merge(graphdef, params)
    x = m.embed(jnp.arange(length)[None] % 11)
    out = lambda x: m.logits(m.backbone(x)).sum(-1)[0]  # [L]
    return jax.jacrev(out)(x)[:, 0]

  jac_LxLxD = jacobian(params)
  return np.asarray(jnp.abs(jac_LxLxD).sum(-1) > 0)


def test_causal_model_has_no_gradient_from_the_future():
  model = _model(causal=True)
  _randomise_head(model)
  support = _input_jacobian_support(model)
  assert np.array_equal(support, np.tril(np.ones_like(support)))


def test_bidirectional_model_sees_every_position():
  model = _model(causal=False)
  _randomise_head(model)
  support = _input_jacobian_support(model)
  assert support.all()


def _randomise_head(model):
  # The head starts at zero (uniform predictions), which hides dependencies.
  head = model.head.kernel
  head[...] = jax.random.normal(jax.random.key(1), head.shape)


def test_time_conditioning_changes_output_only_when_enabled():
  tokens = jnp.arange(16).reshape(2, 8) % 11
  t1, t2 = jnp.full((2,), 0.2), jnp.full((2,), 0.9)
  free = _model(time_conditioning=False)
  call = nnx.jit(lambda m, t: m(tokens, t))
  np.testing.assert_array_equal(call(free, t1), call(free, t2))
  cond = _model(time_conditioning=True)
  _randomise_head(cond)
  for block in cond.blocks:
    mod = block.modulation.kernel
    mod[...] = 0.1 * jax.random.normal(jax.random.key(2), mod.shape)
  assert not np.allclose(call(cond, t1), call(cond, t2))
  with pytest.raises(ValueError, match='t_B'):
    cond(tokens)


def test_tied_head_shares_the_embedding():
  model = _model(tied_embeddings=True)
  assert model.head is None
  out = model(jnp.zeros((1, 4), jnp.int32))
  assert out.shape == (1, 4, 11)


def test_rotary_is_relative():
  """q.k after rotary depends only on the position difference."""
  key = jax.random.key(0)
  q = jax.random.normal(key, (1, 1, 1, 16))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))
  length = 12
  qs = rotary(jnp.tile(q, (1, 1, length, 1)))[0, 0]
  ks = rotary(jnp.tile(k, (1, 1, length, 1)))[0, 0]
  dots = qs @ ks.T
  np.testing.assert_allclose(dots[3, 1], dots[7, 5], rtol=1e-5)
  np.testing.assert_allclose(dots[2, 9], dots[0, 7], rtol=1e-5)


def test_rotary_positions_per_row_and_traced():
  """Per-row positions [B, L] rotate each row at its own positions, and
  traced positions give what known ones give."""
  x_BxHxLxK = jax.random.normal(jax.random.key(0), (2, 3, 5, 8))
  pos_BxL = jnp.array([[4, 0, 9, 9, 2], [1, 2, 3, 30, 7]])
  got = rotary(x_BxHxLxK, 100.0, pos_BxL)
  for b in range(2):
    want = rotary(x_BxHxLxK[b : b + 1], 100.0, np.asarray(pos_BxL[b]))
    np.testing.assert_allclose(got[b : b + 1], want, rtol=1e-6, atol=1e-6)
  traced = jax.jit(lambda p: rotary(x_BxHxLxK, 100.0, p))(pos_BxL[0])
  known = rotary(x_BxHxLxK, 100.0, np.asarray(pos_BxL[0]))
  np.testing.assert_allclose(traced, known, rtol=1e-6, atol=1e-6)
  assert not np.allclose(got[0], got[1])  # positions matter


def test_rotary_tables_are_constants_of_the_compiled_forward():
  """Known positions must not leave cos/sin in the program: inside it,
  XLA:CPU evaluated them once per element of [B, H, L, K] (~10% of a
  small model's forward, measured with the train-step benchmark)."""
  model = _model()
  z_BxL = jnp.zeros((2, 8), jnp.int32)
  hlo = jax.jit(lambda z: model(z)).lower(z_BxL).as_text()
  assert 'cosine' not in hlo and 'sine' not in hlo
  traced = jax.jit(lambda p: rotary(jnp.ones((1, 1, 8, 4)), positions_L=p))
  assert 'cosine' in traced.lower(jnp.arange(8)).as_text()


def test_dense_part_is_a_slice_of_the_full_output():
  model = _model()
  qkv = model.blocks[0].attn.qkv
  x_BxLxD = jax.random.normal(jax.random.key(0), (2, 4, qkv.in_shape[0]))
  full = qkv(x_BxLxD)
  np.testing.assert_allclose(
    qkv(x_BxLxD, part=slice(1, 3)), full[:, :, 1:3], rtol=1e-6, atol=1e-6
  )
  assert qkv(x_BxLxD, part=slice(1)).shape == full[:, :, :1].shape


def test_every_parameter_has_logical_axes_with_rules():
  model = _model(time_conditioning=True)
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    names = logical_names(var)
    assert len(names) == var.shape.__len__(), path
    for name in names:
      assert name is not None and name in DEFAULT_RULES, (path, name)


def test_bad_config_errors_are_clear():
  with pytest.raises(ValueError, match='attention_impl'):
    TransformerConfig(vocab_size=4, input_vocab_size=5, attention_impl='cuda')
  with pytest.raises(ValueError, match='divisible'):
    _model(width=30, num_heads=4)


@pytest.mark.parametrize('causal', [False, True])
def test_pallas_attention_dispatch_matches_xla(causal):
  """The model's attention goes through pallas_kernels when asked to."""
  tokens = (jnp.arange(32).reshape(2, 16) * 7) % 11
  outs = {}
  for impl in ['xla', 'interpret']:
    model = _model(causal=causal, attention_impl=impl)
    _randomise_head(model)
    outs[impl] = nnx.jit(lambda m: m(tokens))(model)
  np.testing.assert_allclose(outs['xla'], outs['interpret'], atol=2e-5)


@pytest.mark.parametrize('causal', [False, True])
def test_xla_attention_matches_jax_reference(causal):
  from ddlm_jax.models.attention import xla_attention

  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(kk, (2, 3, 10, 8)) for kk in keys)
  ours = xla_attention(q, k, v, causal=causal)
  to_blhd = lambda x: jnp.swapaxes(x, 1, 2)
  ref = jax.nn.dot_product_attention(
    to_blhd(q), to_blhd(k), to_blhd(v), is_causal=causal
  )
  np.testing.assert_allclose(ours, to_blhd(ref), atol=1e-5)
