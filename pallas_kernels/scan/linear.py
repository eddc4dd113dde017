"""Diagonal linear recurrence h_t = a_t * h_{t-1} + b_t (real or complex).

Three implementations share one API: a sequential ``lax.scan`` reference, an
associative scan (``lax.associative_scan``, O(log L) depth), and a chunked
Pallas kernel with a hand-written backward (``jax.custom_vjp``): the adjoint
of a diagonal scan is the same scan run in the opposite direction with the
coefficients shifted by one step.
"""

from __future__ import annotations

import functools

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
from pallas_kernels.scan.kernels import linear_scan_planes


def linear_scan(
  a_BxLxN: jax.Array,
  b_BxLxN: jax.Array,
  *,
  h0_BxN: jax.Array | None = None,
  reverse: bool = False,
  impl: str = 'auto',
) -> tuple[jax.Array, jax.Array]:
  """Scans h_t = a_t * h_{t-1} + b_t over the time axis.

  Args:
    a_BxLxN: decay coefficients, real or complex.
    b_BxLxN: inputs, real or complex, same shape.
    h0_BxN: initial state (zeros if None).
    reverse: if True, scan from the end: h_t = a_t * h_{t+1} + b_t with
      h_{L+1} = h0 (for bidirectional layers); h_last is then h_1.
    impl: 'auto' | 'reference' | 'xla' | 'pallas' | 'interpret'.

  Returns:
    (h_BxLxN, h_last_BxN), in the promoted input dtype. Half precision
    inputs are accumulated in float32 and the result cast back.
  """
  impl = resolve_impl(impl, 'linear_scan')
  _validate.check_flags(reverse)
  shape = _validate.check_seq('a_BxLxN', a_BxLxN)
  _validate.check_seq('b_BxLxN', b_BxLxN, shape)
  check_float_dtype('a_BxLxN', a_BxLxN.dtype)
  check_float_dtype('b_BxLxN', b_BxLxN.dtype)
  B, _, N = shape
  _validate.check_h0(h0_BxN, B, N)
  dts = [a_BxLxN.dtype, b_BxLxN.dtype]
  if h0_BxN is not None:
    dts.append(h0_BxN.dtype)
  out_dtype = jnp.result_type(*dts)
  cdt = compute_dtype(*dts)
  a = a_BxLxN.astype(cdt)
  b = b_BxLxN.astype(cdt)
  h0 = jnp.zeros((B, N), cdt) if h0_BxN is None else h0_BxN.astype(cdt)
  return _linear_dispatch(a, b, h0, reverse, impl, np.dtype(out_dtype))


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _linear_dispatch(a, b, h0, reverse, impl, out_dtype):
  if impl == 'reference':
    h, hl = _linear_reference(a, b, h0, reverse)
  elif impl == 'xla':
    h, hl = _linear_associative(a, b, h0, reverse)
  else:
    h, hl = _linear_pallas(a, b, h0, reverse, impl == 'interpret')
  return h.astype(out_dtype), hl.astype(out_dtype)


def _linear_reference(a, b, h0, reverse):
  def step(h, ab):
    h = ab[0] * h + ab[1]
    return h, h

  xs = (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1))
  hl, h = lax.scan(step, h0, xs, reverse=reverse)
  return jnp.swapaxes(h, 0, 1), hl


def linear_combine(earlier, later):
  """Composes affine maps: apply ``earlier`` then ``later``."""
  a_i, b_i = earlier
  a_j, b_j = later
  return a_j * a_i, a_j * b_i + b_j


def _linear_associative(a, b, h0, reverse):
  first = -1 if reverse else 0
  b = b.at[:, first].add(a[:, first] * h0)
  _, h = lax.associative_scan(linear_combine, (a, b), reverse=reverse, axis=1)
  return h, h[:, 0] if reverse else h[:, -1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _linear_pallas(a, b, h0, reverse, interpret):
  return _run_kernel(a, b, h0, reverse, interpret)


def _run_kernel(a, b, h0, reverse, interpret):
  h, hl = linear_scan_planes(
    split_planes(a),
    split_planes(b),
    split_planes(h0),
    reverse=reverse,
    interpret=interpret,
  )
  return merge_planes(h), merge_planes(hl)


def _linear_pallas_fwd(a, b, h0, reverse, interpret):
  h, hl = _run_kernel(a, b, h0, reverse, interpret)
  return (h, hl), (a, h, h0)


def _linear_pallas_bwd(reverse, interpret, res, cts):
  a, h, h0 = res
  g_h, g_hl = cts
  one = jnp.ones_like(a[:, :1])
  # Adjoint: lam_t = g_t + a_next * lam_next, scanned against the forward
  # direction; the transpose of multiplication by a is multiplication by a.
  if reverse:
    c = jnp.concatenate([one, a[:, :-1]], axis=1)
    h_prev = jnp.concatenate([h[:, 1:], h0[:, None]], axis=1)
    edge = -1
  else:
    c = jnp.concatenate([a[:, 1:], one], axis=1)
    h_prev = jnp.concatenate([h0[:, None], h[:, :-1]], axis=1)
    edge = 0
  lam, _ = _run_kernel(c, g_h, g_hl, not reverse, interpret)
  return lam * h_prev, lam, a[:, edge] * lam[:, edge]


_linear_pallas.defvjp(_linear_pallas_fwd, _linear_pallas_bwd)
