"""Small NNX building blocks whose parameters carry logical axis names.

Every parameter is created through `param`, which records logical axis names
(`embed`, `mlp`, `heads`, ...) as the `out_sharding` metadata. Names are mapped
to mesh axes later by `ddlm_jax.parallel.rules`; models never see mesh axes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Initializer = Callable[..., jax.Array]


def param(
  rngs: nnx.Rngs,
  init: Initializer,
  shape: Sequence[int],
  axes: Sequence[str | None],
  dtype=jnp.float32,
) -> nnx.Param:
  """A parameter with logical axis names (no eager sharding)."""
  if len(axes) != len(shape):
    raise ValueError(f'axes {axes} do not match shape {shape}.')
  value = init(rngs.params(), tuple(shape), dtype)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class Dense(nnx.Module):
  """y = x @ W (+ b) over the last input axes; W has named axes."""

  def __init__(
    self,
    in_shape: Sequence[int],
    out_shape: Sequence[int],
    in_axes: Sequence[str | None],
    out_axes: Sequence[str | None],
    *,
    rngs: nnx.Rngs,
    use_bias: bool = False,
    init: Initializer | None = None,
    dtype=jnp.float32,
  ):
    self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
    fan_in = 1
    for d in self.in_shape:
      fan_in *= d
    if init is None:
      init = nnx.initializers.normal(stddev=fan_in**-0.5)
    self.kernel = param(
      rngs,
      init,
      self.in_shape + self.out_shape,
      tuple(in_axes) + tuple(out_axes),
    )
    self.bias = (
      param(rngs, nnx.initializers.zeros, self.out_shape, tuple(out_axes))
      if use_bias
      else None
    )
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    # One 2-D matmul: XLA's CPU backend runs [M, K] x [K, N] (and its
    # transposes in the backward pass) much faster than batched einsums.
    n_in = len(self.in_shape)
    lead = x.shape[: x.ndim - n_in]
    k = math.prod(self.in_shape)
    kernel_KxN = self.kernel[...].astype(self.dtype).reshape(k, -1)
    y_MxN = x.astype(self.dtype).reshape(-1, k) @ kernel_KxN
    y = y_MxN.reshape(lead + self.out_shape)
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class RMSNorm(nnx.Module):
  """RMS normalisation over the last axis, computed in float32."""

  def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-6):
    self.scale = param(rngs, nnx.initializers.ones, (dim,), ('embed',))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.eps) * self.scale[...]
    return y.astype(x.dtype)


class MLP(nnx.Module):
  """SwiGLU or GELU feed-forward block."""

  def __init__(
    self, dim: int, hidden: int, kind: str, *, rngs: nnx.Rngs, dtype
  ):
    if kind not in ('swiglu', 'gelu'):
      raise ValueError(f"mlp kind {kind!r}; choose 'swiglu' or 'gelu'.")
    self.kind = kind
    dense = lambda i, o, ia, oa: Dense(
      (i,), (o,), (ia,), (oa,), rngs=rngs, dtype=dtype
    )
    self.up = dense(dim, hidden, 'embed', 'mlp')
    self.gate = dense(dim, hidden, 'embed', 'mlp') if kind == 'swiglu' else None
    self.down = dense(hidden, dim, 'mlp', 'embed')

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    h_BxLxF = self.up(x_BxLxD)
    if self.gate is not None:
      h_BxLxF = jax.nn.silu(self.gate(x_BxLxD)) * h_BxLxF
    else:
      h_BxLxF = jax.nn.gelu(h_BxLxF)
    return self.down(h_BxLxF)


def sinusoidal_embedding(t_B: jax.Array, dim: int, max_period=10_000.0):
  """Sinusoidal features of a scalar time per example: [B, dim]."""
  half = dim // 2
  freqs = jnp.exp(-jnp.log(max_period) * jnp.arange(half) / half)
  args_BxH = t_B[:, None].astype(jnp.float32) * 1000.0 * freqs[None]
  return jnp.concatenate([jnp.cos(args_BxH), jnp.sin(args_BxH)], axis=-1)
