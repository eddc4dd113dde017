"""Multi-head attention with rotary positions and one dispatch point.

`attend` is the only place that computes softmax attention. impl='xla' is a
plain einsum-softmax-einsum in XLA (a `pallas_kernels.MaskSpec`, if given,
is materialised as a dense boolean mask); every other impl (the config key
`model.attention_impl`) goes through `pallas_kernels.attention`, which
dispatches to cuDNN, splash, the suite's flash kernel or its reference and
raises, before compute, for a backend the platform or mask cannot use.
Heads are kept in [B, H, L, K] layout from one fused QKV projection: on
XLA's CPU backend the per-tensor transposes of the [B, L, H, K] layout cost
more than the attention matmuls themselves.

Block diffusion (BD3-LM) needs two more things, both here: a described mask
with rotary positions that repeat over the two halves of concat(z_t, x)
(`AttentionContext`), and attention of a block against a key/value cache of
the clean blocks before it (`SelfAttention.cached`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.models.layers import Dense, take_positions

# The same names as pallas_kernels.attention.api.IMPLS (a test checks);
# spelled out here so that XLA-only users never import Pallas.
ATTENTION_IMPLS = (
  'xla',
  'auto',
  'cudnn',
  'splash',
  'pallas',
  'interpret',
  'reference',
)
# Mask kinds each impl cannot express on any platform (cuDNN has only full
# and causal masks, each with optional key padding).
_KINDS_NOT_EXPRESSIBLE = {
  'cudnn': (
    'block_causal',
    'prefix_lm',
    'block_diffusion',
    'segments',
    'groups',
  )
}

# One layer's cache: (keys, values), each [B, H, max_len, K], keys rotated.
LayerCache = tuple[jax.Array, jax.Array]


def rotary(
  x_BxHxLxK: jax.Array,
  theta: float = 10_000.0,
  positions_L: jax.Array | None = None,
) -> jax.Array:
  """Rotary position embedding (rotate-half form); positions on axis -2.

  `positions_L` (default 0..L-1) may repeat or start anywhere, and may be
  traced: block diffusion shares positions between its two halves and a
  cached block sits at an offset. Per-row positions [B, L] rotate each row
  of x [B, H, L, K] at its own positions (queries taken at chosen indices).
  """
  length, dim = x_BxHxLxK.shape[-2], x_BxHxLxK.shape[-1]
  cos, sin = rotary_tables(
    np.arange(length) if positions_L is None else positions_L, dim, theta
  )
  if cos.ndim == 3:  # per-row positions: broadcast over the heads
    cos, sin = cos[:, None], sin[:, None]
  half = dim // 2
  x32 = x_BxHxLxK.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return out.astype(x_BxHxLxK.dtype)


def rotary_tables(positions, dim: int, theta: float):
  """(cos, sin) of the rotary angles, [..., L, dim / 2] float32.

  Known positions give constants of the compiled program: computed inside
  it, XLA:CPU fused cos and sin into the rotation and evaluated them once
  per element of [B, H, L, K], which cost ~10% of a small model's forward.
  Traced positions get a barrier, so the tables are computed once there
  too.
  """
  half = dim // 2
  with jax.ensure_compile_time_eval():
    freqs_F = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles_LxF = jnp.asarray(positions, jnp.float32)[..., None] * freqs_F
    cos, sin = jnp.cos(angles_LxF), jnp.sin(angles_LxF)
  if isinstance(cos, jax.core.Tracer):
    cos, sin = jax.lax.optimization_barrier((cos, sin))
  return cos, sin


def xla_attention(
  q_BxHxLxK,
  k_BxHxSxK,
  v_BxHxSxK,
  *,
  causal: bool,
  allowed: jax.Array | None = None,
):
  """Reference softmax attention in XLA (float32 softmax).

  `allowed` is a boolean mask broadcastable to [B, H, L, S] (True = may
  attend); rows must allow at least one key.
  """
  scale = q_BxHxLxK.shape[-1] ** -0.5
  # Scores and the weighted sum accumulate in float32 also for bf16 inputs.
  s_BxHxLxS = jnp.einsum(
    'bhqd,bhkd->bhqk',
    q_BxHxLxK,
    k_BxHxSxK,
    preferred_element_type=jnp.float32,
  )
  s_BxHxLxS = s_BxHxLxS * scale
  if causal:
    length = s_BxHxLxS.shape[-1]
    allowed = jnp.tril(jnp.ones((length, length), bool))
  if allowed is not None:
    s_BxHxLxS = jnp.where(allowed, s_BxHxLxS, -1e30)
  p_BxHxLxS = jax.nn.softmax(s_BxHxLxS, axis=-1).astype(v_BxHxSxK.dtype)
  out = jnp.einsum(
    'bhqk,bhkd->bhqd',
    p_BxHxLxS,
    v_BxHxSxK,
    preferred_element_type=jnp.float32,
  )
  return out.astype(v_BxHxSxK.dtype)


def check_attention_impl(impl: str, mask_kinds=()) -> None:
  """Raises ValueError if impl is unknown or cannot express a mask kind.

  For config checks before anything is built: e.g. block diffusion trains
  with the 'block_diffusion' kind, which cuDNN has no mask for. Platform,
  shape and dtype limits are checked by `pallas_kernels.attention` when the
  model is traced.
  """
  if impl not in ATTENTION_IMPLS:
    raise ValueError(
      f'attention_impl={impl!r}; choose one of {ATTENTION_IMPLS}.'
    )
  bad = [k for k in mask_kinds if k in _KINDS_NOT_EXPRESSIBLE.get(impl, ())]
  if bad:
    can = [
      i
      for i in ATTENTION_IMPLS
      if not set(bad) & set(_KINDS_NOT_EXPRESSIBLE.get(i, ()))
    ]
    raise ValueError(
      f'attention_impl={impl!r} has no {bad[0]!r} mask; choose one of '
      f'{tuple(can)}.'
    )


def attend(
  q_BxHxLxK: jax.Array,
  k_BxHxSxK: jax.Array,
  v_BxHxSxK: jax.Array,
  *,
  causal: bool,
  impl: str = 'xla',
  mask: Any = None,
) -> jax.Array:
  """Softmax attention in [B, H, L, K] layout.

  Bidirectional, causal, or any `pallas_kernels.MaskSpec` (`mask`, with
  causal=False): impl='xla' materialises it densely, the other impls hand
  it to `pallas_kernels.attention` with the same impl name.
  """
  check_attention_impl(impl)
  if causal and mask is not None:
    raise ValueError(
      'attend got causal=True and a mask; pass one of them (e.g. '
      'MaskSpec.causal() as the mask).'
    )
  if impl == 'xla':
    allowed = None
    if mask is not None:
      allowed = _dense_mask(mask, q_BxHxLxK.shape, k_BxHxSxK.shape[2])
    return xla_attention(
      q_BxHxLxK, k_BxHxSxK, v_BxHxSxK, causal=causal, allowed=allowed
    )
  import pallas_kernels  # Imported lazily: XLA-only users never load Pallas.

  if mask is None and causal:
    mask = pallas_kernels.MaskSpec.causal()
  return pallas_kernels.attention(
    q_BxHxLxK, k_BxHxSxK, v_BxHxSxK, mask=mask, impl=impl
  )


def _dense_mask(mask, q_shape, keys: int) -> jax.Array:
  """A MaskSpec as a boolean array broadcastable to [B, H, L, S].

  Static kinds are computed from position iotas inside the program (one
  [L, S] array, never a host constant of that size); the others through
  MaskSpec.dense.
  """
  from pallas_kernels.attention.mask import static_allowed

  batch, _, length, _ = q_shape
  mask.validate(batch, length, keys)
  if not mask.is_static:
    return mask.dense(batch, length, keys)[:, None]
  q_Lx1 = jax.lax.broadcasted_iota(jnp.int32, (length, 1), 0)
  k_1xS = jax.lax.broadcasted_iota(jnp.int32, (1, keys), 1)
  return jnp.broadcast_to(static_allowed(mask, q_Lx1, k_1xS), (length, keys))


@dataclasses.dataclass(frozen=True)
class AttentionContext:
  """What a self-attention layer needs beyond its input, for one call.

  `layers.Block` hands its mixer argument through, so the transformer passes
  this to every attention layer. Both fields are static (built on the host).

  Attributes:
    mask: a `pallas_kernels.MaskSpec` (None: the layer's own causal flag).
    positions_L: rotary positions of the L inputs (None: 0..L-1).
  """

  mask: Any = None
  positions_L: Any = None  # noqa: N815


def _heads_first(x_BxLxPxHxK: jax.Array) -> jax.Array:
  """A fused projection's P parts, [P, B, H, L, K] (unpack as q, k, v)."""
  return jnp.transpose(x_BxLxPxHxK, (2, 0, 3, 1, 4))


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

  def project(self, x_BxLxD: jax.Array, positions_L=None):
    """(q, k, v) in [B, H, L, K], q and k rotated at `positions_L`."""
    return self.rotate(self.qkv(x_BxLxD), positions_L)

  def rotate(self, qkv_BxLx3xHxK: jax.Array, positions_L=None):
    """(q, k, v) in [B, H, L, K] from the fused projection's output."""
    q, k, v = _heads_first(qkv_BxLx3xHxK)
    q = rotary(q, self.rope_theta, positions_L)
    k = rotary(k, self.rope_theta, positions_L)
    return q, k, v

  def __call__(
    self, x_BxLxD: jax.Array, ctx: AttentionContext | None = None
  ) -> jax.Array:
    return self.from_projection(self.qkv(x_BxLxD), ctx)

  def from_projection(
    self, qkv_BxLx3xHxK: jax.Array, ctx: AttentionContext | None = None
  ) -> jax.Array:
    """The layer's output given its Q/K/V projection (`self.qkv(x)`),
    which a caller may have computed more cheaply (per token)."""
    ctx = AttentionContext() if ctx is None else ctx
    if self.causal and ctx.mask is not None:
      raise ValueError(
        'a causal attention layer got a mask; build the model with '
        'causal=False to use masks such as block diffusion.'
      )
    q, k, v = self.rotate(qkv_BxLx3xHxK, ctx.positions_L)
    o_BxHxLxK = attend(
      q, k, v, causal=self.causal, impl=self.impl, mask=ctx.mask
    )
    return self.out(jnp.transpose(o_BxHxLxK, (0, 2, 1, 3)))

  def at(self, x_BxLxD: jax.Array, idx_BxN: jax.Array) -> jax.Array:
    """The layer's output at N positions per row, [B, N, D].

    Keys and values come from all L positions, queries (projection
    included) only from idx_BxN, clipped to [0, L) (bidirectional layers: a
    causal one would need the query positions in its mask).
    """
    if self.causal:
      raise ValueError('SelfAttention.at needs a bidirectional layer.')
    idx_BxN = jnp.clip(idx_BxN, 0, x_BxLxD.shape[1] - 1)
    k, v = _heads_first(self.qkv(x_BxLxD, part=slice(1, 3)))
    k = rotary(k, self.rope_theta)
    h_BxNxD = take_positions(x_BxLxD, idx_BxN)
    (q_BxHxNxK,) = _heads_first(self.qkv(h_BxNxD, part=slice(1)))
    q_BxHxNxK = rotary(q_BxHxNxK, self.rope_theta, idx_BxN)
    o_BxHxNxK = attend(q_BxHxNxK, k, v, causal=False, impl=self.impl)
    return self.out(jnp.transpose(o_BxHxNxK, (0, 2, 1, 3)))

  def cached(
    self, x_BxNxD: jax.Array, cache: LayerCache, start, visible=None
  ) -> tuple[jax.Array, LayerCache]:
    """N inputs at positions start..start+N-1 against a key/value cache.

    The block's keys and values are written into the cache at `start`; the
    block attends (bidirectionally) to every cached position < start and to
    itself, or to the first `visible` cache positions when given (the
    approximate caches of bidirectional models also read the stale keys
    after the block). Returns the output and the updated cache; callers
    that only want the output drop the cache. `start` may be traced; a
    Python int gives compile-time rotary tables, as a plain pass has.
    """
    k_cache, v_cache = cache
    batch, n = x_BxNxD.shape[0], x_BxNxD.shape[1]
    max_len = k_cache.shape[2]
    if isinstance(start, int):
      positions_N = start + np.arange(n, dtype=np.int32)
    else:
      positions_N = start + jnp.arange(n, dtype=jnp.int32)
    visible = start + n if visible is None else visible
    q, k, v = self.project(x_BxNxD, positions_N)
    at = (0, 0, start, 0)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), at)
    v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), at)
    import pallas_kernels  # Lazily, as in attend: only MaskSpec is needed.

    valid_BxT = jnp.broadcast_to(
      jnp.arange(max_len) < visible, (batch, max_len)
    )
    o_BxHxNxK = attend(
      q,
      k_cache.astype(q.dtype),
      v_cache.astype(v.dtype),
      causal=False,
      impl=self.impl,
      mask=pallas_kernels.MaskSpec.full(valid_BxT),
    )
    return self.out(jnp.transpose(o_BxHxNxK, (0, 2, 1, 3))), (k_cache, v_cache)
