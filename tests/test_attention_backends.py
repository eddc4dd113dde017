"""Attention backends behind one dispatch: cuDNN, splash, Pallas, XLA.

From a CPU host: the dispatch table and its errors; the mask each splash
encoding means equals ``MaskSpec.dense`` exactly (host NumPy); splash in
interpret mode against the reference; every splash mask kind exported for
TPU (forward and VJP); cuDNN exported for CUDA. cuDNN's tracing asks the
CUDA plugin for the cuDNN version (absent on a CPU jaxlib), so the cuDNN
export test answers that one query with a fixed version; everything after
it (shape and dtype checks, the CUDA lowering rule) is JAX's own.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.models import attention as model_attention
from pallas_kernels import MaskSpec, attention
from pallas_kernels.attention import api, library

L128 = 128


def _masks(B, L, S, rng):
  """Every MaskSpec kind, with and without key padding; L == S == 128."""
  valid = rng.random((B, S)) < 0.7
  valid[0] = False  # Example 0 has no valid key: every row is empty.
  ids = np.sort(rng.integers(0, 3, (B, L)), axis=1).astype(np.int32)
  kv_ids = rng.integers(0, 4, (B, S)).astype(np.int32)
  vis = rng.random((B, 4, 4)) < 0.5
  gids = rng.integers(-1, 5, (B, L)).astype(np.int32)  # -1, 4: out of range.
  out = {
    'full': MaskSpec.full(),
    'causal': MaskSpec.causal(),
    'block_causal': MaskSpec.block_causal(32),
    'prefix_lm': MaskSpec.prefix_lm(40),
    'block_diffusion': MaskSpec.block_diffusion(16, L // 2),
    'segments': MaskSpec.segments(ids),
    'segments_kv': MaskSpec.segments(ids, kv_ids),
    'groups': MaskSpec.groups(gids, vis),
  }
  for name in list(out):
    out[name + '+pad'] = out[name].with_kv_valid(valid)
  return out


def _qkv(rng, B, H, K, L, S, D, dtype=jnp.float32):
  def draw(*shape):
    return jnp.asarray(rng.standard_normal(shape), dtype)

  return draw(B, H, L, D), draw(B, K, S, D), draw(B, K, S, D)


# ---------------------------------------------------------------- dispatch --


def test_impl_names_match_the_model_config():
  assert set(model_attention.ATTENTION_IMPLS) == set(api.IMPLS)
  # The model's build-time kind check agrees with the dispatch.
  for kind in api.MASK_KINDS:
    model_ok = True
    try:
      model_attention.check_attention_impl('cudnn', (kind,))
    except ValueError:
      model_ok = False
    assert model_ok == ('cudnn' in api.supported_impls(kind, 'gpu')), kind


def test_model_attend_passes_the_impl_through():
  rng = np.random.default_rng(5)
  q, k, v = _qkv(rng, 2, 2, 2, 8, 8, 8)
  mask = MaskSpec.prefix_lm(3)
  ref = model_attention.attend(q, k, v, causal=False, impl='reference',
                               mask=mask)  # fmt: skip
  xla = model_attention.attend(q, k, v, causal=False, impl='xla', mask=mask)
  np.testing.assert_allclose(ref, xla, atol=1e-5)
  with pytest.raises(ValueError, match='CUDA GPUs'):
    model_attention.attend(q, k, v, causal=True, impl='cudnn')


LONG = dict(q_shape=(2, 4, 1024, 64), k_shape=(2, 2, 1024, 64))


@pytest.mark.parametrize(
  'platform, kind, dtype, shapes, expected',
  [
    ('cpu', 'causal', 'bfloat16', LONG, 'xla'),
    ('gpu', 'full', 'bfloat16', LONG, 'cudnn'),
    ('gpu', 'causal', 'float16', LONG, 'cudnn'),
    ('gpu', 'causal', 'float32', LONG, 'xla'),  # cuDNN: half precision only
    ('gpu', 'block_diffusion', 'bfloat16', LONG, 'xla'),  # no cuDNN mask
    ('gpu', 'block_causal', 'bfloat16', LONG, 'pallas'),  # measured on H200
    ('gpu', 'causal', 'bfloat16', dict(q_shape=(2, 4, 256, 64),
                                       k_shape=(2, 2, 256, 64)), 'xla'),
    ('tpu', 'block_diffusion', 'float32', LONG, 'splash'),
    ('tpu', 'segments', 'bfloat16', LONG, 'splash'),
    ('tpu', 'groups', 'bfloat16', LONG, 'xla'),  # dense mask either way
    ('tpu', 'causal', 'bfloat16', dict(q_shape=(2, 4, 1000, 64),
                                       k_shape=(2, 2, 1000, 64)), 'xla'),
  ],
)  # fmt: skip
def test_auto_table(platform, kind, dtype, shapes, expected):
  got = api.auto_impl(kind, platform, dtype=dtype, **shapes)
  assert got == expected
  assert got == api.resolve_attention_impl(
    'auto', kind, platform, dtype=dtype, **shapes
  )
  # What auto picks can always run the call.
  assert got in api.supported_impls(kind, platform, dtype=dtype, **shapes)


def test_supported_impls_per_platform():
  assert api.supported_impls('causal', 'cpu') == (
    'reference',
    'xla',
    'interpret',
  )
  gpu = api.supported_impls('causal', 'cuda', dtype='bfloat16', **LONG)
  assert gpu == ('reference', 'xla', 'cudnn', 'pallas', 'interpret')
  assert 'cudnn' not in api.supported_impls('block_causal', 'gpu')
  assert 'cudnn' not in api.supported_impls('causal', 'gpu', dtype='float32')
  tpu = api.supported_impls('groups', 'tpu', **LONG)
  assert tpu == ('reference', 'xla', 'splash', 'pallas', 'interpret')
  odd = dict(q_shape=(1, 1, 100, 64), k_shape=(1, 1, 100, 64))
  assert 'splash' not in api.supported_impls('causal', 'tpu', **odd)


def test_bad_backend_names_those_that_can():
  q = jnp.zeros((1, 2, 128, 64), jnp.bfloat16)
  bc = MaskSpec.block_causal(16)
  with pytest.raises(ValueError, match=r"cudnn.*no 'block_causal'.*'xla'"):
    attention(q, q, q, mask=bc, impl='cudnn', platform='gpu')
  with pytest.raises(ValueError, match=r"splash.*TPU.*can: .*'cudnn'"):
    attention(q, q, q, mask=MaskSpec.causal(), impl='splash', platform='gpu')
  with pytest.raises(ValueError, match='float16/bfloat16'):
    q32 = q.astype(jnp.float32)
    attention(q32, q32, q32, impl='cudnn', platform='gpu')
  with pytest.raises(ValueError, match='multiples of 128'):
    q100 = jnp.zeros((1, 2, 100, 64))
    attention(q100, q100, q100, impl='splash', platform='tpu')
  with pytest.raises(ValueError, match="on CPU use 'interpret'"):
    attention(q, q, q, impl='pallas', platform='cpu')
  with pytest.raises(ValueError, match='CUDA GPUs'):
    attention(q, q, q, impl='cudnn')  # This host is a CPU.
  with pytest.raises(ValueError, match='platform'):
    attention(q, q, q, impl='xla', platform='ipu')


def test_model_config_check_rejects_cudnn_block_diffusion():
  model_attention.check_attention_impl('cudnn', ('full', 'causal'))
  model_attention.check_attention_impl('splash', ('block_diffusion',))
  with pytest.raises(ValueError, match=r"no 'block_diffusion'.*'splash'"):
    model_attention.check_attention_impl('cudnn', ('block_diffusion', 'full'))
  with pytest.raises(ValueError, match='choose one of'):
    model_attention.check_attention_impl('flash')


# ------------------------------------------------------------ splash masks --


def test_splash_masks_encode_the_maskspec_exactly():
  rng = np.random.default_rng(0)
  B, L, S = 2, L128, L128
  for name, mask in _masks(B, L, S, rng).items():
    got = library.splash_dense_mask(mask, B, L, S)
    want = np.asarray(mask.dense(B, L, S))
    np.testing.assert_array_equal(got, want, err_msg=name)
  # Block-causal with more keys than queries (L != S).
  mask = MaskSpec.block_causal(48)
  got = library.splash_dense_mask(mask, 1, 128, 384)
  np.testing.assert_array_equal(got, np.asarray(mask.dense(1, 128, 384)))


def test_rule_mask_is_the_same_in_kernel_arithmetic():
  # The kernel calls the rule on int32 arrays (lax.div, jnp.where); splash
  # classifies tiles with the same rule on NumPy. Both must agree.
  spec = MaskSpec.block_diffusion(8, 64)
  rule = library.StaticRule.of(spec)
  q, k = np.meshgrid(np.arange(128), np.arange(128), indexing='ij')
  on_host = rule(q, k)
  in_jax = jax.jit(rule)(jnp.asarray(q, jnp.int32), jnp.asarray(k, jnp.int32))
  np.testing.assert_array_equal(on_host, np.asarray(in_jax))
  mask = library.RuleMask((128, 128), rule)
  np.testing.assert_array_equal(mask[16:48, 64:128], on_host[16:48, 64:128])
  assert hash(mask) == hash(library.RuleMask((128, 128), rule))


def _splash_check(name, grads):
  rng = np.random.default_rng(1)
  B, H, K, L, D = 2, 2, 1, L128, 32
  mask = _masks(B, L, L, rng)[name]
  q, k, v = _qkv(rng, B, H, K, L, L, D)

  def loss(impl, q, k, v):
    if impl == 'splash':
      o = library.splash_attention(q, k, v, mask, 0.3, interpret=True)
    else:
      o = attention(q, k, v, mask=mask, impl='reference', sm_scale=0.3)
    return jnp.sum(o * jnp.cos(o)), o

  if not grads:
    o = jax.jit(lambda *a: loss('splash', *a)[1])(q, k, v)
    np.testing.assert_allclose(o, loss('ref', q, k, v)[1], atol=1e-5)
    return
  vg = lambda impl: jax.value_and_grad(
    lambda *a: loss(impl, *a), argnums=(0, 1, 2), has_aux=True
  )
  (_, o), g = jax.jit(vg('splash'))(q, k, v)
  (_, o_ref), g_ref = vg('ref')(q, k, v)
  np.testing.assert_allclose(o, o_ref, atol=1e-5)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_splash_interpret_block_diffusion_with_padding():
  # In-kernel rule + segment ids for padding + zeroed empty rows (example 0).
  _splash_check('block_diffusion+pad', grads=False)


@pytest.mark.slow
@pytest.mark.parametrize(
  'name', ['causal+pad', 'prefix_lm', 'segments_kv+pad', 'groups+pad']
)
def test_splash_interpret_matches_reference(name):
  _splash_check(name, grads=True)


# ---------------------------------------------------------------- lowering --

SPLASH_CASES = [
  'full',
  'full+pad',
  'causal',
  'block_causal',
  'prefix_lm',
  'block_diffusion',
  'segments+pad',
  'groups',
]


def _fwd_and_vjp(impl, mask, platform):
  def f(q, k, v):
    fn = lambda q, k, v: attention(
      q, k, v, mask=mask, impl=impl, platform=platform
    )
    o, vjp = jax.vjp(fn, q, k, v)
    return o, vjp(jnp.ones_like(o))

  return jax.jit(f)


@pytest.mark.parametrize('name', SPLASH_CASES)
def test_splash_exports_for_tpu(name):
  rng = np.random.default_rng(2)
  B, H, K, L, D = 2, 4, 2, 256, 64
  mask = _masks(B, L, L, rng)[name]
  q = jax.ShapeDtypeStruct((B, H, L, D), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((B, K, L, D), jnp.bfloat16)
  exp = jax.export.export(
    _fwd_and_vjp('splash', mask, 'tpu'), platforms=['tpu']
  )(q, kv, kv)
  # Forward, dQ and dK/dV kernels.
  assert exp.mlir_module().count('tpu_custom_call') == 3


@pytest.fixture
def cudnn_version(monkeypatch):
  """Answers the cuDNN version query of a CPU jaxlib (see the docstring)."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fa
  except ImportError:
    pytest.skip('this JAX has no cuDNN attention module to export from CPU')
  if not hasattr(fa, 'check_cudnn_version'):
    pytest.skip('this JAX asks for the cuDNN version differently')
  monkeypatch.setattr(fa, 'check_cudnn_version', lambda: 90800)
  return [
    jax.export.DisabledSafetyCheck.custom_call(t)
    for t in ('__cudnn$fmhaSoftmax', '__cudnn$fmhaSoftmaxBackward')
  ]


@pytest.mark.parametrize('name', ['full', 'causal', 'causal+pad'])
def test_cudnn_exports_for_cuda(name, cudnn_version):
  rng = np.random.default_rng(3)
  B, H, K, L, D = 2, 4, 2, 128, 64
  mask = _masks(B, L, L, rng)[name]
  q = jax.ShapeDtypeStruct((B, H, L, D), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((B, K, L, D), jnp.bfloat16)
  exp = jax.export.export(
    _fwd_and_vjp('cudnn', mask, 'gpu'),
    platforms=['cuda'],
    disabled_checks=cudnn_version,
  )(q, kv, kv)
  text = exp.mlir_module()
  assert '__cudnn$fmhaSoftmax' in text
  assert '__cudnn$fmhaSoftmaxBackward' in text
  if name == 'causal+pad':
    assert 'PADDING_CAUSAL' in text


def test_cudnn_fallback_for_non_prefix_padding():
  # Padding that is not a prefix runs the dense branch; it must match the
  # reference, empty rows included (example 0 has no valid key).
  rng = np.random.default_rng(4)
  B, H, K, L, D = 2, 4, 2, 16, 8
  valid = rng.random((B, L)) < 0.6
  valid[0] = False
  mask = MaskSpec.causal().with_kv_valid(valid)
  q, k, v = _qkv(rng, B, H, K, L, L, D)
  swap = lambda x: jnp.swapaxes(x, 1, 2)
  fallback = jax.jit(library._dense_fallback, static_argnums=4)
  got = swap(fallback(swap(q), swap(k), swap(v), mask, 0.3))
  want = attention(q, k, v, mask=mask, impl='reference', sm_scale=0.3)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert float(jnp.abs(got[0]).max()) == 0.0
