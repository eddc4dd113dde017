"""Public attention entry point: one dispatch over every backend.

Shapes: q (B, H, L, D), k and v (B, K, S, D) with K dividing H (grouped-query
attention: query head h reads key/value head h // (H // K)). Softmax
statistics accumulate in f32 for every path; rows with no visible key give
zeros.

Backends (``impl``):

- 'reference': plain softmax with the dense mask, heads repeated (tests).
- 'xla': grouped einsum with the dense mask; every platform and mask.
- 'cudnn': cuDNN flash attention (``library.cudnn_attention``), CUDA GPUs,
  float16/bfloat16, full or causal masks with optional key padding.
- 'splash': splash attention (``library.splash_attention``), TPU, every
  mask kind, lengths that are multiples of 128.
- 'pallas': this suite's flash kernels, every mask kind, tiles the mask
  rules out skipped (the block-sparse kinds no library kernel covers):
  ``flash.py`` through Mosaic when lowered for TPU, ``flash_gpu.py``
  through Triton when lowered for CUDA (chosen at lowering time, so it
  exports from a CPU host).
- 'interpret': the TPU flash kernel in interpret mode (any platform).
- 'auto': ``auto_impl``, a small table below.

``supported_impls`` names what can run a call; asking for one that cannot
raises a ValueError naming why and the impls that can, before any compute.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from pallas_kernels.attention import library
from pallas_kernels.attention.flash import flash_attention
from pallas_kernels.attention.flash_gpu import flash_attention_compiled
from pallas_kernels.attention.mask import MaskSpec

IMPLS = ('auto', 'reference', 'xla', 'cudnn', 'splash', 'pallas', 'interpret')
PLATFORMS = ('cpu', 'gpu', 'tpu')
_PLATFORM_ALIASES = {'cuda': 'gpu'}
MASK_KINDS = library.SPLASH_KINDS  # Every kind MaskSpec has.

# 'auto': (platform, mask kind) -> the library kernel to use when it can run
# the call and the key length is at least AUTO_MIN_KV_LEN; everything else
# runs 'xla'. Flash kernels beat XLA's dense softmax on long sequences, where
# XLA writes the (L, S) score matrix to HBM and they keep it on chip. On GPU
# the table follows the device check of 2026-12-04 (one H200, jax 0.11.2,
# bf16 forward + backward, 16k tokens per call): cuDNN 2.6-5.8x faster than
# 'xla' on full masks at L = 1k-4k; the suite's Pallas kernel 2.3-7.3x
# faster than 'xla' on block-causal masks at L = 1k-16k, which cuDNN cannot
# express. The other Pallas mask kinds were not timed on a GPU and stay on
# 'xla'. Groups on TPU stay on XLA (splash needs their dense mask in HBM as
# well); TPU rows are not measured yet.
AUTO_MIN_KV_LEN = 512
AUTO_TABLE = {
  ('gpu', 'full'): 'cudnn',
  ('gpu', 'causal'): 'cudnn',
  ('gpu', 'block_causal'): 'pallas',
  ('tpu', 'full'): 'splash',
  ('tpu', 'causal'): 'splash',
  ('tpu', 'block_causal'): 'splash',
  ('tpu', 'prefix_lm'): 'splash',
  ('tpu', 'block_diffusion'): 'splash',
  ('tpu', 'segments'): 'splash',
}


def normalize_platform(platform: str | None) -> str:
  """'cpu', 'gpu' or 'tpu'; None means the default backend."""
  if platform is None:
    platform = jax.default_backend()
  platform = _PLATFORM_ALIASES.get(platform, platform)
  if platform not in PLATFORMS:
    raise ValueError(
      f'platform must be one of {PLATFORMS} (or cuda), got {platform!r}.'
    )
  return platform


def _as_mask(mask: MaskSpec | str | None) -> MaskSpec:
  if mask is None:
    return MaskSpec.full()
  if isinstance(mask, str):
    if mask not in MASK_KINDS:
      raise ValueError(f'mask kind must be one of {MASK_KINDS}, got {mask!r}.')
    return MaskSpec(mask)
  if not isinstance(mask, MaskSpec):
    raise TypeError(
      f'mask must be a MaskSpec (e.g. MaskSpec.causal()), got {type(mask)}.'
    )
  return mask


def unsupported_reason(
  impl: str,
  mask: MaskSpec | str | None,
  platform: str | None = None,
  *,
  q_shape=None,
  k_shape=None,
  dtype=None,
) -> str | None:
  """Why ``impl`` cannot run this call on ``platform``; None if it can.

  Shapes and dtype are optional: without them only the platform and the
  mask kind are checked.
  """
  if impl not in IMPLS or impl == 'auto':
    raise ValueError(f'impl must be one of {IMPLS[1:]}, got {impl!r}.')
  mask, platform = _as_mask(mask), normalize_platform(platform)
  if impl in ('reference', 'xla', 'interpret'):
    return None
  if impl == 'cudnn':
    if platform != 'gpu':
      return f'cuDNN attention runs on CUDA GPUs, not on {platform}'
    return library.cudnn_unsupported(mask, q_shape, k_shape, dtype)
  if impl == 'splash':
    if platform != 'tpu':
      return f'splash attention is a TPU (Mosaic) kernel, not for {platform}'
    return library.splash_unsupported(mask, q_shape, k_shape, dtype)
  # impl == 'pallas'
  if platform == 'cpu':
    return (
      "impl='pallas' compiles the flash kernel for TPU (Mosaic) or GPU "
      "(Triton); on CPU use 'interpret'"
    )
  return None


def supported_impls(
  mask: MaskSpec | str | None,
  platform: str | None = None,
  *,
  q_shape=None,
  k_shape=None,
  dtype=None,
) -> tuple[str, ...]:
  """The concrete impls that can run this mask (and shapes) on platform."""
  return tuple(
    impl
    for impl in IMPLS[1:]
    if unsupported_reason(
      impl, mask, platform, q_shape=q_shape, k_shape=k_shape, dtype=dtype
    )
    is None
  )


def auto_impl(
  mask: MaskSpec | str | None,
  platform: str | None = None,
  *,
  q_shape=None,
  k_shape=None,
  dtype=None,
) -> str:
  """What impl='auto' runs: AUTO_TABLE's kernel if it can run, else xla."""
  mask, platform = _as_mask(mask), normalize_platform(platform)
  choice = AUTO_TABLE.get((platform, mask.kind), 'xla')
  if choice == 'xla':
    return choice
  if k_shape is not None and k_shape[-2] < AUTO_MIN_KV_LEN:
    return 'xla'
  why = unsupported_reason(
    choice, mask, platform, q_shape=q_shape, k_shape=k_shape, dtype=dtype
  )
  return 'xla' if why else choice


def resolve_attention_impl(
  impl: str,
  mask: MaskSpec | str | None,
  platform: str | None = None,
  *,
  q_shape=None,
  k_shape=None,
  dtype=None,
) -> str:
  """A concrete impl for the call, or a ValueError naming those that can."""
  if impl not in IMPLS:
    raise ValueError(f'impl must be one of {IMPLS}, got {impl!r}.')
  kw = dict(q_shape=q_shape, k_shape=k_shape, dtype=dtype)
  if impl == 'auto':
    return auto_impl(mask, platform, **kw)
  why = unsupported_reason(impl, mask, platform, **kw)
  if why:
    mask, platform = _as_mask(mask), normalize_platform(platform)
    can = supported_impls(mask, platform, **kw)
    raise ValueError(
      f'impl={impl!r} cannot run a {mask.kind!r} mask on {platform}: {why}. '
      f'Impls that can: {can} (or auto).'
    )
  return impl


def attention(
  q_BxHxLxD: jax.Array,
  k_BxKxSxD: jax.Array,
  v_BxKxSxD: jax.Array,
  *,
  mask: MaskSpec | None = None,
  impl: str = 'auto',
  sm_scale: float | None = None,
  platform: str | None = None,
) -> jax.Array:
  """Masked multi-head attention; returns out_BxHxLxD in q's dtype.

  Args:
    q_BxHxLxD: queries.
    k_BxKxSxD: keys, K key/value heads with H % K == 0.
    v_BxKxSxD: values.
    mask: a ``MaskSpec`` (default ``MaskSpec.full()``).
    impl: one of IMPLS (see the module docstring); 'auto' picks from
      AUTO_TABLE.
    sm_scale: logit scale, default 1 / sqrt(D).
    platform: the platform the call is compiled for, checked before any
      compute (default: the default backend). Set it to export for another
      platform, e.g. 'tpu'. On a CPU host without it, 'pallas' and 'splash'
      are not rejected (the host may be exporting for an accelerator): they
      lower for TPU ('pallas' also for CUDA) and fail at CPU lowering.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl must be one of {IMPLS}, got {impl!r}.')
  mask = MaskSpec.full() if mask is None else mask
  if not isinstance(mask, MaskSpec):
    raise TypeError(
      f'mask must be a MaskSpec (e.g. MaskSpec.causal()), got {type(mask)}.'
    )
  shapes = [
    getattr(x, 'shape', None) for x in (q_BxHxLxD, k_BxKxSxD, v_BxKxSxD)
  ]
  if any(s is None or len(s) != 4 for s in shapes):
    raise ValueError(
      'q, k and v must have shapes (B, H, L, D), (B, K, S, D), (B, K, S, D); '
      f'got {shapes}.'
    )
  (B, H, L, D), (Bk, K, S, Dk) = shapes[0], shapes[1]
  if shapes[2] != shapes[1] or Bk != B or Dk != D:
    raise ValueError(
      f'k and v must both have shape (B={B}, K, S, D={D}); got {shapes[1]} '
      f'and {shapes[2]}.'
    )
  if H % K:
    raise ValueError(f'key/value heads K={K} must divide query heads H={H}.')
  for name, x in zip('qkv', (q_BxHxLxD, k_BxKxSxD, v_BxKxSxD)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f'{name} must be a floating array, got {x.dtype}.')
  mask.validate(B, L, S)
  host_cpu = platform is None and jax.default_backend() == 'cpu'
  platform = normalize_platform(platform)
  check_on = 'tpu' if host_cpu and impl in ('pallas', 'splash') else platform
  impl = resolve_attention_impl(
    impl,
    mask,
    check_on,
    q_shape=shapes[0],
    k_shape=shapes[1],
    dtype=jnp.result_type(q_BxHxLxD, k_BxKxSxD, v_BxKxSxD),
  )
  scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
  args = (q_BxHxLxD, k_BxKxSxD, v_BxKxSxD, mask, scale)
  if impl == 'reference':
    return _reference(*args)
  if impl == 'xla':
    return _xla(*args)
  if impl == 'cudnn':
    return _cudnn(*args)
  if impl == 'splash':
    return _splash(*args)
  if impl == 'pallas':
    return _pallas_compiled(*args)
  return _pallas(*args, True)


def _masked_softmax(s, m):
  """Softmax over the last axis in f32; rows with no True give zeros."""
  s = jnp.where(m, s.astype(jnp.float32), -jnp.inf)
  mx = jnp.max(s, axis=-1, keepdims=True)
  mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
  p = jnp.where(m, jnp.exp(s - mx), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  return p / jnp.where(denom > 0, denom, 1.0)


@functools.partial(jax.jit, static_argnums=(4,))
def _reference(q, k, v, mask, scale):
  B, H, L, _ = q.shape
  K, S = k.shape[1], k.shape[2]
  k = jnp.repeat(k, H // K, axis=1).astype(jnp.float32)
  v = jnp.repeat(v, H // K, axis=1).astype(jnp.float32)
  s = jnp.einsum('bhld,bhsd->bhls', q.astype(jnp.float32), k) * scale
  p = _masked_softmax(s, mask.dense(B, L, S)[:, None])
  return jnp.einsum('bhls,bhsd->bhld', p, v).astype(q.dtype)


@functools.partial(jax.jit, static_argnums=(4,))
def _xla(q, k, v, mask, scale):
  B, H, L, D = q.shape
  K, S = k.shape[1], k.shape[2]
  qg = q.reshape(B, K, H // K, L, D)
  s = jnp.einsum('bkgld,bksd->bkgls', qg, k, preferred_element_type=jnp.float32)
  p = _masked_softmax(s * scale, mask.dense(B, L, S)[:, None, None])
  o = jnp.einsum(
    'bkgls,bksd->bkgld',
    p.astype(v.dtype),
    v,
    preferred_element_type=jnp.float32,
  )
  return o.reshape(B, H, L, D).astype(q.dtype)


@functools.partial(jax.jit, static_argnums=(4, 5))
def _pallas(q, k, v, mask, scale, interpret):
  return flash_attention(q, k, v, mask, scale, interpret=interpret)


@functools.partial(jax.jit, static_argnums=(4,))
def _cudnn(q, k, v, mask, scale):
  return library.cudnn_attention(q, k, v, mask, scale)


@functools.partial(jax.jit, static_argnums=(4,))
def _splash(q, k, v, mask, scale):
  return library.splash_attention(q, k, v, mask, scale)


@functools.partial(jax.jit, static_argnums=(4,))
def _pallas_compiled(q, k, v, mask, scale):
  # Mosaic when lowered for TPU, Triton (flash_gpu) when lowered for CUDA.
  return flash_attention_compiled(q, k, v, mask, sm_scale=scale)
