"""PD-SSM scan: h_t = A_t h_{t-1} + b_t with A_t = P_t D_t column one-hot.

A_t[:, j] = d_t[j] e_{p_t[j]}, i.e. (A h)[p[j]] += d[j] h[j] (PD-SSM,
arXiv 2509.22284). The scan element (p, d, b) is the affine map h -> A h + b and
composes in O(N) without forming a dense N x N matrix:
earlier (p_i, d_i, b_i) then later (p_j, d_j, b_j) gives
p = p_j[p_i], d = d_j[p_i] * d_i, b = scatter_add(p_j, d_j * b_i) + b_j.

The Pallas path has a hand-written backward: the adjoint state obeys
lam_t = g_t + A_next^T lam_next with (A^T g)[j] = d[j] g[p[j]] (a gather),
scanned against the forward direction by the transposed kernel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels._common import (
  check_float_dtype,
  compute_dtype,
  merge_planes,
  resolve_impl,
  split_planes,
)
from pallas_kernels.scan import _validate
from pallas_kernels.scan.kernels import pd_scan_planes


def pd_scan(
  p_idx_BxLxN: jax.Array,
  d_BxLxN: jax.Array,
  b_BxLxN: jax.Array,
  *,
  h0_BxN: jax.Array | None = None,
  reverse: bool = False,
  impl: str = 'auto',
) -> tuple[jax.Array, jax.Array]:
  """Scans h_t = P_t D_t h_{t-1} + b_t with column one-hot P_t.

  Args:
    p_idx_BxLxN: int32 in [0, N): column j of A_t has its entry in row
      p_idx[b, t, j]. Not checked at runtime (out-of-range rows are dropped
      or clamped depending on the impl).
    d_BxLxN: diagonal of D_t, complex or real.
    b_BxLxN: inputs, complex or real.
    h0_BxN: initial state (zeros if None).
    reverse: if True, h_t = A_t h_{t+1} + b_t scanning from t = L down to 1
      with h_{L+1} = h0 (the backward half of a bidirectional layer); h_last
      is then h_1.
    impl: 'auto' | 'reference' | 'xla' | 'pallas' | 'interpret'.

  Returns:
    (h_BxLxN, h_last_BxN) in the promoted dtype of d, b and h0 (half
    precision accumulates in float32). Gradients flow to d, b and h0.
  """
  impl = resolve_impl(impl, 'pd_scan')
  _validate.check_flags(reverse)
  shape = _validate.check_seq('p_idx_BxLxN', p_idx_BxLxN)
  _validate.check_index('p_idx_BxLxN', p_idx_BxLxN)
  _validate.check_seq('d_BxLxN', d_BxLxN, shape)
  _validate.check_seq('b_BxLxN', b_BxLxN, shape)
  check_float_dtype('d_BxLxN', d_BxLxN.dtype)
  check_float_dtype('b_BxLxN', b_BxLxN.dtype)
  B, _, N = shape
  _validate.check_h0(h0_BxN, B, N)
  dts = [d_BxLxN.dtype, b_BxLxN.dtype]
  if h0_BxN is not None:
    dts.append(h0_BxN.dtype)
  out_dtype = jnp.result_type(*dts)
  cdt = compute_dtype(*dts)
  p = p_idx_BxLxN.astype(jnp.int32)
  d = d_BxLxN.astype(cdt)
  b = b_BxLxN.astype(cdt)
  h0 = jnp.zeros((B, N), cdt) if h0_BxN is None else h0_BxN.astype(cdt)
  return _pd_dispatch(p, d, b, h0, reverse, impl, np.dtype(out_dtype))


# ------------------------------------------------------------ pure algebra --


def scatter_add_last(idx: jax.Array, vals: jax.Array) -> jax.Array:
  """out[..., i] = sum_{j: idx[..., j] == i} vals[..., j], batched."""
  n = idx.shape[-1]
  lead = idx.shape[:-1]
  rows = jnp.arange(math.prod(lead), dtype=jnp.int32)
  rows = rows.reshape(lead + (1,)) * n
  flat = (idx + rows).reshape(-1)
  out = jnp.zeros((flat.shape[0],), vals.dtype).at[flat].add(vals.reshape(-1))
  return out.reshape(vals.shape)


def pd_apply(p, d, h):
  """A h with A[:, j] = d[j] e_{p[j]}, over the last axis."""
  return scatter_add_last(p, d * h)


def pd_apply_transpose(p, d, g):
  """A^T g = d * g[p] (linear transpose, no conjugation)."""
  return d * jnp.take_along_axis(g, p, axis=-1)


def pd_combine(earlier, later):
  """Composes PD affine maps: apply ``earlier`` then ``later`` (O(N))."""
  p_i, d_i, b_i = earlier
  p_j, d_j, b_j = later
  p = jnp.take_along_axis(p_j, p_i, axis=-1)
  d = jnp.take_along_axis(d_j, p_i, axis=-1) * d_i
  b = scatter_add_last(p_j, d_j * b_i) + b_j
  return p, d, b


def pd_identity(shape, dtype):
  """Identity element (p = arange, d = 1, b = 0) of ``pd_combine``."""
  n = shape[-1]
  p = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), shape)
  return p, jnp.ones(shape, dtype), jnp.zeros(shape, dtype)


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _pd_dispatch(p, d, b, h0, reverse, impl, out_dtype):
  if impl == 'reference':
    h, hl = _pd_reference(p, d, b, h0, reverse)
  elif impl == 'xla':
    h, hl = _pd_associative(p, d, b, h0, reverse)
  else:
    h, hl = _pd_pallas(p, d, b, h0, reverse, impl == 'interpret')
  return h.astype(out_dtype), hl.astype(out_dtype)


def _pd_reference(p, d, b, h0, reverse):
  def step(h, x):
    h = pd_apply(x[0], x[1], h) + x[2]
    return h, h

  xs = tuple(jnp.swapaxes(x, 0, 1) for x in (p, d, b))
  hl, h = lax.scan(step, h0, xs, reverse=reverse)
  return jnp.swapaxes(h, 0, 1), hl


def _pd_associative(p, d, b, h0, reverse):
  first = -1 if reverse else 0
  b = b.at[:, first].add(pd_apply(p[:, first], d[:, first], h0))
  _, _, h = lax.associative_scan(pd_combine, (p, d, b), reverse=reverse, axis=1)
  return h, h[:, 0] if reverse else h[:, -1]


# ------------------------------------------------------------------ pallas --


def _run_kernel(p, d, b, h0, reverse, transpose, interpret):
  h, hl = pd_scan_planes(
    p,
    split_planes(d),
    split_planes(b),
    split_planes(h0),
    reverse=reverse,
    transpose=transpose,
    interpret=interpret,
  )
  return merge_planes(h), merge_planes(hl)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _pd_pallas(p, d, b, h0, reverse, interpret):
  return _run_kernel(p, d, b, h0, reverse, False, interpret)


def _pd_pallas_fwd(p, d, b, h0, reverse, interpret):
  h, hl = _run_kernel(p, d, b, h0, reverse, False, interpret)
  return (h, hl), (p, d, h, h0)


def _pd_pallas_bwd(reverse, interpret, res, cts):
  p, d, h, h0 = res
  g_h, g_hl = cts
  ident_p, ones, _ = pd_identity(p[:, :1].shape, d.dtype)
  if reverse:
    cp = jnp.concatenate([ident_p, p[:, :-1]], axis=1)
    cd = jnp.concatenate([ones, d[:, :-1]], axis=1)
    h_prev = jnp.concatenate([h[:, 1:], h0[:, None]], axis=1)
    edge = -1
  else:
    cp = jnp.concatenate([p[:, 1:], ident_p], axis=1)
    cd = jnp.concatenate([d[:, 1:], ones], axis=1)
    h_prev = jnp.concatenate([h0[:, None], h[:, :-1]], axis=1)
    edge = 0
  lam, _ = _run_kernel(cp, cd, g_h, g_hl, not reverse, True, interpret)
  g_d = jnp.take_along_axis(lam, p, axis=-1) * h_prev
  g_h0 = pd_apply_transpose(p[:, edge], d[:, edge], lam[:, edge])
  return None, g_d, lam, g_h0


_pd_pallas.defvjp(_pd_pallas_fwd, _pd_pallas_bwd)
