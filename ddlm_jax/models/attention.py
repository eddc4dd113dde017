"""Multi-head attention with rotary positions and one dispatch point.

`attend` is the only place that computes softmax attention. impl='xla' uses
XLA; 'pallas', 'interpret' and 'auto' go through `pallas_kernels.attention`
(flash attention with masks described per tile).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.models.layers import Dense

ATTENTION_IMPLS = ('xla', 'auto', 'pallas', 'interpret')


def rotary(x_BxLxHxD: jax.Array, theta: float = 10_000.0) -> jax.Array:
  """Rotary position embedding (rotate-half form) on the last axis."""
  length, dim = x_BxLxHxD.shape[1], x_BxLxHxD.shape[-1]
  half = dim // 2
  freqs_H = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles_LxH = jnp.arange(length, dtype=jnp.float32)[:, None] * freqs_H
  cos = jnp.cos(angles_LxH)[None, :, None, :]
  sin = jnp.sin(angles_LxH)[None, :, None, :]
  x32 = x_BxLxHxD.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return out.astype(x_BxLxHxD.dtype)


def attend(
  q_BxLxHxD: jax.Array,
  k_BxLxHxD: jax.Array,
  v_BxLxHxD: jax.Array,
  *,
  causal: bool,
  impl: str = 'xla',
) -> jax.Array:
  """Softmax attention, bidirectional or causal."""
  if impl not in ATTENTION_IMPLS:
    raise ValueError(
      f'attention impl {impl!r}; choose one of {ATTENTION_IMPLS}.'
    )
  if impl == 'xla':
    return jax.nn.dot_product_attention(
      q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, is_causal=causal, implementation='xla'
    )
  import pallas_kernels  # Imported lazily: XLA-only users never load Pallas.

  mask = pallas_kernels.MaskSpec.causal() if causal else None
  to_bhld = lambda x: jnp.swapaxes(x, 1, 2)
  out_BxHxLxD = pallas_kernels.attention(
    to_bhld(q_BxLxHxD),
    to_bhld(k_BxLxHxD),
    to_bhld(v_BxLxHxD),
    mask=mask,
    impl=impl,
  )
  return to_bhld(out_BxHxLxD)


class SelfAttention(nnx.Module):
  """Projections, rotary positions and `attend`."""

  def __init__(
    self,
    dim: int,
    num_heads: int,
    *,
    causal: bool,
    impl: str,
    rope_theta: float,
    rngs: nnx.Rngs,
    dtype,
  ):
    if dim % num_heads:
      raise ValueError(f'width {dim} is not divisible by {num_heads} heads.')
    head_dim = dim // num_heads
    qkv = lambda: Dense(
      (dim,),
      (num_heads, head_dim),
      ('embed',),
      ('heads', 'head_dim'),
      rngs=rngs,
      dtype=dtype,
    )
    self.q, self.k, self.v = qkv(), qkv(), qkv()
    self.out = Dense(
      (num_heads, head_dim),
      (dim,),
      ('heads', 'head_dim'),
      ('embed',),
      rngs=rngs,
      dtype=dtype,
    )
    self.causal, self.impl, self.rope_theta = causal, impl, rope_theta

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    q_BxLxHxK = rotary(self.q(x_BxLxD), self.rope_theta)
    k_BxLxHxK = rotary(self.k(x_BxLxD), self.rope_theta)
    v_BxLxHxK = self.v(x_BxLxD)
    o_BxLxHxK = attend(
      q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, causal=self.causal, impl=self.impl
    )
    return self.out(o_BxLxHxK)
