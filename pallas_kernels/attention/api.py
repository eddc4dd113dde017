"""Public attention entry point with reference, XLA and Pallas paths.

Shapes: q (B, H, L, D), k and v (B, K, S, D) with K dividing H (grouped-query
attention: query head h reads key/value head h // (H // K)). Softmax
statistics accumulate in f32 for every path; rows with no visible key give
zeros.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from pallas_kernels._common import resolve_impl
from pallas_kernels.attention.flash import flash_attention
from pallas_kernels.attention.mask import MaskSpec


def attention(
  q_BxHxLxD: jax.Array,
  k_BxKxSxD: jax.Array,
  v_BxKxSxD: jax.Array,
  *,
  mask: MaskSpec | None = None,
  impl: str = 'auto',
  sm_scale: float | None = None,
) -> jax.Array:
  """Masked multi-head attention; returns out_BxHxLxD in q's dtype.

  Args:
    q_BxHxLxD: queries.
    k_BxKxSxD: keys, K key/value heads with H % K == 0.
    v_BxKxSxD: values.
    mask: a ``MaskSpec`` (default ``MaskSpec.full()``).
    impl: 'auto' (xla on CPU/GPU, pallas on TPU), 'reference' (plain
      softmax with the dense mask, heads repeated), 'xla' (grouped einsum
      with the dense mask), 'pallas' (flash kernel, TPU) or 'interpret' (the
      flash kernel in interpret mode).
    sm_scale: logit scale, default 1 / sqrt(D).
  """
  impl = resolve_impl(impl)
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
  scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
  if impl == 'reference':
    return _reference(q_BxHxLxD, k_BxKxSxD, v_BxKxSxD, mask, scale)
  if impl == 'xla':
    return _xla(q_BxHxLxD, k_BxKxSxD, v_BxKxSxD, mask, scale)
  return _pallas(
    q_BxHxLxD, k_BxKxSxD, v_BxKxSxD, mask, scale, impl == 'interpret'
  )


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
