"""Shape and dtype checks for the scans, run before any tracing."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._common import check_float_dtype


def _shape(x):
  if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
    raise TypeError(f'expected an array, got {type(x).__name__}.')
  return tuple(x.shape)


def check_seq(name: str, x, ref_shape=None) -> tuple[int, int, int]:
  """Checks a (B, L, N) sequence operand; returns its shape."""
  shape = _shape(x)
  if len(shape) != 3:
    raise ValueError(
      f'{name} must have shape (B, L, N), got shape {shape}; add a batch '
      'axis with x[None] if you have a single sequence.'
    )
  if ref_shape is not None and shape != ref_shape:
    raise ValueError(
      f'{name} has shape {shape} but must match the other operands, '
      f'{ref_shape}.'
    )
  if shape[1] == 0 or shape[2] == 0:
    raise ValueError(f'{name} needs L >= 1 and N >= 1, got shape {shape}.')
  return shape


def check_h0(h0, B: int, N: int) -> None:
  if h0 is None:
    return
  shape = _shape(h0)
  if shape != (B, N):
    raise ValueError(f'h0_BxN must have shape {(B, N)}, got {shape}.')
  check_float_dtype('h0_BxN', h0.dtype)


def check_flags(reverse) -> None:
  if not isinstance(reverse, bool):
    raise TypeError(f'reverse must be a Python bool, got {reverse!r}.')


def check_index(name: str, x) -> None:
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(
      f'{name} must be an integer array (state indices in [0, N)), got '
      f'{x.dtype}; cast with .astype(jnp.int32).'
    )
