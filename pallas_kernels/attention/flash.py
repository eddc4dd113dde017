"""Flash attention in Pallas (TPU Mosaic layout; interpret mode on CPU).

TPU only: the scalar-prefetched tile table has no Triton lowering; the GPU
kernel is ``flash_gpu.py`` (``flash_gpu.flash_attention_compiled`` picks
between the two at lowering time).

Forward: grid (B, H, nq, nk) with the key-block axis innermost and
sequential; running max / sum / output accumulate in f32 VMEM scratch
(online softmax). A scalar-prefetched tile table (see ``mask.py``) decides
per tile: EMPTY tiles do no work and their key block is not fetched (the
index map repeats the previous block), FULL tiles skip the mask, PARTIAL
tiles evaluate the mask from positions (static kinds) or from small per-token
arrays (segment ids, group bit masks, key validity).

Backward (custom_vjp, hand written): one kernel accumulates dK and dV over
query blocks (grid (B, H, nk, nq)), one accumulates dQ over key blocks, both
recomputing P = exp(S - lse). dK/dV are produced per query head and summed
over each group of query heads sharing a key/value head (grouped-query
attention) outside the kernel.

Rows that see no key at all produce zeros (and zero gradients).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels._common import compiler_params, round_up
from pallas_kernels.attention.mask import (
  EMPTY,
  FULL,
  PARTIAL,
  MaskSpec,
  fetch_table,
  static_allowed,
  tile_table,
)

NEG = -1e30
BIG = 1e30
DEFAULT_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class Config:
  """Static description of one flash-attention call."""

  kind: str
  block_size: int
  prefix_len: int
  seq_len: int  # block_diffusion: the length n of each half
  has_qaux: bool
  has_kaux: bool
  has_kvalid: bool
  per_batch_table: bool
  sm_scale: float
  bq: int
  bk: int
  groups: int  # query heads per key/value head
  interpret: bool


def tile_mask(cfg: Config, i, j, qaux, kaux, kvalid):
  """(bq, bk) boolean mask of a tile from positions and aux rows."""
  qpos = i * cfg.bq + lax.broadcasted_iota(jnp.int32, (cfg.bq, cfg.bk), 0)
  kpos = j * cfg.bk + lax.broadcasted_iota(jnp.int32, (cfg.bq, cfg.bk), 1)
  if cfg.kind == 'segments':
    m = qaux == kaux
  elif cfg.kind == 'groups':
    m = (lax.shift_right_logical(qaux, kaux) & 1) == 1
  else:
    spec = MaskSpec(
      cfg.kind, cfg.block_size, cfg.prefix_len, seq_len=cfg.seq_len
    )
    m = static_allowed(spec, qpos, kpos)
    m = jnp.broadcast_to(m, (cfg.bq, cfg.bk))
  if kvalid is not None:
    m = m & (kvalid != 0)
  return m


def _split_refs(cfg: Config, refs):
  """Pops the optional (qaux, kaux, kvalid) refs from the front of refs."""
  out = []
  refs = list(refs)
  for flag in (cfg.has_qaux, cfg.has_kaux, cfg.has_kvalid):
    out.append(refs.pop(0) if flag else None)
  return out, refs


def _load_aux(qaux_ref, kaux_ref, kvalid_ref):
  qaux = None if qaux_ref is None else qaux_ref[0]  # (bq, 1)
  kaux = None if kaux_ref is None else kaux_ref[0]  # (1, bk)
  kvalid = None if kvalid_ref is None else kvalid_ref[0]
  return qaux, kaux, kvalid


def dot_nt(x, y):
  """x @ y.T with f32 accumulation."""
  return lax.dot_general(
    x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )


def dot_tn(x, y):
  """x.T @ y with f32 accumulation."""
  return lax.dot_general(
    x, y, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
  )


def dot_nn(x, y):
  return lax.dot_general(
    x, y, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
  )


def _tb(cfg: Config, b):
  return b if cfg.per_batch_table else 0


# ------------------------------------------------------------------ forward --


def _fwd_kernel(tbl_ref, fetch_ref, q_ref, k_ref, v_ref, *refs, cfg: Config):
  (qaux_ref, kaux_ref, kvalid_ref), refs = _split_refs(cfg, refs)
  o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  tile = tbl_ref[_tb(cfg, b), i, j]

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, NEG, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

  def compute(masked: bool):
    q, k, v = q_ref[0, 0], k_ref[0, 0], v_ref[0, 0]
    s = dot_nt(q, k) * cfg.sm_scale
    if masked:
      mask = tile_mask(cfg, i, j, *_load_aux(qaux_ref, kaux_ref, kvalid_ref))
      s = jnp.where(mask, s, NEG)
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_new)
    if masked:
      p = jnp.where(mask, p, 0.0)
    alpha = jnp.exp(m_prev - m_new)
    l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + dot_nn(p.astype(v.dtype), v)
    m_sc[...] = m_new

  @pl.when(tile == FULL)
  def _full():
    compute(False)

  @pl.when(tile == PARTIAL)
  def _partial():
    compute(True)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    denom = l_sc[...]
    seen = denom > 0.0
    safe_l = jnp.where(seen, denom, 1.0)
    o_ref[0, 0] = jnp.where(seen, acc_sc[...] / safe_l, 0.0).astype(o_ref.dtype)
    lse_ref[0, 0] = jnp.where(seen, m_sc[...] + jnp.log(safe_l), BIG)


def _specs(cfg: Config, D: int, outer_q: bool):
  """BlockSpecs for q-side and k-side operands for either grid order.

  outer_q=True: grid (B, H, nq, nk) (forward, dQ); else (B, H, nk, nq).
  The inner block index goes through the fetch table.
  """
  G = cfg.groups

  def qk(b, h, x, y, tbl, fetch):
    if outer_q:
      return x, fetch[_tb(cfg, b), x, y]
    return fetch[_tb(cfg, b), x, y], x

  q_spec = pl.BlockSpec(
    (1, 1, cfg.bq, D),
    lambda b, h, x, y, t, f: (b, h, qk(b, h, x, y, t, f)[0], 0),
  )
  row_spec = pl.BlockSpec(
    (1, 1, cfg.bq, 1),
    lambda b, h, x, y, t, f: (b, h, qk(b, h, x, y, t, f)[0], 0),
  )
  kv_spec = pl.BlockSpec(
    (1, 1, cfg.bk, D),
    lambda b, h, x, y, t, f: (b, lax.div(h, G), qk(b, h, x, y, t, f)[1], 0),
  )
  kh_spec = pl.BlockSpec(
    (1, 1, cfg.bk, D),
    lambda b, h, x, y, t, f: (b, h, qk(b, h, x, y, t, f)[1], 0),
  )
  qaux_spec = pl.BlockSpec(
    (1, cfg.bq, 1), lambda b, h, x, y, t, f: (b, qk(b, h, x, y, t, f)[0], 0)
  )
  kaux_spec = pl.BlockSpec(
    (1, 1, cfg.bk), lambda b, h, x, y, t, f: (b, 0, qk(b, h, x, y, t, f)[1])
  )
  return q_spec, row_spec, kv_spec, kh_spec, qaux_spec, kaux_spec


def _aux_specs(cfg, qaux_spec, kaux_spec):
  specs = []
  if cfg.has_qaux:
    specs.append(qaux_spec)
  if cfg.has_kaux:
    specs.append(kaux_spec)
  if cfg.has_kvalid:
    specs.append(kaux_spec)
  return specs


def _params(cfg: Config):
  return compiler_params(
    'interpret' if cfg.interpret else 'tpu',
    dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary'),
  )


def _forward(cfg: Config, q, k, v, tbl, fetch, aux):
  B, H, Lp, D = q.shape
  nq, nk = Lp // cfg.bq, k.shape[2] // cfg.bk
  q_spec, row_spec, kv_spec, _, qaux_spec, kaux_spec = _specs(cfg, D, True)
  grid_spec = pltpu.PrefetchScalarGridSpec(
    num_scalar_prefetch=2,
    grid=(B, H, nq, nk),
    in_specs=[q_spec, kv_spec, kv_spec] + _aux_specs(cfg, qaux_spec, kaux_spec),
    out_specs=[q_spec, row_spec],
    scratch_shapes=[
      pltpu.VMEM((cfg.bq, 1), jnp.float32),
      pltpu.VMEM((cfg.bq, 1), jnp.float32),
      pltpu.VMEM((cfg.bq, D), jnp.float32),
    ],
  )
  return pl.pallas_call(
    functools.partial(_fwd_kernel, cfg=cfg),
    out_shape=[
      jax.ShapeDtypeStruct(q.shape, q.dtype),
      jax.ShapeDtypeStruct((B, H, Lp, 1), jnp.float32),
    ],
    grid_spec=grid_spec,
    interpret=cfg.interpret,
    compiler_params=_params(cfg),
    name='flash_fwd',
  )(tbl, fetch, q, k, v, *aux)


# ----------------------------------------------------------------- backward --


def _recompute(cfg, i, j, q, k, lse, aux_refs, masked):
  s = dot_nt(q, k) * cfg.sm_scale
  p = jnp.exp(s - lse)
  if masked:
    mask = tile_mask(cfg, i, j, *_load_aux(*aux_refs))
    p = jnp.where(mask, p, 0.0)
  return p


def _dkv_kernel(tbl_ref, fetch_ref, q_ref, k_ref, v_ref, do_ref, lse_ref,
                delta_ref, *refs, cfg: Config):  # fmt: skip
  aux_refs, refs = _split_refs(cfg, refs)
  dk_ref, dv_ref, dk_sc, dv_sc = refs
  b, j, i = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  tile = tbl_ref[_tb(cfg, b), j, i]  # transposed table: (key, query)

  @pl.when(i == 0)
  def _init():
    dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

  def compute(masked):
    q, k, v, do = q_ref[0, 0], k_ref[0, 0], v_ref[0, 0], do_ref[0, 0]
    p = _recompute(cfg, i, j, q, k, lse_ref[0, 0], aux_refs, masked)
    dv_sc[...] += dot_tn(p.astype(do.dtype), do)
    dp = dot_nt(do, v)
    ds = p * (dp - delta_ref[0, 0])
    dk_sc[...] += dot_tn(ds.astype(q.dtype), q) * cfg.sm_scale

  @pl.when(tile == FULL)
  def _full():
    compute(False)

  @pl.when(tile == PARTIAL)
  def _partial():
    compute(True)

  @pl.when(i == pl.num_programs(3) - 1)
  def _finish():
    dk_ref[0, 0] = dk_sc[...].astype(dk_ref.dtype)
    dv_ref[0, 0] = dv_sc[...].astype(dv_ref.dtype)


def _dq_kernel(tbl_ref, fetch_ref, q_ref, k_ref, v_ref, do_ref, lse_ref,
               delta_ref, *refs, cfg: Config):  # fmt: skip
  aux_refs, refs = _split_refs(cfg, refs)
  dq_ref, dq_sc = refs
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  tile = tbl_ref[_tb(cfg, b), i, j]

  @pl.when(j == 0)
  def _init():
    dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

  def compute(masked):
    q, k, v, do = q_ref[0, 0], k_ref[0, 0], v_ref[0, 0], do_ref[0, 0]
    p = _recompute(cfg, i, j, q, k, lse_ref[0, 0], aux_refs, masked)
    ds = p * (dot_nt(do, v) - delta_ref[0, 0])
    dq_sc[...] += dot_nn(ds.astype(k.dtype), k) * cfg.sm_scale

  @pl.when(tile == FULL)
  def _full():
    compute(False)

  @pl.when(tile == PARTIAL)
  def _partial():
    compute(True)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[0, 0] = dq_sc[...].astype(dq_ref.dtype)


def _backward(cfg, q, k, v, o, lse, do, tbl, fetch, tbl_t, fetch_t, aux):
  B, H, Lp, D = q.shape
  Sp = k.shape[2]
  nq, nk = Lp // cfg.bq, Sp // cfg.bk
  delta = jnp.sum(
    o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True
  )
  # dK, dV: grid (B, H, nk, nq).
  q_spec, row_spec, kv_spec, kh_spec, qaux_spec, kaux_spec = _specs(
    cfg, D, False
  )
  dk, dv = pl.pallas_call(
    functools.partial(_dkv_kernel, cfg=cfg),
    out_shape=[jax.ShapeDtypeStruct((B, H, Sp, D), jnp.float32)] * 2,
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(B, H, nk, nq),
      in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec]
      + _aux_specs(cfg, qaux_spec, kaux_spec),
      out_specs=[kh_spec, kh_spec],
      scratch_shapes=[pltpu.VMEM((cfg.bk, D), jnp.float32)] * 2,
    ),
    interpret=cfg.interpret,
    compiler_params=_params(cfg),
    name='flash_dkv',
  )(tbl_t, fetch_t, q, k, v, do, lse, delta, *aux)
  # dQ: grid (B, H, nq, nk).
  q_spec, row_spec, kv_spec, _, qaux_spec, kaux_spec = _specs(cfg, D, True)
  dq = pl.pallas_call(
    functools.partial(_dq_kernel, cfg=cfg),
    out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(B, H, nq, nk),
      in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec]
      + _aux_specs(cfg, qaux_spec, kaux_spec),
      out_specs=q_spec,
      scratch_shapes=[pltpu.VMEM((cfg.bq, D), jnp.float32)],
    ),
    interpret=cfg.interpret,
    compiler_params=_params(cfg),
    name='flash_dq',
  )(tbl, fetch, q, k, v, do, lse, delta, *aux)
  K = k.shape[1]
  dk = dk.reshape(B, K, cfg.groups, Sp, D).sum(axis=2).astype(k.dtype)
  dv = dv.reshape(B, K, cfg.groups, Sp, D).sum(axis=2).astype(v.dtype)
  return dq, dk, dv


# ------------------------------------------------------------------ wrapper --


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, tables, aux):
  o, _ = _forward(cfg, q, k, v, tables[0], tables[1], aux)
  return o


def _flash_fwd(cfg, q, k, v, tables, aux):
  o, lse = _forward(cfg, q, k, v, tables[0], tables[1], aux)
  return o, (q, k, v, o, lse, tables, aux)


def _flash_bwd(cfg, res, do):
  q, k, v, o, lse, tables, aux = res
  dq, dk, dv = _backward(cfg, q, k, v, o, lse, do, *tables, aux)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def block_sizes(L: int, S: int, block_q: int, block_k: int):
  """Whole axis if it fits in one block, else the (8/128-aligned) block."""
  bq = L if L <= block_q else block_q
  bk = S if S <= block_k else block_k
  return bq, bk


def flash_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: MaskSpec,
  sm_scale: float,
  *,
  interpret: bool,
  block_q: int = DEFAULT_BLOCK,
  block_k: int = DEFAULT_BLOCK,
) -> jax.Array:
  """Pads to whole blocks, builds tables and aux rows, runs the kernel."""
  B, H, L, D = q.shape
  K, S = k.shape[1], k.shape[2]
  bq, bk = block_sizes(L, S, block_q, block_k)
  Lp, Sp = round_up(L, bq), round_up(S, bk)
  table = tile_table(mask, B, L, S, bq, bk)
  per_batch = not isinstance(table, np.ndarray)
  if per_batch:
    table_t = jnp.swapaxes(table, 1, 2)
  else:
    table_t = np.ascontiguousarray(np.swapaxes(table, 1, 2))
  tables = tuple(
    jnp.asarray(x, jnp.int32)
    for x in (table, fetch_table(table), table_t, fetch_table(table_t))
  )
  aux = []
  has_qaux = has_kaux = False
  kvalid = mask.kv_valid_BxS
  if mask.kind == 'segments':
    aux += [mask.q_ids_BxL, mask.kv_ids_BxS]
    has_qaux = has_kaux = True
  elif mask.kind == 'groups':
    G = mask.visible_BxGxG.shape[-1]
    kid = mask.kv_ids_BxS
    in_range = (kid >= 0) & (kid < G)
    aux += [mask.query_bits(), jnp.clip(kid, 0, G - 1)]
    has_qaux = has_kaux = True
    kvalid = in_range if kvalid is None else kvalid & in_range
  if kvalid is None and Sp != S:
    kvalid = jnp.ones((B, S), bool)
  pad_l = lambda x: jnp.pad(x, ((0, 0), (0, Lp - L)))
  pad_s = lambda x: jnp.pad(x, ((0, 0), (0, Sp - S)))
  packed = []
  if has_qaux:
    packed.append(pad_l(aux[0].astype(jnp.int32))[:, :, None])
  if has_kaux:
    packed.append(pad_s(aux[1].astype(jnp.int32))[:, None, :])
  if kvalid is not None:
    packed.append(pad_s(kvalid.astype(jnp.int32))[:, None, :])
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
  pad4 = lambda x, n, t: jnp.pad(x, ((0, 0), (0, 0), (0, t - n), (0, 0)))
  o = _flash(
    cfg,
    pad4(q, L, Lp),
    pad4(k, S, Sp),
    pad4(v, S, Sp),
    tables,
    tuple(packed),
  )
  return o[:, :, :L]


def skipped_fraction(mask: MaskSpec, B: int, L: int, S: int, block=128):
  """Fractions of (EMPTY, FULL) tiles for a mask at the default blocks."""
  bq, bk = block_sizes(L, S, block, block)
  table = np.asarray(tile_table(mask, B, L, S, bq, bk))
  return float(np.mean(table == EMPTY)), float(np.mean(table == FULL))
