"""Multi-head attention with rotary positions and one dispatch point.

`attend` is the only place that computes softmax attention. impl='xla' is a
plain einsum-softmax-einsum in XLA; 'pallas', 'interpret' and 'auto' go
through `pallas_kernels.attention` (flash attention with masks described per
tile). Heads are kept in [B, H, L, K] layout from one fused QKV projection:
on XLA's CPU backend the per-tensor transposes of the [B, L, H, K] layout
cost more than the attention matmuls themselves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.models.layers import Dense

ATTENTION_IMPLS = ('xla', 'auto', 'pallas', 'interpret')


def rotary(x_BxHxLxK: jax.Array, theta: float = 10_000.0) -> jax.Array:
  """Rotary position embedding (rotate-half form); positions on axis -2."""
  length, dim = x_BxHxLxK.shape[-2], x_BxHxLxK.shape[-1]
  half = dim // 2
  freqs_F = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles_LxF = jnp.arange(length, dtype=jnp.float32)[:, None] * freqs_F
  cos, sin = jnp.cos(angles_LxF), jnp.sin(angles_LxF)
  x32 = x_BxHxLxK.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return out.astype(x_BxHxLxK.dtype)


def xla_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, *, causal: bool):
  """Reference softmax attention in XLA (float32 softmax)."""
  scale = q_BxHxLxK.shape[-1] ** -0.5
  s_BxHxLxL = jnp.einsum('bhqd,bhkd->bhqk', q_BxHxLxK, k_BxHxLxK) * scale
  s_BxHxLxL = s_BxHxLxL.astype(jnp.float32)
  if causal:
    length = s_BxHxLxL.shape[-1]
    allowed = jnp.tril(jnp.ones((length, length), bool))
    s_BxHxLxL = jnp.where(allowed, s_BxHxLxL, -1e30)
  p_BxHxLxL = jax.nn.softmax(s_BxHxLxL, axis=-1).astype(v_BxHxLxK.dtype)
  return jnp.einsum('bhqk,bhkd->bhqd', p_BxHxLxL, v_BxHxLxK)


def attend(
  q_BxHxLxK: jax.Array,
  k_BxHxLxK: jax.Array,
  v_BxHxLxK: jax.Array,
  *,
  causal: bool,
  impl: str = 'xla',
) -> jax.Array:
  """Softmax attention, bidirectional or causal, in [B, H, L, K] layout."""
  if impl not in ATTENTION_IMPLS:
    raise ValueError(
      f'attention impl {impl!r}; choose one of {ATTENTION_IMPLS}.'
    )
  if impl == 'xla':
    return xla_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, causal=causal)
  import pallas_kernels  # Imported lazily: XLA-only users never load Pallas.

  mask = pallas_kernels.MaskSpec.causal() if causal else None
  return pallas_kernels.attention(
    q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, mask=mask, impl=impl
  )


class SelfAttention(nnx.Module):
  """Fused QKV projection, rotary positions, `attend`, output projection."""

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
    self.qkv = Dense(
      (dim,),
      (3, num_heads, head_dim),
      ('embed',),
      ('qkv', 'heads', 'head_dim'),
      rngs=rngs,
      dtype=dtype,
    )
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
    qkv_3xBxHxLxK = jnp.transpose(self.qkv(x_BxLxD), (2, 0, 3, 1, 4))
    q, k, v = qkv_3xBxHxLxK[0], qkv_3xBxHxLxK[1], qkv_3xBxHxLxK[2]
    o_BxHxLxK = attend(
      rotary(q, self.rope_theta),
      rotary(k, self.rope_theta),
      v,
      causal=self.causal,
      impl=self.impl,
    )
    return self.out(jnp.transpose(o_BxHxLxK, (0, 2, 1, 3)))
