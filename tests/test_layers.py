"""Shared building blocks (ddlm_jax.models.layers) and the hardmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.models import hardmax, hybrid, layers, ssm, transformer
from ddlm_jax.models import sequence_classifier as sc


def _randn(seed, *shape, scale=1.0):
  x = np.random.default_rng(seed).standard_normal(shape) * scale
  return jnp.asarray(x, jnp.float32)


def _paths(module):
  return {
    '/'.join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(module))
  }


# ----------------------------------------------------------------------------
# Dense, RMSNorm, MLP.


def test_rms_norm_matches_closed_form():
  norm = layers.RMSNorm(6, rngs=nnx.Rngs(0), eps=1e-5)
  norm.scale[...] = _randn(1, 6)
  x = _randn(2, 3, 4, 6, scale=3.0)
  xn = np.asarray(x, np.float64)
  want = xn / np.sqrt(np.mean(xn**2, -1, keepdims=True) + 1e-5)
  want = want * np.asarray(norm.scale[...], np.float64)
  np.testing.assert_allclose(norm(x), want, rtol=1e-5, atol=1e-6)
  # Computed in float32, returned in the input dtype.
  y = norm(x.astype(jnp.bfloat16))
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(y.astype(jnp.float32), want, rtol=2e-2, atol=2e-2)


def test_dense_contracts_named_multi_axis_shapes():
  dense = layers.Dense(
    (2, 3), (4, 5), ('heads', 'head_dim'), ('qkv', 'embed'),
    rngs=nnx.Rngs(0), use_bias=True,
  )  # fmt: skip
  dense.bias[...] = _randn(1, 4, 5)
  x = _randn(2, 7, 2, 3)
  want = jnp.einsum('bij,ijkl->bkl', x, dense.kernel[...]) + dense.bias[...]
  np.testing.assert_allclose(dense(x), want, rtol=1e-5, atol=1e-6)
  names = dense.kernel.get_metadata()['out_sharding']
  assert names == ('heads', 'head_dim', 'qkv', 'embed')
  assert dense.bias.get_metadata()['out_sharding'] == ('qkv', 'embed')
  with pytest.raises(ValueError, match='do not match shape'):
    layers.param(nnx.Rngs(0), nnx.initializers.ones, (2, 3), ('embed',))


def test_lecun_dense_reproduces_nnx_linear():
  # The SSM stacks were built with nnx.Linear; the same seed must give the
  # same kernel (and zero bias) and the same outputs.
  ours = layers.lecun_dense(5, 3, ('embed', 'mlp'), rngs=nnx.Rngs(4))
  theirs = nnx.Linear(5, 3, rngs=nnx.Rngs(4))
  np.testing.assert_array_equal(ours.kernel[...], theirs.kernel[...])
  np.testing.assert_array_equal(ours.bias[...], theirs.bias[...])
  theirs.bias[...] = ours.bias[...] = _randn(0, 3)
  x = _randn(1, 2, 4, 5)
  np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6, atol=1e-6)


def test_mlp_closed_forms_and_parameter_names():
  x = _randn(0, 2, 3, 4)
  swi = layers.MLP(4, 8, 'swiglu', rngs=nnx.Rngs(0))
  assert _paths(swi) == {'up/kernel', 'gate/kernel', 'down/kernel'}
  w = lambda d: d.kernel[...]
  want = (jax.nn.silu(x @ w(swi.gate)) * (x @ w(swi.up))) @ w(swi.down)
  np.testing.assert_allclose(swi(x), want, rtol=1e-5, atol=1e-6)

  fc = layers.MLP(
    4, 8, 'gelu', rngs=nnx.Rngs(0), out_dim=3, axes=('embed', 'mlp', 'state'),
    use_bias=True, names=layers.FC1_FC2,
  )  # fmt: skip
  assert _paths(fc) == {'fc1/kernel', 'fc1/bias', 'fc2/kernel', 'fc2/bias'}
  fc.fc1.bias[...] = _randn(1, 8)
  fc.fc2.bias[...] = _randn(2, 3)
  h = jax.nn.gelu(x @ w(fc.fc1) + fc.fc1.bias[...])
  want = h @ w(fc.fc2) + fc.fc2.bias[...]
  np.testing.assert_allclose(fc(x), want, rtol=1e-5, atol=1e-6)
  assert fc.fc2.kernel.get_metadata()['out_sharding'] == ('mlp', 'state')
  with pytest.raises(ValueError, match='gate layer name'):
    layers.MLP(4, 8, 'swiglu', rngs=nnx.Rngs(0), names=layers.FC1_FC2)
  with pytest.raises(ValueError, match='mlp kind'):
    layers.MLP(4, 8, 'relu', rngs=nnx.Rngs(0))


# ----------------------------------------------------------------------------
# Block.


class _MaskScale(nnx.Module):
  """Mixer u -> u * mask that insists on float32 inputs."""

  def __call__(self, u_BxLxD, mask_BxL=None):
    if u_BxLxD.dtype != jnp.float32:
      raise TypeError(f'mixer got {u_BxLxD.dtype}, wanted float32.')
    if mask_BxL is None:
      return u_BxLxD
    return u_BxLxD * mask_BxL[..., None].astype(u_BxLxD.dtype)


def _block(D=4, cond_dim=0, seed=0):
  dense = lambda r: layers.Dense((D,), (D,), ('embed',), ('embed',), rngs=r)
  mlp = lambda r: layers.MLP(D, 6, 'gelu', rngs=r)
  return layers.Block(D, dense, mlp, rngs=nnx.Rngs(seed), cond_dim=cond_dim)


def _jacobian(fn, x_D):
  return jax.jacobian(lambda v: fn(v[None, None])[0, 0])(x_D)


def test_block_residual_structure_by_gradient():
  D = 4
  block = _block(D)
  x_D = _randn(0, D)
  eye = np.eye(D)
  # Both branches zero: the block is the identity, its Jacobian is I.
  block.mixer.kernel[...] = jnp.zeros((D, D))
  block.mlp.down.kernel[...] = jnp.zeros((6, D))
  np.testing.assert_array_equal(block(x_D[None, None])[0, 0], x_D)
  np.testing.assert_allclose(_jacobian(block, x_D), eye, atol=1e-7)
  # Mixer on, MLP off: J = I + J[mixer(norm1(x))] (pre-norm, skip around).
  block.mixer.kernel[...] = _randn(1, D, D)
  branch = lambda x: block.mixer(block.norm1(x))
  np.testing.assert_allclose(
    _jacobian(block, x_D), eye + _jacobian(branch, x_D), rtol=1e-5, atol=1e-6
  )
  # Both on: out = y + mlp(norm2(y)) with y = x + mixer(norm1(x)).
  block.mlp.down.kernel[...] = _randn(2, 6, D)
  y = lambda x: x + branch(x)
  want = lambda x: y(x) + block.mlp(block.norm2(y(x)))
  np.testing.assert_allclose(
    _jacobian(block, x_D), _jacobian(want, x_D), rtol=1e-5, atol=1e-6
  )


def test_block_adaln_starts_neutral_and_gates_both_branches():
  D = 4
  plain, timed = _block(D), _block(D, cond_dim=1)
  x = _randn(0, 2, 3, D)
  c_Bx1 = jnp.ones((2, 1))
  # Zero-initialised modulation: the same function as the unconditioned
  # block (same seed, same keys for everything but the modulation).
  np.testing.assert_allclose(timed(x, c_Bx1), plain(x), rtol=1e-6, atol=1e-6)
  # gate = -1 on both branches closes them: the block is the identity.
  kernel = np.zeros((1, 6, D), np.float32)
  kernel[0, 2] = kernel[0, 5] = -1.0
  kernel[0, 1] = 0.5  # a scale on branch 1 that the closed gate hides
  timed.modulation.kernel[...] = jnp.asarray(kernel)
  np.testing.assert_array_equal(timed(x, c_Bx1), x)
  with pytest.raises(ValueError, match='time-conditioned'):
    timed(x)


def test_block_passes_the_mask_and_casts_the_mixer_dtype():
  D = 4
  zero_mlp = lambda r: layers.Dense(
    (D,), (D,), ('embed',), ('embed',), rngs=r, init=nnx.initializers.zeros,
    dtype=jnp.bfloat16,
  )  # fmt: skip
  block = layers.Block(
    D, lambda _: _MaskScale(), zero_mlp, rngs=nnx.Rngs(0),
    mixer_dtype=jnp.float32,
  )  # fmt: skip
  x = _randn(0, 2, 5, D).astype(jnp.bfloat16)
  mask = jnp.arange(5)[None] < jnp.array([[2], [5]])
  y = block(x, mask_BxL=mask)
  assert y.dtype == jnp.bfloat16
  want = x + block.norm1(x) * mask[..., None]
  np.testing.assert_allclose(
    y.astype(jnp.float32), want.astype(jnp.float32), rtol=1e-2, atol=1e-2
  )
  # Masked positions see only the skip path.
  np.testing.assert_array_equal(y[0, 2:], x[0, 2:])


def test_block_draws_keys_in_construction_order():
  # norm1, mixer, norm2, mlp: checkpoints depend on this order.
  D = 4
  block = _block(D, seed=3)
  r = nnx.Rngs(3)
  layers.RMSNorm(D, rngs=r)
  mixer = layers.Dense((D,), (D,), ('embed',), ('embed',), rngs=r)
  layers.RMSNorm(D, rngs=r)
  mlp = layers.MLP(D, 6, 'gelu', rngs=r)
  np.testing.assert_array_equal(block.mixer.kernel[...], mixer.kernel[...])
  np.testing.assert_array_equal(block.mlp.up.kernel[...], mlp.up.kernel[...])


def test_every_model_block_is_the_shared_block():
  tcfg = transformer.TransformerConfig(
    vocab_size=5, input_vocab_size=6, width=8, depth=2, num_heads=2,
    time_conditioning=True, cond_dim=4,
  )  # fmt: skip
  hcfg = hybrid.HybridConfig(tcfg, 'AS', 'complex_diag', state_size=4)
  net = hybrid.HybridTransformer(hcfg, rngs=nnx.Rngs(0))
  attn, ssm_layer = net.blocks
  assert isinstance(attn, layers.Block) and isinstance(ssm_layer, layers.Block)
  assert {'attn/qkv/kernel', 'mlp/gate/kernel', 'modulation/kernel'} <= _paths(
    attn
  )
  assert 'mixer/fwd/B_re' in _paths(ssm_layer)
  cfg = sc.ClassifierConfig(5, 3, mixer='pdssm', d_model=8, state_size=4)
  clf = sc.SequenceClassifier(cfg, rngs=nnx.Rngs(0))
  block = clf.blocks[0]
  assert isinstance(block, ssm.SSMBlock) and isinstance(block, layers.Block)
  assert {'mixer/dictionary', 'mlp/fc1/bias', 'mlp/fc2/kernel'} <= _paths(block)


# ----------------------------------------------------------------------------
# Straight-through hardmax.


@pytest.mark.parametrize('axis', [-1, 0])
def test_hardmax_forward_is_one_hot_and_gradient_is_softmax(axis):
  logits = _randn(0, 4, 6)
  w = _randn(1, 4, 6)
  p = hardmax.straight_through_hardmax(logits, axis=axis, temperature=0.5)
  want = jax.nn.one_hot(jnp.argmax(logits, axis), logits.shape[axis], axis=axis)
  np.testing.assert_array_equal(p, want)  # exactly one-hot
  np.testing.assert_array_equal(p.sum(axis), 1.0)
  g_st = jax.grad(
    lambda z: jnp.sum(w * hardmax.straight_through_hardmax(z, axis, 0.5))
  )(logits)
  g_soft = jax.grad(lambda z: jnp.sum(w * jax.nn.softmax(z / 0.5, axis=axis)))(
    logits
  )
  np.testing.assert_allclose(g_st, g_soft, rtol=1e-6, atol=1e-7)
  assert np.abs(g_st).max() > 1e-3  # not trivially zero


def test_column_hardmax_is_the_axis_minus_two_form():
  m = _randn(0, 2, 5, 5)
  np.testing.assert_array_equal(
    hardmax.column_onehot_st(m, 0.7),
    hardmax.straight_through_hardmax(m, axis=-2, temperature=0.7),
  )
  np.testing.assert_array_equal(
    hardmax.column_argmax(m), np.argmax(np.asarray(m), axis=-2)
  )
  np.testing.assert_allclose(
    hardmax.column_softmax(m, 0.7).sum(-2), 1.0, rtol=1e-6
  )
