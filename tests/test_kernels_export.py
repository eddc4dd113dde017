"""The Pallas kernels lower for every platform they claim, checked from CPU.

``jax.export`` with ``platforms=['cuda']`` or ``['tpu']`` runs the whole
lowering (Triton or Mosaic) on this CPU-only host; a failure to lower fails
the test. For CUDA each Triton module carried by the export is parsed back
and run through the MLIR verifier (Triton's own shape rules, e.g. power-of-
two tensors), which the lowering alone does not do; PTX compilation is left
to a GPU. The GPU attention kernel's numerics are checked in interpret mode
against the reference twin, forward and gradients.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import MaskSpec, _common, attention, linear_scan, pd_scan
from pallas_kernels.attention.flash import flash_attention
from pallas_kernels.attention.flash_gpu import (
  flash_attention_compiled,
  flash_attention_gpu,
)

TRITON = '__gpu$xla.gpu.triton'
MOSAIC = 'tpu_custom_call'
MASK_KINDS = (
  'full',
  'padding',
  'causal',
  'block_causal',
  'prefix_lm',
  'block_diffusion',
  'segments',
  'groups',
  'causal_padding',
)
# Kinds exported in the fast run; the others are marked slow.
FAST_GPU_KINDS = ('causal_padding', 'block_diffusion', 'groups', 'segments')
FAST_TPU_KINDS = ('block_diffusion', 'prefix_lm')


def _gpu_target():
  """Names an abstract GPU so Triton lowering needs no local device (jax
  0.12 asks for one; 0.10 accepts it)."""
  dev = jax.sharding.AbstractDevice(
    device_kind='NVIDIA H100', num_cores=132, platform='gpu'
  )
  mesh = jax.sharding.AbstractMesh((1,), ('x',), abstract_device=dev)
  return jax.sharding.use_abstract_mesh(mesh)


def _triton_modules(exported):
  """Parses the Triton module of every Triton custom call and verifies it."""
  from jax._src.interpreters import mlir
  from jax._src.lib.mlir import ir
  from jax._src.pallas.triton import lowering as triton_lowering

  calls = []

  def walk(op):
    for region in op.regions:
      for block in region.blocks:
        for inner in block.operations:
          attrs = inner.operation.attributes
          if (
            inner.operation.name == 'stablehlo.custom_call'
            and ir.StringAttr(attrs['call_target_name']).value == TRITON
          ):
            calls.append(attrs['mhlo.backend_config'])
          walk(inner.operation)

  names = []
  with mlir.make_ir_context():
    walk(ir.Module.parse(exported.mlir_module()).operation)
    for config in calls:
      blob = ir.StringAttr(config['ir']).value_bytes
      with triton_lowering._new_ir_context():
        module = ir.Module.parse(blob)
        assert module.operation.verify()
        names.append(ir.StringAttr(module.operation.attributes['sym_name']))
  return [n.value for n in names]


def _export(fn, args, platform):
  """Exports jit(fn) for one platform; returns (module text, kernel names)."""
  if platform == 'cuda':
    ctx = _gpu_target()
    checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON)]
  else:
    ctx, checks = contextlib.nullcontext(), []
  with ctx:
    exp = jax.export.export(
      jax.jit(fn), platforms=[platform], disabled_checks=checks
    )(*args)
  text = exp.mlir_module()
  names = _triton_modules(exp) if platform == 'cuda' else []
  return text, names


def _value_and_grad(fn, argnums):
  loss = lambda *a: sum(
    jnp.sum(jnp.abs(x).astype(jnp.float32)) for x in jax.tree.leaves(fn(*a))
  )
  return jax.value_and_grad(loss, argnums=argnums)


# -------------------------------------------------------------------- scans --


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.complex64])
@pytest.mark.parametrize('kernel', ['linear', 'pd'])
def test_scans_export_forward_and_vjp(kernel, dtype, platform):
  # Odd sizes: GPU pads lanes to powers of two, TPU takes whole dims.
  B, L, N = 2, 37, 20
  sds = jax.ShapeDtypeStruct((B, L, N), dtype)
  h0 = jax.ShapeDtypeStruct((B, N), dtype)
  p = jnp.zeros((B, L, N), jnp.int32)
  if kernel == 'linear':
    fn = lambda a, b, h0: linear_scan(a, b, h0_BxN=h0, impl='pallas')
  else:
    fn = lambda d, b, h0: pd_scan(
      p, d, b, h0_BxN=h0, reverse=True, impl='pallas'
    )
  text, names = _export(
    _value_and_grad(fn, (0, 1, 2)), (sds, sds, h0), platform
  )
  # Forward kernel plus the backward (reverse / transposed) kernel, and only
  # the kernels of the platform asked for.
  if platform == 'cuda':
    assert text.count(MOSAIC) == 0
    stem = 'linear_scan' if kernel == 'linear' else 'pd_scan'
    assert len(names) == 2 and all(n.startswith(stem) for n in names), names
  else:
    assert text.count(MOSAIC) == 2 and text.count(TRITON) == 0


# ---------------------------------------------------------------- attention --


def _mask(kind, B, L, seed=0):
  rng = np.random.default_rng(seed)
  valid = rng.random((B, L)) < 0.7
  valid[:, 0] = True
  valid = jnp.asarray(valid)
  if kind == 'full':
    return MaskSpec.full()
  if kind == 'padding':
    return MaskSpec.full(valid)
  if kind == 'causal':
    return MaskSpec.causal()
  if kind == 'block_causal':
    return MaskSpec.block_causal(8)
  if kind == 'prefix_lm':
    return MaskSpec.prefix_lm(L // 3)
  if kind == 'block_diffusion':
    return MaskSpec.block_diffusion(4, L // 2)
  if kind == 'segments':
    ids = np.sort(rng.integers(0, 3, (B, L)), axis=1)
    return MaskSpec.segments(jnp.asarray(ids))
  if kind == 'groups':
    G = 3
    vis = rng.random((B, G, G)) < 0.5
    ids = rng.integers(0, G, (B, L))
    return MaskSpec.groups(jnp.asarray(ids), jnp.asarray(vis)).with_kv_valid(
      valid
    )
  return MaskSpec.causal().with_kv_valid(valid)


def _kinds(fast):
  return [
    k if k in fast else pytest.param(k, marks=pytest.mark.slow)
    for k in MASK_KINDS
  ]


def _attn_args(dtype=jnp.bfloat16):
  # L = 200 pads to whole tiles, D = 48 pads to 64 lanes on GPU.
  B, H, K, L, D = 2, 4, 2, 200, 48
  q = jax.ShapeDtypeStruct((B, H, L, D), dtype)
  kv = jax.ShapeDtypeStruct((B, K, L, D), dtype)
  return B, L, q, kv


@pytest.mark.parametrize('kind', _kinds(FAST_GPU_KINDS))
def test_flash_gpu_exports_for_cuda(kind):
  B, L, q, kv = _attn_args()
  mask = _mask(kind, B, L)
  fn = lambda q, k, v, m: flash_attention_gpu(q, k, v, m, sm_scale=0.125)
  text, names = _export(
    _value_and_grad(fn, (0, 1, 2)), (q, kv, kv, mask), 'cuda'
  )
  assert sorted(names) == ['flash_dkv_gpu', 'flash_dq_gpu', 'flash_fwd_gpu']
  assert text.count(MOSAIC) == 0


@pytest.mark.parametrize('kind', _kinds(FAST_TPU_KINDS))
def test_flash_tpu_exports_for_tpu(kind):
  B, L, q, kv = _attn_args()
  mask = _mask(kind, B, L)
  fn = lambda q, k, v, m: flash_attention(q, k, v, m, 0.125, interpret=False)
  text, _ = _export(_value_and_grad(fn, (0, 1, 2)), (q, kv, kv, mask), 'tpu')
  # Forward, dK/dV and dQ kernels.
  assert text.count(MOSAIC) == 3


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
def test_compiled_dispatch_lowers_the_platforms_kernel(platform):
  # One entry point, chosen at lowering time: Mosaic for TPU, Triton for
  # CUDA, and never the other platform's kernel.
  B, L, q, kv = _attn_args()
  fn = lambda q, k, v, m: flash_attention_compiled(q, k, v, m, sm_scale=0.1)
  args = (q, kv, kv, _mask('causal', B, L))
  text, names = _export(_value_and_grad(fn, (0, 1, 2)), args, platform)
  if platform == 'cuda':
    assert len(names) == 3 and text.count(MOSAIC) == 0
  else:
    assert text.count(MOSAIC) == 3 and text.count(TRITON) == 0


def test_gpu_tiles_are_powers_of_two_sized_for_shared_memory():
  from pallas_kernels.attention.flash_gpu import gpu_block_sizes

  # Short axes get the smallest power of two >= 16 that covers them.
  assert gpu_block_sizes(20, 5, None, None) == (32, 16)
  assert gpu_block_sizes(1000, 1000, None, None, 128 * 2) == (64, 64)
  # f32 rows of 128 lanes (512 B): the key tile halves.
  assert gpu_block_sizes(1000, 1000, None, None, 128 * 4) == (64, 32)
  assert gpu_block_sizes(1000, 40, 128, 16) == (128, 16)


def test_gpu_kernel_rejects_bad_blocks_and_heads():
  x = jnp.zeros((1, 1, 8, 16))
  with pytest.raises(ValueError, match='power of two'):
    flash_attention_gpu(x, x, x, MaskSpec.causal(), sm_scale=1.0, block_q=24)
  with pytest.raises(ValueError, match='divide'):
    y = jnp.zeros((1, 3, 8, 16))
    flash_attention_gpu(y, x[:, :1].repeat(2, 1), x[:, :1].repeat(2, 1),
                        MaskSpec.causal(), sm_scale=1.0)  # fmt: skip


# ------------------------------------------------- GPU kernel numerics (CPU) --


def _loss(fn, q, k, v):
  o = fn(q, k, v).astype(jnp.float32)
  w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
  return jnp.sum(o * w)


@jax.jit
def _gpu_vs_reference(q, k, v, mask):
  """(out, grads) of the GPU kernel in interpret mode and of the reference."""
  got = lambda q, k, v: flash_attention_gpu(
    q, k, v, mask, sm_scale=0.3, interpret=True, block_q=16, block_k=16
  )
  ref = lambda q, k, v: attention(
    q, k, v, mask=mask, impl='reference', sm_scale=0.3
  )
  return [
    (fn(q, k, v), jax.grad(_loss, argnums=(1, 2, 3))(fn, q, k, v))
    for fn in (got, ref)
  ]


def _qkv(B, H, K, L, D, seed=0):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  return f(B, H, L, D), f(B, K, L, D), f(B, K, L, D)


@pytest.mark.parametrize('kind', _kinds(('groups', 'block_diffusion')))
def test_gpu_kernel_matches_reference_interpret(kind):
  # L = 40 with 16-blocks: 3 x 3 tiles (the last one padded), so EMPTY,
  # PARTIAL and FULL tiles all occur; D = 24 pads to 32; GQA with H / K = 2.
  B, H, K, L, D = 2, 4, 2, 40, 24
  q, k, v = _qkv(B, H, K, L, D)
  mask = _mask(kind, B, L)
  (out, g), (out_ref, g_ref) = _gpu_vs_reference(q, k, v, mask)
  # f32 throughout; online softmax vs one-shot softmax differ by rounding.
  np.testing.assert_allclose(out, out_ref, atol=1e-5)
  for x, y in zip(g, g_ref):
    np.testing.assert_allclose(x, y, atol=1e-5)
  if kind == 'groups':
    # Rows that see no key: zeros, and no gradient flows through them.
    dense = np.asarray(mask.dense(B, L, L))
    blind = ~dense.any(-1)
    assert blind.any() and not blind.all()
    assert np.all(
      np.asarray(out)[np.nonzero(blind)[0], :, np.nonzero(blind)[1]] == 0
    )


# ------------------------------------------------------------- impl choice --


def test_resolve_impl_follows_the_platform_table(monkeypatch):
  for backend, auto in (('cpu', 'xla'), ('gpu', 'xla'), ('tpu', 'pallas')):
    monkeypatch.setattr(jax, 'default_backend', lambda b=backend: b)
    for kernel in _common.KERNELS:
      # The scans run sequentially on CPU (measured faster there).
      scan_on_cpu = backend == 'cpu' and kernel != 'attention'
      expected = 'reference' if scan_on_cpu else auto
      assert _common.resolve_impl('auto', kernel) == expected
      # Every kernel claims GPU and TPU, so 'pallas' is kept on both.
      assert _common.resolve_impl('pallas', kernel) == 'pallas'
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  monkeypatch.setitem(_common.PALLAS_PLATFORMS, 'pd_scan', ('tpu',))
  with pytest.raises(NotImplementedError, match='no GPU kernel'):
    _common.resolve_impl('pallas', 'pd_scan')
  with pytest.raises(ValueError, match='kernel must be one of'):
    _common.resolve_impl('auto', 'conv')


def test_compiler_params_per_platform():
  from jax.experimental.pallas import tpu as pltpu
  from jax.experimental.pallas import triton as pltriton

  tpu = _common.compiler_params('tpu', dimension_semantics=('parallel',))
  assert isinstance(tpu, pltpu.CompilerParams)
  gpu = _common.compiler_params('cuda', num_warps=8, num_stages=3)
  assert isinstance(gpu, pltriton.CompilerParams)
  assert (gpu.num_warps, gpu.num_stages) == (8, 3)
  assert _common.compiler_params('interpret') is None
  with pytest.raises(ValueError, match='platform must be'):
    _common.compiler_params('metal')


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs a GPU')
def test_compiled_gpu_kernel_matches_reference():
  B, H, K, L, D = 2, 4, 2, 300, 64
  q, k, v = _qkv(B, H, K, L, D)
  for kind in MASK_KINDS:
    mask = _mask(kind, B, L)
    for fn in (
      lambda q, k, v, m=mask: flash_attention_gpu(q, k, v, m, sm_scale=0.125),
      lambda q, k, v, m=mask: flash_attention_compiled(
        q, k, v, m, sm_scale=0.125
      ),
    ):
      ref = lambda q, k, v, m=mask: attention(
        q, k, v, mask=m, impl='reference', sm_scale=0.125
      )
      # tl.dot may use TF32 for f32 inputs: tolerances for 10-bit mantissas.
      np.testing.assert_allclose(fn(q, k, v), ref(q, k, v), atol=2e-2)
      g = jax.grad(_loss, argnums=(1, 2, 3))(fn, q, k, v)
      g_ref = jax.grad(_loss, argnums=(1, 2, 3))(ref, q, k, v)
      for x, y in zip(g, g_ref):
        np.testing.assert_allclose(x, y, atol=5e-2)
