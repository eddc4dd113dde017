"""Library attention kernels behind ``MaskSpec``: cuDNN (GPU), splash (TPU).

Both take the suite's layout, q (B, H, L, D) and k, v (B, K, S, D) with K
dividing H (query head h reads key/value head h // (H // K)), and its
contract: softmax in f32 inside the kernel, rows with no visible key give
zeros.

- ``cudnn_attention``: ``jax.nn.dot_product_attention(implementation=
  'cudnn')`` (cuDNN flash attention, float16/bfloat16 only) for the kinds it
  has natively: full and causal, each optionally with key padding. cuDNN
  takes padding as per-example key lengths, so a ``kv_valid`` that is a
  prefix (trailing padding, as in a key/value cache) runs in cuDNN; any
  other ``kv_valid`` falls back at run time (``lax.cond``) to a dense XLA
  softmax, so the result is right for every input.
- ``splash_attention``: ``jax.experimental.pallas.ops.tpu.splash_attention``
  with every mask kind. Static kinds become splash masks evaluated inside
  the kernel (``FullMask``, ``CausalMask``, or ``RuleMask`` for
  block-causal, prefix-LM and block diffusion, which runs this suite's own
  elementwise rule); segments and key padding become splash ``SegmentIds``
  (padded keys get a segment id no query has); groups, which no static mask
  or segment pair can express, become a per-example dynamic (dense) mask
  from which splash still skips empty tiles. Sequence lengths must be
  multiples of 128 (splash's lane width).

``splash_dense_mask`` rebuilds, on the host, the (B, L, S) mask that the
splash encoding means (static mask AND equal segment ids, or the dynamic
mask), so tests can compare it with ``MaskSpec.dense`` exactly.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import (
  splash_attention_kernel as splash_kernel,
)

from pallas_kernels.attention.mask import (
  STATIC_KINDS,
  MaskSpec,
  static_allowed,
)

CUDNN_KINDS = ('full', 'causal')
CUDNN_DTYPES = (jnp.float16, jnp.bfloat16)
CUDNN_MAX_HEAD_DIM = 256  # Hopper and later; 128 before (cuDNN raises).
SPLASH_KINDS = (
  'full',
  'causal',
  'block_causal',
  'prefix_lm',
  'block_diffusion',
  'segments',
  'groups',
)
SPLASH_LANES = 128  # splash's key blocks must be multiples of the lane width.
SPLASH_BLOCK = 128


# ------------------------------------------------------------ capabilities --


def cudnn_unsupported(mask: MaskSpec, q_shape, k_shape, dtype) -> str | None:
  """Why cuDNN cannot run this call, or None if it can."""
  if mask.kind not in CUDNN_KINDS:
    return (
      f'cuDNN attention has no {mask.kind!r} mask (it takes full or causal, '
      'each with optional key padding)'
    )
  if dtype is not None and jnp.dtype(dtype) not in [
    jnp.dtype(d) for d in CUDNN_DTYPES
  ]:
    return (
      f'cuDNN flash attention takes float16/bfloat16 inputs, got '
      f'{jnp.dtype(dtype)} (cast q, k, v, or use model dtype bfloat16)'
    )
  if q_shape is not None:
    D = q_shape[-1]
    if D % 8 or D > CUDNN_MAX_HEAD_DIM:
      return (
        f'cuDNN flash attention needs a head dim that is a multiple of 8 and '
        f'<= {CUDNN_MAX_HEAD_DIM}, got {D}'
      )
  return None


def splash_unsupported(mask: MaskSpec, q_shape, k_shape, dtype) -> str | None:
  """Why splash cannot run this call, or None if it can."""
  if mask.kind not in SPLASH_KINDS:
    return f'splash attention has no {mask.kind!r} mask'
  if q_shape is not None and k_shape is not None:
    L, S = q_shape[-2], k_shape[-2]
    if L % SPLASH_LANES or S % SPLASH_LANES:
      return (
        f'splash attention needs query and key lengths that are multiples '
        f'of {SPLASH_LANES}, got L={L}, S={S} (pad the sequence)'
      )
  return None


# ------------------------------------------------------------------ cuDNN --


def cudnn_attention(
  q_BxHxLxD: jax.Array,
  k_BxKxSxD: jax.Array,
  v_BxKxSxD: jax.Array,
  mask: MaskSpec,
  sm_scale: float | None = None,
) -> jax.Array:
  """cuDNN flash attention for full / causal masks (+ key padding).

  Raises ValueError for a mask kind, dtype or head dim cuDNN cannot take.
  Tracing needs a CUDA jaxlib (``jax.nn.dot_product_attention`` asks cuDNN
  for its version while tracing).
  """
  why = cudnn_unsupported(
    mask, q_BxHxLxD.shape, k_BxKxSxD.shape, q_BxHxLxD.dtype
  )
  if why:
    raise ValueError(why + '.')
  D = q_BxHxLxD.shape[-1]
  scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
  causal = mask.kind == 'causal'
  # jax.nn.dot_product_attention takes [B, L, H, D].
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q_BxHxLxD, k_BxKxSxD, v_BxKxSxD))
  k, v = k.astype(q.dtype), v.astype(q.dtype)

  def run(lengths_B):
    return jax.nn.dot_product_attention(
      q,
      k,
      v,
      scale=scale,
      is_causal=causal,
      key_value_seq_lengths=lengths_B,
      implementation='cudnn',
    )

  if mask.kv_valid_BxS is None:
    out_BxLxHxD = run(None)
  else:
    valid_BxS = mask.kv_valid_BxS
    S = valid_BxS.shape[1]
    lengths_B = jnp.sum(valid_BxS, axis=1, dtype=jnp.int32)
    is_prefix = jnp.all(valid_BxS == (jnp.arange(S) < lengths_B[:, None]))

    def cudnn_branch(_):
      # An empty sequence would divide by zero in cuDNN: run it with one key
      # and zero it below.
      return run(jnp.maximum(lengths_B, 1))

    def dense_branch(_):
      return _dense_fallback(q, k, v, mask, scale)

    out_BxLxHxD = jax.lax.cond(is_prefix, cudnn_branch, dense_branch, None)
    # Causal rows see key 0 whenever any key is valid, so only empty
    # sequences have rows without keys.
    has_key_B = lengths_B > 0
    out_BxLxHxD = jnp.where(has_key_B[:, None, None, None], out_BxLxHxD, 0)
  return jnp.swapaxes(out_BxLxHxD, 1, 2).astype(q_BxHxLxD.dtype)


def _dense_fallback(q, k, v, mask, scale):
  """[B, L, H, D] attention with the dense mask, for non-prefix padding."""
  B, L, _, _ = q.shape
  S = k.shape[1]
  allowed_BxLxS = _static_dense(mask, L, S)[None] & mask.kv_valid_BxS[:, None]
  out = jax.nn.dot_product_attention(
    q, k, v, mask=allowed_BxLxS[:, None], scale=scale, implementation='xla'
  )
  has_key_BxL = jnp.any(allowed_BxLxS, axis=-1)
  return jnp.where(has_key_BxL[:, :, None, None], out, 0).astype(q.dtype)


def _static_dense(mask: MaskSpec, L: int, S: int) -> jax.Array:
  """(L, S) bool of a static kind from iotas (no host constant)."""
  q_Lx1 = jax.lax.broadcasted_iota(jnp.int32, (L, 1), 0)
  k_1xS = jax.lax.broadcasted_iota(jnp.int32, (1, S), 1)
  return jnp.broadcast_to(static_allowed(mask, q_Lx1, k_1xS), (L, S))


# ----------------------------------------------------------------- splash --


@dataclasses.dataclass(frozen=True)
class StaticRule:
  """A static mask kind's elementwise rule as a hashable callable.

  Splash passes its mask function as a static (hashed) argument and calls it
  on NumPy positions on the host (to classify tiles) and on int32 positions
  inside the kernel; ``static_allowed`` works on both.
  """

  kind: str
  block_size: int = 0
  prefix_len: int = 0
  seq_len: int = 0

  @classmethod
  def of(cls, mask: MaskSpec) -> StaticRule:
    return cls(mask.kind, mask.block_size, mask.prefix_len, mask.seq_len)

  def __call__(self, q_ids, kv_ids):
    spec = MaskSpec(
      self.kind,
      block_size=self.block_size,
      prefix_len=self.prefix_len,
      seq_len=self.seq_len,
    )
    return static_allowed(spec, q_ids, kv_ids)


class RuleMask(splash.Mask):
  """A splash mask computed in-kernel from a ``StaticRule``.

  Splash evaluates a mask in the kernel (instead of loading dense blocks)
  when the mask object has ``q_sequence`` and ``mask_function``; this class
  provides both, like splash's own ``CausalMask``.
  """

  def __init__(self, shape: tuple[int, int], rule: StaticRule):
    self._shape = (int(shape[0]), int(shape[1]))
    self.rule = rule
    self.mask_function = rule
    self.q_sequence = np.arange(self._shape[0], dtype=np.int32)

  @property
  def shape(self) -> tuple[int, ...]:
    return self._shape

  def __getitem__(self, idx) -> np.ndarray:
    if not isinstance(idx, tuple) or len(idx) != 2:
      raise NotImplementedError(f'RuleMask takes [rows, cols], got {idx}.')
    rows = np.arange(self._shape[0])[idx[0]]
    cols = np.arange(self._shape[1])[idx[1]]
    out = self.rule(np.atleast_1d(rows)[:, None], np.atleast_1d(cols)[None])
    out = np.broadcast_to(np.asarray(out, bool), (rows.size, cols.size))
    return out.reshape(np.shape(rows) + np.shape(cols))

  def __eq__(self, other: object):
    if not isinstance(other, RuleMask):
      return NotImplemented
    return self._shape == other._shape and self.rule == other.rule

  def __hash__(self):
    return hash((RuleMask, self._shape, self.rule))


def splash_base_mask(mask: MaskSpec, L: int, S: int) -> splash.Mask | None:
  """The static (L, S) splash mask of a kind; None for groups (dynamic)."""
  if mask.kind in ('full', 'segments'):
    return splash.FullMask((L, S))
  if mask.kind == 'causal':
    return splash.CausalMask((L, S))
  if mask.kind in ('block_causal', 'prefix_lm', 'block_diffusion'):
    return RuleMask((L, S), StaticRule.of(mask))
  if mask.kind == 'groups':
    return None
  raise ValueError(f'splash attention has no {mask.kind!r} mask.')


def splash_segment_ids(mask: MaskSpec, B: int, L: int, S: int):
  """(q_ids_BxL, kv_ids_BxS) int32 for splash SegmentIds, or None.

  Segments use their ids; key padding gives padded keys an id no query of
  that example has (one below the smallest query id), so "same segment"
  also means "valid key".
  """
  if mask.kind == 'groups':
    return None
  if mask.kind == 'segments':
    q_BxL, kv_BxS = mask.q_ids_BxL, mask.kv_ids_BxS
  elif mask.kv_valid_BxS is not None:
    q_BxL = jnp.zeros((B, L), jnp.int32)
    kv_BxS = jnp.zeros((B, S), jnp.int32)
  else:
    return None
  if mask.kv_valid_BxS is not None:
    none_B = jnp.min(q_BxL, axis=1) - 1
    kv_BxS = jnp.where(mask.kv_valid_BxS, kv_BxS, none_B[:, None])
  return q_BxL.astype(jnp.int32), kv_BxS.astype(jnp.int32)


def splash_dense_mask(mask: MaskSpec, B: int, L: int, S: int) -> np.ndarray:
  """(B, L, S) bool the splash encoding means, built on the host."""
  base = splash_base_mask(mask, L, S)
  if base is None:
    return np.asarray(mask.dense(B, L, S))
  out = np.broadcast_to(base[:, :], (B, L, S))
  ids = splash_segment_ids(mask, B, L, S)
  if ids is not None:
    q_BxL, kv_BxS = (np.asarray(x) for x in ids)
    out = out & (q_BxL[:, :, None] == kv_BxS[:, None, :])
  return np.asarray(out)


def _block_sizes(L: int, S: int, block: int) -> splash.BlockSizes:
  bq, bk = math.gcd(L, block), math.gcd(S, block)
  return splash.BlockSizes(
    block_q=bq,
    block_kv=bk,
    block_kv_compute=bk,
    block_q_dkv=bq,
    block_kv_dkv=bk,
    block_kv_dkv_compute=bk,
    block_q_dq=bq,
    block_kv_dq=bk,
  )


def _static_kernel(kernel):
  """Drops the traced ``is_dynamic_mask`` flag of a dynamic-mask kernel.

  With a traced mask, splash stores ``is_dynamic_mask`` as an array leaf and
  then branches on it in Python (TracerBoolConversionError under jit, jax
  0.10 and 0.12). The flag only picks a profiler scope name and a sharding
  spec, so dropping it changes nothing else.
  """

  def drop(info):
    return None if info is None else info._replace(is_dynamic_mask=None)

  return splash_kernel.SplashAttentionKernel(
    drop(kernel.fwd_mask_info),
    drop(kernel.dq_mask_info),
    drop(kernel.dkv_mask_info),
    **kernel.kwargs,
  )


def rows_without_keys_possible(mask: MaskSpec) -> bool:
  """Whether some query row may see no key (splash's output is then fixed).

  Static kinds let every row see key 0 or itself; key padding, segments
  (key ids may differ from query ids) and groups may leave a row empty.
  """
  return not mask.is_static


def row_has_key(mask: MaskSpec, B: int, L: int, S: int) -> jax.Array:
  """(B, L) bool: the row sees at least one key (a fused XLA reduction)."""
  if mask.is_static:
    return jnp.ones((B, L), bool)
  if mask.kind in STATIC_KINDS:
    allowed = _static_dense(mask, L, S)[None] & mask.kv_valid_BxS[:, None]
  else:
    allowed = mask.dense(B, L, S)
  return jnp.any(allowed, axis=-1)


def splash_attention(
  q_BxHxLxD: jax.Array,
  k_BxKxSxD: jax.Array,
  v_BxKxSxD: jax.Array,
  mask: MaskSpec,
  sm_scale: float | None = None,
  *,
  block: int = SPLASH_BLOCK,
  interpret: bool = False,
) -> jax.Array:
  """Splash attention (TPU) for every ``MaskSpec`` kind.

  Args:
    block: tile size for queries and keys (a multiple of 128; the tile is
      gcd(length, block)).
    interpret: run the Pallas kernels in interpret mode (CPU tests).
  """
  B, H, L, D = q_BxHxLxD.shape
  S = k_BxKxSxD.shape[2]
  why = splash_unsupported(mask, q_BxHxLxD.shape, k_BxKxSxD.shape, None)
  if why:
    raise ValueError(why + '.')
  scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
  dtype = q_BxHxLxD.dtype
  # Splash has no logit scale: fold it into q (in f32, then back).
  q = (q_BxHxLxD.astype(jnp.float32) * scale).astype(dtype)
  k, v = k_BxKxSxD.astype(dtype), v_BxKxSxD.astype(dtype)
  sizes = _block_sizes(L, S, block)
  base = splash_base_mask(mask, L, S)
  if base is None:
    dense_Bx1xLxS = mask.dense(B, L, S)[:, None]

    def one(q_HxLxD, k_KxSxD, v_KxSxD, m_1xLxS):
      kernel = splash.make_splash_mha(
        m_1xLxS,
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
      )
      return _static_kernel(kernel)(q_HxLxD, k_KxSxD, v_KxSxD)

    out = jax.vmap(one)(q, k, v, dense_Bx1xLxS)
  else:
    kernel = splash.make_splash_mha(
      splash.MultiHeadMask([base] * H),
      block_sizes=sizes,
      head_shards=1,
      q_seq_shards=1,
      interpret=interpret,
    )
    ids = splash_segment_ids(mask, B, L, S)
    if ids is None:
      out = jax.vmap(kernel)(q, k, v)
    else:
      seg = splash.SegmentIds(q=ids[0], kv=ids[1])
      out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s))(
        q, k, v, seg
      )
  if rows_without_keys_possible(mask):
    keep_BxL = row_has_key(mask, B, L, S)
    out = jnp.where(keep_BxL[:, None, :, None], out, 0)
  return out.astype(dtype)
