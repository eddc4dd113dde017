"""Flash attention in Pallas for GPU (Triton lowering; interpret on CPU).

The TPU kernel (``flash.py``) walks key blocks on a sequential grid axis,
keeps its running statistics in VMEM scratch and skips empty tiles through
a scalar-prefetched table. Triton has none of the three (every program is
independent, no scratch, no scalar prefetch), so here:

- the grid is (B, H, nq) for the forward and dQ kernels and (B, H, nk) for
  dK/dV; each program loops over its key (or query) blocks with a bounded
  ``fori_loop`` and carries the online-softmax state (f32 max, sum and
  output accumulator) in registers;
- the tile table (``mask.py``) enters as an ordinary int32 input, compacted
  per row into [count, entries...] with entry = 4 * block + class, so the
  loop runs over the row's non-empty tiles only (EMPTY tiles cost nothing:
  no load, no compute); the elementwise mask is evaluated on every visited
  tile and overridden to all-true on FULL ones (no per-tile branch);
- every loaded tile is a power of two in each dimension (Triton's rule):
  blocks of 16..64 rows, and the head dimension padded with zeros to a power
  of two >= 16 (``tl.dot`` needs 16), which changes no dot product.

Semantics match ``attention(..., impl='reference')``: f32 statistics, rows
that see no key give zeros (and zero gradients), grouped-query attention
with K | H (dK/dV per query head, summed over each group outside).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._common import (
  compiler_params,
  next_pow2,
  platform_call,
  round_up,
)
from pallas_kernels.attention.flash import (
  BIG,
  NEG,
  Config,
  dot_nn,
  dot_nt,
  dot_tn,
  flash_attention,
  tile_mask,
)
from pallas_kernels.attention.mask import EMPTY, FULL, MaskSpec, tile_table

# Tile sizes: powers of two, >= 16 for tl.dot. A program holds its q tile
# and, per pipeline stage, one K and one V tile in shared memory: with 64-row
# tiles and rows of at most 256 bytes (bf16 D <= 128, f32 D <= 64) that is
# 16 + 2 x 2 x 16 = 80 KiB, inside the ~100 KiB of consumer and the 164-228
# KiB of data-centre NVIDIA GPUs; wider rows halve the key tile. Not tuned on
# hardware (no GPU was lent to the session that wrote this).
DEFAULT_BLOCK = 64
MAX_ROW_BYTES = 256
MIN_BLOCK = 16
NUM_WARPS = 4
NUM_STAGES = 2


@dataclasses.dataclass(frozen=True)
class _Dims:
  """Static sizes of one call (padded to whole power-of-two tiles)."""

  nq: int
  nk: int
  Lp: int
  Sp: int
  Dp: int


def _tb(cfg: Config, b):
  return b if cfg.per_batch_table else 0


def _row_lists(table):
  """(Bt, n_out, n_in) table -> (Bt, n_out, 1 + n_in) [count, entries...].

  Entries list the row's non-empty tiles in block order as 4 * block +
  class (class PARTIAL or FULL); slots after the count are unused.
  """
  xp = np if isinstance(table, np.ndarray) else jnp
  nonempty = table != EMPTY
  if xp is np:
    order = np.argsort(~nonempty, axis=-1, kind='stable')
  else:
    order = jnp.argsort(~nonempty, axis=-1, stable=True)
  order = order.astype(np.int32)
  cls = xp.take_along_axis(table, order, axis=-1).astype(np.int32)
  count = xp.sum(nonempty, axis=-1, keepdims=True).astype(np.int32)
  return xp.concatenate([count, order * 4 + cls], axis=-1).astype(np.int32)


def _params(cfg: Config):
  return compiler_params(
    'interpret' if cfg.interpret else 'gpu',
    num_warps=NUM_WARPS,
    num_stages=NUM_STAGES,
  )


def _split_aux(cfg: Config, refs):
  """Pops the optional (qaux, kaux, kvalid) refs from the front of refs."""
  out, refs = [], list(refs)
  for flag in (cfg.has_qaux, cfg.has_kaux, cfg.has_kvalid):
    out.append(refs.pop(0) if flag else None)
  return out, refs


def _row_tile_mask(cfg: Config, i, j, aux_refs, q_slice, k_slice, tile):
  """(bq, bk) mask of tile (i, j); all True for a FULL tile."""
  qaux_ref, kaux_ref, kvalid_ref = aux_refs
  qaux = None if qaux_ref is None else qaux_ref[q_slice][:, None]
  kaux = None if kaux_ref is None else kaux_ref[k_slice][None, :]
  kvalid = None if kvalid_ref is None else kvalid_ref[k_slice][None, :]
  return tile_mask(cfg, i, j, qaux, kaux, kvalid) | (tile == FULL)


def _decode(entry):
  return lax.shift_right_logical(entry, 2), entry & 3


def _block(start, size):
  return pl.ds(pl.multiple_of(start * size, size), size)


# ------------------------------------------------------------------ forward --


def _fwd_kernel(lst_ref, q_ref, k_ref, v_ref, *refs, cfg: Config):
  aux_refs, (o_ref, lse_ref) = _split_aux(cfg, refs)
  i = pl.program_id(2)
  q = q_ref[...]
  bq, Dp = q.shape
  q_slice = slice(None)  # the query-side aux block is this row's

  def body(t, carry):
    m, denom, acc = carry
    j, tile = _decode(lst_ref[t + 1])
    ks = _block(j, cfg.bk)
    k, v = k_ref[ks, :], v_ref[ks, :]
    s = dot_nt(q, k) * cfg.sm_scale
    mask = _row_tile_mask(cfg, i, j, aux_refs, q_slice, ks, tile)
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    denom = alpha * denom + jnp.sum(p, axis=1)
    acc = alpha[:, None] * acc + dot_nn(p.astype(v.dtype), v)
    return m_new, denom, acc

  init = (
    jnp.full((bq,), NEG, jnp.float32),
    jnp.zeros((bq,), jnp.float32),
    jnp.zeros((bq, Dp), jnp.float32),
  )
  m, denom, acc = lax.fori_loop(0, lst_ref[0], body, init)
  seen = denom > 0.0
  safe_l = jnp.where(seen, denom, 1.0)
  o_ref[...] = jnp.where(seen[:, None], acc / safe_l[:, None], 0.0).astype(
    o_ref.dtype
  )
  lse_ref[...] = jnp.where(seen, m + jnp.log(safe_l), BIG)


def _aux_specs(cfg: Config, q_side: pl.BlockSpec, k_side: pl.BlockSpec):
  return (
    [q_side] * cfg.has_qaux
    + [k_side] * cfg.has_kaux
    + [k_side] * cfg.has_kvalid
  )


def _forward(cfg: Config, dims: _Dims, q, k, v, lst, aux):
  B, H = q.shape[:2]
  G, Dp = cfg.groups, dims.Dp
  lst_spec = pl.BlockSpec(
    (None, None, dims.nk + 1), lambda b, h, i: (_tb(cfg, b), i, 0)
  )
  q_spec = pl.BlockSpec((None, None, cfg.bq, Dp), lambda b, h, i: (b, h, i, 0))
  kv_spec = pl.BlockSpec(
    (None, None, dims.Sp, Dp), lambda b, h, i: (b, lax.div(h, G), 0, 0)
  )
  row_spec = pl.BlockSpec((None, None, cfg.bq), lambda b, h, i: (b, h, i))
  qaux_spec = pl.BlockSpec((None, cfg.bq), lambda b, h, i: (b, i))
  kaux_spec = pl.BlockSpec((None, dims.Sp), lambda b, h, i: (b, 0))
  return pl.pallas_call(
    functools.partial(_fwd_kernel, cfg=cfg),
    out_shape=[
      jax.ShapeDtypeStruct(q.shape, q.dtype),
      jax.ShapeDtypeStruct((B, H, dims.Lp), jnp.float32),
    ],
    grid=(B, H, dims.nq),
    in_specs=[lst_spec, q_spec, kv_spec, kv_spec]
    + _aux_specs(cfg, qaux_spec, kaux_spec),
    out_specs=[q_spec, row_spec],
    interpret=cfg.interpret,
    compiler_params=_params(cfg),
    name='flash_fwd_gpu',
  )(lst, q, k, v, *aux)


# ----------------------------------------------------------------- backward --


def _dkv_kernel(lst_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                *refs, cfg: Config):  # fmt: skip
  aux_refs, (dk_ref, dv_ref) = _split_aux(cfg, refs)
  j = pl.program_id(2)
  k, v = k_ref[...], v_ref[...]
  bk, Dp = k.shape
  k_slice = slice(None)

  def body(t, carry):
    dk, dv = carry
    i, tile = _decode(lst_ref[t + 1])
    qs = _block(i, cfg.bq)
    q, do = q_ref[qs, :], do_ref[qs, :]
    lse, delta = lse_ref[qs], delta_ref[qs]
    mask = _row_tile_mask(cfg, i, j, aux_refs, qs, k_slice, tile)
    s = dot_nt(q, k) * cfg.sm_scale
    p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
    dv = dv + dot_tn(p.astype(do.dtype), do)
    ds = p * (dot_nt(do, v) - delta[:, None])
    dk = dk + dot_tn(ds.astype(q.dtype), q) * cfg.sm_scale
    return dk, dv

  zeros = jnp.zeros((bk, Dp), jnp.float32)
  dk, dv = lax.fori_loop(0, lst_ref[0], body, (zeros, zeros))
  dk_ref[...] = dk
  dv_ref[...] = dv


def _dq_kernel(lst_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               *refs, cfg: Config):  # fmt: skip
  aux_refs, (dq_ref,) = _split_aux(cfg, refs)
  i = pl.program_id(2)
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  q_slice = slice(None)

  def body(t, dq):
    j, tile = _decode(lst_ref[t + 1])
    ks = _block(j, cfg.bk)
    k, v = k_ref[ks, :], v_ref[ks, :]
    mask = _row_tile_mask(cfg, i, j, aux_refs, q_slice, ks, tile)
    s = dot_nt(q, k) * cfg.sm_scale
    p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
    ds = p * (dot_nt(do, v) - delta[:, None])
    return dq + dot_nn(ds.astype(k.dtype), k) * cfg.sm_scale

  dq = lax.fori_loop(0, lst_ref[0], body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _backward(cfg: Config, dims: _Dims, q, k, v, o, lse, do, lsts, aux):
  B, H = q.shape[:2]
  G, Dp = cfg.groups, dims.Dp
  lst, lst_t = lsts
  delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
  # dK, dV per query head: grid (B, H, nk), loop over query blocks.
  full_q = pl.BlockSpec((None, None, dims.Lp, Dp), lambda b, h, j: (b, h, 0, 0))
  full_row = pl.BlockSpec((None, None, dims.Lp), lambda b, h, j: (b, h, 0))
  kv_blk = pl.BlockSpec(
    (None, None, cfg.bk, Dp), lambda b, h, j: (b, lax.div(h, G), j, 0)
  )
  kh_blk = pl.BlockSpec((None, None, cfg.bk, Dp), lambda b, h, j: (b, h, j, 0))
  dk, dv = pl.pallas_call(
    functools.partial(_dkv_kernel, cfg=cfg),
    out_shape=[jax.ShapeDtypeStruct((B, H, dims.Sp, Dp), jnp.float32)] * 2,
    grid=(B, H, dims.nk),
    in_specs=[
      pl.BlockSpec(
        (None, None, dims.nq + 1), lambda b, h, j: (_tb(cfg, b), j, 0)
      ),
      full_q,
      kv_blk,
      kv_blk,
      full_q,
      full_row,
      full_row,
    ]
    + _aux_specs(
      cfg,
      pl.BlockSpec((None, dims.Lp), lambda b, h, j: (b, 0)),
      pl.BlockSpec((None, cfg.bk), lambda b, h, j: (b, j)),
    ),
    out_specs=[kh_blk, kh_blk],
    interpret=cfg.interpret,
    compiler_params=_params(cfg),
    name='flash_dkv_gpu',
  )(lst_t, q, k, v, do, lse, delta, *aux)
  # dQ: grid (B, H, nq), loop over key blocks.
  q_blk = pl.BlockSpec((None, None, cfg.bq, Dp), lambda b, h, i: (b, h, i, 0))
  row_blk = pl.BlockSpec((None, None, cfg.bq), lambda b, h, i: (b, h, i))
  full_kv = pl.BlockSpec(
    (None, None, dims.Sp, Dp), lambda b, h, i: (b, lax.div(h, G), 0, 0)
  )
  dq = pl.pallas_call(
    functools.partial(_dq_kernel, cfg=cfg),
    out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    grid=(B, H, dims.nq),
    in_specs=[
      pl.BlockSpec(
        (None, None, dims.nk + 1), lambda b, h, i: (_tb(cfg, b), i, 0)
      ),
      q_blk,
      full_kv,
      full_kv,
      q_blk,
      row_blk,
      row_blk,
    ]
    + _aux_specs(
      cfg,
      pl.BlockSpec((None, cfg.bq), lambda b, h, i: (b, i)),
      pl.BlockSpec((None, dims.Sp), lambda b, h, i: (b, 0)),
    ),
    out_specs=q_blk,
    interpret=cfg.interpret,
    compiler_params=_params(cfg),
    name='flash_dq_gpu',
  )(lst, q, k, v, do, lse, delta, *aux)
  K = k.shape[1]
  dk = dk.reshape(B, K, G, dims.Sp, Dp).sum(axis=2).astype(k.dtype)
  dv = dv.reshape(B, K, G, dims.Sp, Dp).sum(axis=2).astype(v.dtype)
  return dq, dk, dv


# ------------------------------------------------------------------ wrapper --


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _flash(cfg, dims, q, k, v, lsts, aux):
  return _forward(cfg, dims, q, k, v, lsts[0], aux)[0]


def _flash_fwd(cfg, dims, q, k, v, lsts, aux):
  o, lse = _forward(cfg, dims, q, k, v, lsts[0], aux)
  return o, (q, k, v, o, lse, lsts, aux)


def _flash_bwd(cfg, dims, res, do):
  q, k, v, o, lse, lsts, aux = res
  dq, dk, dv = _backward(cfg, dims, q, k, v, o, lse, do, lsts, aux)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def gpu_block_sizes(
  L: int,
  S: int,
  block_q: int | None,
  block_k: int | None,
  row_bytes: int = 0,
):
  """Power-of-two tiles: the block, or the smallest power of two >= 16 that
  covers a shorter axis. None picks the default for rows of row_bytes."""
  if block_q is None:
    block_q = DEFAULT_BLOCK
  if block_k is None:
    wide = row_bytes > MAX_ROW_BYTES
    block_k = DEFAULT_BLOCK // 2 if wide else DEFAULT_BLOCK
  for name, b in (('block_q', block_q), ('block_k', block_k)):
    if b < MIN_BLOCK or b != next_pow2(b):
      raise ValueError(
        f'{name}={b} must be a power of two >= {MIN_BLOCK} (Triton tiles).'
      )
  bq = min(block_q, max(MIN_BLOCK, next_pow2(L)))
  bk = min(block_k, max(MIN_BLOCK, next_pow2(S)))
  return bq, bk


def _check(q, k, v):
  shapes = [getattr(x, 'shape', None) for x in (q, k, v)]
  if any(s is None or len(s) != 4 for s in shapes):
    raise ValueError(
      'q, k and v must have shapes (B, H, L, D), (B, K, S, D), (B, K, S, D); '
      f'got {shapes}.'
    )
  (B, H, _, D), (Bk, K, _, Dk) = shapes[0], shapes[1]
  if shapes[2] != shapes[1] or Bk != B or Dk != D:
    raise ValueError(
      f'k and v must both have shape (B={B}, K, S, D={D}); got {shapes[1]} '
      f'and {shapes[2]}.'
    )
  if H % K:
    raise ValueError(f'key/value heads K={K} must divide query heads H={H}.')


def flash_attention_gpu(
  q_BxHxLxD: jax.Array,
  k_BxKxSxD: jax.Array,
  v_BxKxSxD: jax.Array,
  mask: MaskSpec,
  *,
  sm_scale: float,
  interpret: bool = False,
  block_q: int | None = None,
  block_k: int | None = None,
) -> jax.Array:
  """Flash attention on GPU (Triton); returns out_BxHxLxD in q's dtype.

  Forward and backward (custom_vjp) skip EMPTY tiles of the mask's tile
  table. interpret=True runs the same kernels on any backend (tests).
  block_q / block_k: powers of two >= 16 (None: sized for shared memory,
  see ``gpu_block_sizes``).
  """
  _check(q_BxHxLxD, k_BxKxSxD, v_BxKxSxD)
  B, H, L, D = q_BxHxLxD.shape
  K, S = k_BxKxSxD.shape[1], k_BxKxSxD.shape[2]
  mask.validate(B, L, S)
  Dp = max(MIN_BLOCK, next_pow2(D))
  row_bytes = Dp * jnp.dtype(k_BxKxSxD.dtype).itemsize
  bq, bk = gpu_block_sizes(L, S, block_q, block_k, row_bytes)
  Lp, Sp = round_up(L, bq), round_up(S, bk)
  dims = _Dims(nq=Lp // bq, nk=Sp // bk, Lp=Lp, Sp=Sp, Dp=Dp)
  table = tile_table(mask, B, L, S, bq, bk)
  per_batch = not isinstance(table, np.ndarray)
  table_t = jnp.swapaxes(table, 1, 2) if per_batch else np.swapaxes(table, 1, 2)
  lsts = tuple(jnp.asarray(_row_lists(x)) for x in (table, table_t))
  aux, has_qaux, has_kaux = [], False, False
  kvalid = mask.kv_valid_BxS
  if mask.kind == 'segments':
    aux, has_qaux, has_kaux = [mask.q_ids_BxL, mask.kv_ids_BxS], True, True
  elif mask.kind == 'groups':
    G = mask.visible_BxGxG.shape[-1]
    kid = mask.kv_ids_BxS
    in_range = (kid >= 0) & (kid < G)
    aux = [mask.query_bits(), jnp.clip(kid, 0, G - 1)]
    has_qaux = has_kaux = True
    kvalid = in_range if kvalid is None else kvalid & in_range
  if kvalid is None and Sp != S:
    kvalid = jnp.ones((B, S), bool)
  packed = []
  if has_qaux:
    packed.append(jnp.pad(aux[0].astype(jnp.int32), ((0, 0), (0, Lp - L))))
  if has_kaux:
    packed.append(jnp.pad(aux[1].astype(jnp.int32), ((0, 0), (0, Sp - S))))
  if kvalid is not None:
    packed.append(jnp.pad(kvalid.astype(jnp.int32), ((0, 0), (0, Sp - S))))
  cfg = Config(
    kind=mask.kind,
    block_size=mask.block_size,
    prefix_len=mask.prefix_len,
    seq_len=mask.seq_len,
    has_qaux=has_qaux,
    has_kaux=has_kaux,
    has_kvalid=kvalid is not None,
    per_batch_table=per_batch,
    sm_scale=float(sm_scale),
    bq=bq,
    bk=bk,
    groups=H // K,
    interpret=interpret,
  )
  pad = lambda x, n, t: jnp.pad(
    x, ((0, 0), (0, 0), (0, t - n), (0, dims.Dp - D))
  )
  o = _flash(
    cfg,
    dims,
    pad(q_BxHxLxD, L, Lp),
    pad(k_BxKxSxD, S, Sp),
    pad(v_BxKxSxD, S, Sp),
    lsts,
    tuple(packed),
  )
  return o[:, :, :L, :D]


def flash_attention_compiled(
  q_BxHxLxD: jax.Array,
  k_BxKxSxD: jax.Array,
  v_BxKxSxD: jax.Array,
  mask: MaskSpec,
  *,
  sm_scale: float,
) -> jax.Array:
  """The TPU kernel when lowering for TPU, the GPU kernel for CUDA.

  Chosen at lowering time (``platform_call``), so ``jax.export`` from a CPU
  host gets the kernel of the platform it asks for.
  """

  def run(q, k, v, mask, platform):
    if platform == 'tpu':
      return flash_attention(q, k, v, mask, sm_scale, interpret=False)
    return flash_attention_gpu(q, k, v, mask, sm_scale=sm_scale)

  return platform_call(
    run,
    q_BxHxLxD,
    k_BxKxSxD,
    v_BxKxSxD,
    mask,
    platforms=('tpu', 'gpu'),
    interpret=False,
  )
