"""Straight-through hardmax: a one-hot forward pass, the softmax's gradient.

PD-SSM (``ssm``) hardens each column of its relaxed transition matrix to a
one-hot vector, so the forward pass is an exact permutation-like matrix,
while the backward pass differentiates the (temperature-scaled) softmax as
if nothing had been hardened. ``column_*`` are the axis=-2 forms used on
N x N matrices: column j is hardened to e_{argmax_i m[i, j]}.
``sinkhorn`` is the doubly stochastic relaxation a PD-SSM can train with
instead (``ssm.SSMMixer.relax_temperature``): as its temperature falls it
tends to a permutation matrix, the bijection the hardmax should find.
``assignment_indices`` is that limit itself (a linear assignment), the
hardening of a Sinkhorn relaxation that is a bijection by construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize


def straight_through_hardmax(
  logits: jax.Array, axis: int = -1, temperature: float = 1.0
) -> jax.Array:
  """one_hot(argmax(logits)) forward; gradient of softmax(logits / T).

  The forward value is exactly one-hot (soft - stop_gradient(soft) is 0).
  """
  soft = jax.nn.softmax(logits / temperature, axis=axis)
  index = jnp.argmax(logits, axis=axis).astype(jnp.int32)
  hard = jax.nn.one_hot(index, logits.shape[axis], axis=axis)
  return hard + (soft - jax.lax.stop_gradient(soft))


def column_argmax(m_xNxN: jax.Array) -> jax.Array:
  """Row index of each column's maximum: p[..., j] = argmax_i m[..., i, j]."""
  return jnp.argmax(m_xNxN, axis=-2).astype(jnp.int32)


def _assign_host(m_xNxN: np.ndarray) -> np.ndarray:
  m = np.nan_to_num(np.asarray(m_xNxN, np.float64), nan=0.0)
  m = np.clip(m, -1e30, 1e30)
  n = m.shape[-1]
  flat = m.reshape(-1, n, n)
  out = np.empty(flat.shape[:2], np.int32)
  for k, mat in enumerate(flat):
    rows, cols = scipy.optimize.linear_sum_assignment(mat, maximize=True)
    out[k, cols] = rows
  return out.reshape(m.shape[:-1])


def assignment_indices(m_xNxN: jax.Array) -> jax.Array:
  """p[..., j] of the permutation maximising sum_j m[..., p[j], j].

  The linear assignment of each N x N matrix (scipy's, on the host): the
  limit of sinkhorn(m, T) as T -> 0. Where two columns' maxima share a row
  ``column_argmax`` sends both there, a map that is no bijection; this
  never does, and equals ``column_argmax`` when that is a bijection. Not
  differentiable (integer output; the input's gradient is stopped), so use
  it for the forward of a straight-through hardening.
  """
  out = jax.ShapeDtypeStruct(m_xNxN.shape[:-1], jnp.int32)
  return jax.pure_callback(
    _assign_host,
    out,
    jax.lax.stop_gradient(m_xNxN),
    vmap_method='expand_dims',
  )


def column_softmax(m_xNxN: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Softmax over rows, independently for each column."""
  return jax.nn.softmax(m_xNxN / temperature, axis=-2)


def column_onehot_st(m_xNxN: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Dense straight-through P: one-hot columns forward, column-softmax grad.

  Used by references and tests; the PD-SSM layer never forms P densely in
  its scan (see ``ssm.pd_scan_st``, which only needs ``column_argmax``).
  """
  return straight_through_hardmax(m_xNxN, axis=-2, temperature=temperature)


def sinkhorn(m_xNxN: jax.Array, temperature, num_iters: int = 20) -> jax.Array:
  """exp(m / T) balanced to a doubly stochastic matrix (log domain).

  Alternately normalises rows and columns (Sinkhorn-Knopp), ending with the
  columns so that, like ``column_softmax``, every column sums to one
  exactly and the state's mass is preserved; the rows sum to one up to the
  iteration's convergence. As T -> 0 the result tends to the permutation
  matrix of the assignment maximising sum_j m[p[j], j]. ``temperature``
  may be a traced scalar (an annealing schedule inside a jitted step).
  """
  log_p = m_xNxN / temperature
  for _ in range(num_iters):
    log_p = log_p - jax.nn.logsumexp(log_p, axis=-1, keepdims=True)
    log_p = log_p - jax.nn.logsumexp(log_p, axis=-2, keepdims=True)
  return jnp.exp(log_p)
