"""Pallas kernels for the linear (diagonal) and PD scans.

Layout: inputs are (B, L, N) planes (complex arrays arrive as real and
imaginary planes, see ``_common``). The grid is (B, N / bn, L / bl) for the
diagonal scan and (B, L / bl) for the PD scan (the permutation mixes all N
lanes, so N is one block). The time axis is the last grid axis and runs
sequentially ('arbitrary'); inside a block the kernel steps through its bl
time steps one row at a time. The running state lives in the ``h_last``
output block, whose index map ignores the time-block index, so it stays
resident across time blocks (the accumulator pattern) and is written back
once per (batch, lane-block).

For ``reverse=True`` the time blocks are visited from last to first and the
rows inside a block from bottom to top.

The PD step (A h)[p[j]] += d[j] h[j] is a scatter-add over lanes. Mosaic has
no lane scatter, so inside the kernel it is a product with a one-hot
predicate E[i, j] = (p[j] == i) built from an iota in registers, i.e.
new = v @ E^T with v = d * h; the transposed step (A^T g)[j] = d[j] g[p[j]]
is d * (g @ E). E is a per-step (N, N) temporary in vector registers/VMEM;
no dense transition matrix is ever stored in HBM, and the combine used by
the associative (xla) path stays O(N).

The layout above follows TPU (Mosaic) rules: blocks are full array dims or
multiples of (8, 128), and time blocks run in order ('arbitrary').

GPU (Triton) has neither sequential grid axes nor scratch memory: every
program is independent. The GPU kernels therefore run the whole time axis
inside one program (grid (B, N / bn) for the diagonal scan, (B,) for PD),
carry the state in registers through a ``fori_loop`` over time and load and
store one (bn,) row per step; lane blocks are powers of two (Triton's rule
for every tensor), and the PD lane mixing is a masked broadcast-and-reduce
over an (N, N) one-hot predicate (``tl.dot`` needs 16 rows, a single state
row has one). Which kernel runs is decided at lowering time
(``_common.platform_call``), so export from a CPU host lowers either.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._common import (
  Planes,
  cadd,
  cmul,
  compiler_params,
  next_pow2,
  platform_call,
  round_up,
)

DEFAULT_BLOCK_L = 128
LANE = 128
# GPU lane block of the diagonal scan (a power of two; 64 lanes = 2 warps,
# one lane per thread) and the warps of each GPU kernel. Not tuned: no GPU
# benchmark has been run.
GPU_LANES = 64
GPU_WARPS_LINEAR = 2
GPU_WARPS_PD = 8
LAYOUTS = ('tpu', 'gpu')


def _plan(L: int, N: int, *, mix_lanes: bool, block_l: int):
  """Chooses (bl, L_pad, bn, N_pad) for a scan kernel (TPU layout)."""
  if L <= block_l:
    bl, L_pad = L, L
  else:
    bl = round_up(block_l, 8)
    L_pad = round_up(L, bl)
  if mix_lanes or N <= LANE:
    bn, N_pad = N, N
  else:
    bn, N_pad = LANE, round_up(N, LANE)
  return bl, L_pad, bn, N_pad


def _pad(x: jax.Array, L_pad: int, N_pad: int, value) -> jax.Array:
  _, L, N = x.shape
  if L_pad == L and N_pad == N:
    return x
  return jnp.pad(
    x, ((0, 0), (0, L_pad - L), (0, N_pad - N)), constant_values=value
  )


def _pad_lanes(x: jax.Array, N_pad: int) -> jax.Array:
  N = x.shape[-1]
  if N_pad == N:
    return x
  return jnp.pad(x, ((0, 0), (0, N_pad - N)))


def _tpu_params(interpret: bool, semantics: tuple[str, ...]):
  platform = 'interpret' if interpret else 'tpu'
  return compiler_params(platform, dimension_semantics=semantics)


def _gpu_params(interpret: bool, num_warps: int):
  platform = 'interpret' if interpret else 'gpu'
  return compiler_params(platform, num_warps=num_warps, num_stages=1)


def _check_layout(layout: str) -> None:
  if layout not in LAYOUTS:
    raise ValueError(f'layout must be one of {LAYOUTS}, got {layout!r}.')


# ----------------------------------------------------------------- linear --


def _linear_kernel(*refs, k: int, bl: int, reverse: bool):
  a_refs, b_refs, h0_refs = refs[:k], refs[k : 2 * k], refs[2 * k : 3 * k]
  h_refs, hl_refs = refs[3 * k : 4 * k], refs[4 * k : 5 * k]

  @pl.when(pl.program_id(2) == 0)
  def _init():
    for hl, h0 in zip(hl_refs, h0_refs):
      hl[...] = h0[...]

  def step(i, h):
    t = bl - 1 - i if reverse else i
    a = tuple(r[0, pl.ds(t, 1), :] for r in a_refs)
    b = tuple(r[0, pl.ds(t, 1), :] for r in b_refs)
    h = cadd(cmul(a, h), b)
    for r, v in zip(h_refs, h):
      r[0, pl.ds(t, 1), :] = v
    return h

  h = lax.fori_loop(0, bl, step, tuple(r[0] for r in hl_refs))
  for r, v in zip(hl_refs, h):
    r[0] = v


def linear_scan_planes(
  a: Planes,
  b: Planes,
  h0: Planes,
  *,
  reverse: bool,
  interpret: bool,
  block_l: int = DEFAULT_BLOCK_L,
  layout: str = 'tpu',
) -> tuple[Planes, Planes]:
  """Runs the diagonal scan kernel on planes; returns (h, h_last) planes.

  Compiled (interpret=False): the TPU or the GPU kernel, whichever platform
  is being lowered for. Interpret mode runs the kernel of ``layout``.
  """
  _check_layout(layout)

  def run(a, b, h0, platform):
    kind = layout if platform == 'interpret' else platform
    fn = _linear_tpu if kind == 'tpu' else _linear_gpu
    return fn(a, b, h0, reverse=reverse, interpret=interpret, block_l=block_l)

  return platform_call(run, a, b, h0, platforms=LAYOUTS, interpret=interpret)


def _linear_tpu(
  a: Planes,
  b: Planes,
  h0: Planes,
  *,
  reverse: bool,
  interpret: bool,
  block_l: int,
) -> tuple[Planes, Planes]:
  """TPU (Mosaic) diagonal scan: time blocks on a sequential grid axis."""
  k = len(a)
  B, L, N = a[0].shape
  bl, L_pad, bn, N_pad = _plan(L, N, mix_lanes=False, block_l=block_l)
  ones = (1.0, 0.0)[:k]
  a = tuple(_pad(x, L_pad, N_pad, v) for x, v in zip(a, ones))
  b = tuple(_pad(x, L_pad, N_pad, 0.0) for x in b)
  h0 = tuple(_pad_lanes(x, N_pad)[:, None, :] for x in h0)
  nl = L_pad // bl
  if reverse:
    seq_map = lambda i, j, t: (i, nl - 1 - t, j)
  else:
    seq_map = lambda i, j, t: (i, t, j)
  seq_spec = pl.BlockSpec((1, bl, bn), seq_map)
  state_spec = pl.BlockSpec((1, 1, bn), lambda i, j, t: (i, 0, j))
  dtype = a[0].dtype
  out_shape = [jax.ShapeDtypeStruct((B, L_pad, N_pad), dtype)] * k + [
    jax.ShapeDtypeStruct((B, 1, N_pad), dtype)
  ] * k
  outs = pl.pallas_call(
    functools.partial(_linear_kernel, k=k, bl=bl, reverse=reverse),
    out_shape=out_shape,
    grid=(B, N_pad // bn, nl),
    in_specs=[seq_spec] * (2 * k) + [state_spec] * k,
    out_specs=[seq_spec] * k + [state_spec] * k,
    interpret=interpret,
    compiler_params=_tpu_params(
      interpret, ('parallel', 'parallel', 'arbitrary')
    ),
    name='linear_scan',
  )(*a, *b, *h0)
  h = tuple(x[:, :L, :N] for x in outs[:k])
  h_last = tuple(x[:, 0, :N] for x in outs[k:])
  return h, h_last


# --------------------------------------------------------------------- PD --


def _onehot_apply(p_row, v: Planes, transpose: bool) -> Planes:
  """A-style lane mixing with the one-hot predicate E[i, j] = (p[j] == i).

  transpose=False: out[i] = sum_j E[i, j] v[j] (scatter-add of v to p).
  transpose=True: out[j] = sum_i E[i, j] v[i] = v[p[j]] (gather).
  """
  n = p_row.shape[-1]
  rows = lax.broadcasted_iota(jnp.int32, (n, n), 0)
  e = (rows == p_row).astype(v[0].dtype)
  stacked = jnp.concatenate(v, axis=0) if len(v) > 1 else v[0]
  contract = ((1,), (0,)) if transpose else ((1,), (1,))
  out = lax.dot_general(
    stacked,
    e,
    (contract, ((), ())),
    precision=lax.Precision.HIGHEST,
    preferred_element_type=v[0].dtype,
  )
  return tuple(out[i : i + 1] for i in range(len(v)))


def _pd_kernel(p_ref, *refs, k: int, bl: int, reverse: bool, transpose: bool):
  d_refs, b_refs, h0_refs = refs[:k], refs[k : 2 * k], refs[2 * k : 3 * k]
  h_refs, hl_refs = refs[3 * k : 4 * k], refs[4 * k : 5 * k]

  @pl.when(pl.program_id(1) == 0)
  def _init():
    for hl, h0 in zip(hl_refs, h0_refs):
      hl[...] = h0[...]

  def step(i, h):
    t = bl - 1 - i if reverse else i
    p = p_ref[0, pl.ds(t, 1), :]
    d = tuple(r[0, pl.ds(t, 1), :] for r in d_refs)
    b = tuple(r[0, pl.ds(t, 1), :] for r in b_refs)
    if transpose:
      h = cmul(d, _onehot_apply(p, h, transpose=True))
    else:
      h = _onehot_apply(p, cmul(d, h), transpose=False)
    h = cadd(h, b)
    for r, v in zip(h_refs, h):
      r[0, pl.ds(t, 1), :] = v
    return h

  h = lax.fori_loop(0, bl, step, tuple(r[0] for r in hl_refs))
  for r, v in zip(hl_refs, h):
    r[0] = v


def pd_scan_planes(
  p: jax.Array,
  d: Planes,
  b: Planes,
  h0: Planes,
  *,
  reverse: bool,
  transpose: bool,
  interpret: bool,
  block_l: int = DEFAULT_BLOCK_L,
  layout: str = 'tpu',
) -> tuple[Planes, Planes]:
  """Runs the PD scan kernel (or its transpose) on planes.

  transpose=False: h_t = A_t h_prev + b_t; transpose=True: h_t = A_t^T
  h_prev + b_t, with A_t[:, j] = d_t[j] e_{p_t[j]}. Kernel choice as in
  ``linear_scan_planes``.
  """
  _check_layout(layout)

  def run(p, d, b, h0, platform):
    kind = layout if platform == 'interpret' else platform
    fn = _pd_tpu if kind == 'tpu' else _pd_gpu
    return fn(
      p,
      d,
      b,
      h0,
      reverse=reverse,
      transpose=transpose,
      interpret=interpret,
      block_l=block_l,
    )

  return platform_call(run, p, d, b, h0, platforms=LAYOUTS, interpret=interpret)


def _pd_tpu(
  p: jax.Array,
  d: Planes,
  b: Planes,
  h0: Planes,
  *,
  reverse: bool,
  transpose: bool,
  interpret: bool,
  block_l: int,
) -> tuple[Planes, Planes]:
  """TPU (Mosaic) PD scan: time blocks on a sequential grid axis."""
  k = len(d)
  B, L, N = p.shape
  bl, L_pad, _, N_pad = _plan(L, N, mix_lanes=True, block_l=block_l)
  # Padding steps are the identity; padding lanes map to themselves with
  # d = 0, so they never feed the real lanes.
  lane = jnp.arange(N_pad, dtype=jnp.int32)
  if L_pad != L or N_pad != N:
    p_full = jnp.broadcast_to(lane, (B, L_pad, N_pad))
    p = p_full.at[:, :L, :N].set(p)
    one_re = jnp.ones((B, L_pad, N_pad), d[0].dtype).at[:, L:, :].set(1.0)
    one_re = one_re.at[:, :, N:].set(0.0)
    fill = (one_re, jnp.zeros_like(one_re))[:k]
    d = tuple(f.at[:, :L, :N].set(x) for f, x in zip(fill, d))
  b = tuple(_pad(x, L_pad, N_pad, 0.0) for x in b)
  h0 = tuple(_pad_lanes(x, N_pad)[:, None, :] for x in h0)
  nl = L_pad // bl
  if reverse:
    seq_map = lambda i, t: (i, nl - 1 - t, 0)
  else:
    seq_map = lambda i, t: (i, t, 0)
  seq_spec = pl.BlockSpec((1, bl, N_pad), seq_map)
  state_spec = pl.BlockSpec((1, 1, N_pad), lambda i, t: (i, 0, 0))
  dtype = d[0].dtype
  out_shape = [jax.ShapeDtypeStruct((B, L_pad, N_pad), dtype)] * k + [
    jax.ShapeDtypeStruct((B, 1, N_pad), dtype)
  ] * k
  outs = pl.pallas_call(
    functools.partial(
      _pd_kernel, k=k, bl=bl, reverse=reverse, transpose=transpose
    ),
    out_shape=out_shape,
    grid=(B, nl),
    in_specs=[seq_spec] * (1 + 2 * k) + [state_spec] * k,
    out_specs=[seq_spec] * k + [state_spec] * k,
    interpret=interpret,
    compiler_params=_tpu_params(interpret, ('parallel', 'arbitrary')),
    name='pd_scan_t' if transpose else 'pd_scan',
  )(p, *d, *b, *h0)
  h = tuple(x[:, :L, :N] for x in outs[:k])
  h_last = tuple(x[:, 0, :N] for x in outs[k:])
  return h, h_last


# -------------------------------------------------------------- GPU (Triton) --


def _pad_pd(p, d, N_pad):
  """Pads lanes to N_pad: extra lanes map to themselves with d = 0."""
  B, L, N = p.shape
  if N_pad == N:
    return p, d
  lane = jnp.arange(N_pad, dtype=jnp.int32)
  p = jnp.broadcast_to(lane, (B, L, N_pad)).at[:, :, :N].set(p)
  d = tuple(_pad(x, L, N_pad, 0.0) for x in d)
  return p, d


def _gpu_linear_kernel(*refs, k: int, L: int, reverse: bool):
  a_refs, b_refs, h0_refs = refs[:k], refs[k : 2 * k], refs[2 * k : 3 * k]
  h_refs, hl_refs = refs[3 * k : 4 * k], refs[4 * k : 5 * k]

  def step(i, h):
    t = L - 1 - i if reverse else i
    a = tuple(r[t, :] for r in a_refs)
    b = tuple(r[t, :] for r in b_refs)
    h = cadd(cmul(a, h), b)
    for r, v in zip(h_refs, h):
      r[t, :] = v
    return h

  h = lax.fori_loop(0, L, step, tuple(r[...] for r in h0_refs))
  for r, v in zip(hl_refs, h):
    r[...] = v


def _linear_gpu(
  a: Planes,
  b: Planes,
  h0: Planes,
  *,
  reverse: bool,
  interpret: bool,
  block_l: int,
) -> tuple[Planes, Planes]:
  """GPU (Triton) diagonal scan: one program per (batch, lane block)."""
  del block_l  # the whole time axis runs inside each program
  k = len(a)
  B, L, N = a[0].shape
  bn = min(next_pow2(N), GPU_LANES)
  N_pad = round_up(N, bn)
  a = tuple(_pad(x, L, N_pad, 0.0) for x in a)
  b = tuple(_pad(x, L, N_pad, 0.0) for x in b)
  h0 = tuple(_pad_lanes(x, N_pad) for x in h0)
  seq_spec = pl.BlockSpec((None, L, bn), lambda i, j: (i, 0, j))
  state_spec = pl.BlockSpec((None, bn), lambda i, j: (i, j))
  dtype = a[0].dtype
  out_shape = [jax.ShapeDtypeStruct((B, L, N_pad), dtype)] * k + [
    jax.ShapeDtypeStruct((B, N_pad), dtype)
  ] * k
  outs = pl.pallas_call(
    functools.partial(_gpu_linear_kernel, k=k, L=L, reverse=reverse),
    out_shape=out_shape,
    grid=(B, N_pad // bn),
    in_specs=[seq_spec] * (2 * k) + [state_spec] * k,
    out_specs=[seq_spec] * k + [state_spec] * k,
    interpret=interpret,
    compiler_params=_gpu_params(interpret, GPU_WARPS_LINEAR),
    name='linear_scan_gpu',
  )(*a, *b, *h0)
  h = tuple(x[:, :, :N] for x in outs[:k])
  h_last = tuple(x[:, :N] for x in outs[k:])
  return h, h_last


def _mix_lanes(p, v: Planes, transpose: bool) -> Planes:
  """Lane mixing with E[i, j] = (p[j] == i) as a masked reduce (1-D rows).

  transpose=False: out[i] = sum_j E[i, j] v[j]; transpose=True: out[j] =
  sum_i E[i, j] v[i] = v[p[j]].
  """
  n = p.shape[0]
  e = lax.broadcasted_iota(jnp.int32, (n, n), 0) == p[None, :]
  if transpose:
    return tuple(jnp.sum(jnp.where(e, x[:, None], 0.0), axis=0) for x in v)
  return tuple(jnp.sum(jnp.where(e, x[None, :], 0.0), axis=1) for x in v)


def _gpu_pd_kernel(p_ref, *refs, k: int, L: int, reverse: bool, transpose):
  d_refs, b_refs, h0_refs = refs[:k], refs[k : 2 * k], refs[2 * k : 3 * k]
  h_refs, hl_refs = refs[3 * k : 4 * k], refs[4 * k : 5 * k]

  def step(i, h):
    t = L - 1 - i if reverse else i
    p = p_ref[t, :]
    d = tuple(r[t, :] for r in d_refs)
    b = tuple(r[t, :] for r in b_refs)
    if transpose:
      h = cmul(d, _mix_lanes(p, h, transpose=True))
    else:
      h = _mix_lanes(p, cmul(d, h), transpose=False)
    h = cadd(h, b)
    for r, v in zip(h_refs, h):
      r[t, :] = v
    return h

  h = lax.fori_loop(0, L, step, tuple(r[...] for r in h0_refs))
  for r, v in zip(hl_refs, h):
    r[...] = v


def _pd_gpu(
  p: jax.Array,
  d: Planes,
  b: Planes,
  h0: Planes,
  *,
  reverse: bool,
  transpose: bool,
  interpret: bool,
  block_l: int,
) -> tuple[Planes, Planes]:
  """GPU (Triton) PD scan: one program per batch row, all N lanes."""
  del block_l
  k = len(d)
  B, L, N = p.shape
  N_pad = next_pow2(N)
  p, d = _pad_pd(p, d, N_pad)
  b = tuple(_pad(x, L, N_pad, 0.0) for x in b)
  h0 = tuple(_pad_lanes(x, N_pad) for x in h0)
  seq_spec = pl.BlockSpec((None, L, N_pad), lambda i: (i, 0, 0))
  state_spec = pl.BlockSpec((None, N_pad), lambda i: (i, 0))
  dtype = d[0].dtype
  out_shape = [jax.ShapeDtypeStruct((B, L, N_pad), dtype)] * k + [
    jax.ShapeDtypeStruct((B, N_pad), dtype)
  ] * k
  outs = pl.pallas_call(
    functools.partial(
      _gpu_pd_kernel, k=k, L=L, reverse=reverse, transpose=transpose
    ),
    out_shape=out_shape,
    grid=(B,),
    in_specs=[seq_spec] * (1 + 2 * k) + [state_spec] * k,
    out_specs=[seq_spec] * k + [state_spec] * k,
    interpret=interpret,
    compiler_params=_gpu_params(interpret, GPU_WARPS_PD),
    name='pd_scan_t_gpu' if transpose else 'pd_scan_gpu',
  )(p, *d, *b, *h0)
  h = tuple(x[:, :, :N] for x in outs[:k])
  h_last = tuple(x[:, :N] for x in outs[k:])
  return h, h_last
