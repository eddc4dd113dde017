"""Shared helpers for the kernels: impl selection, dtypes, complex planes.

Pallas kernels (TPU Mosaic in particular) have no complex dtype, so complex
arrays enter a kernel as separate real and imaginary planes and the kernel
does the complex arithmetic by hand. These helpers keep that bookkeeping in
one place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ('auto', 'reference', 'xla', 'pallas', 'interpret')

Planes = tuple[jax.Array, ...]


def resolve_impl(impl: str) -> str:
  """Maps 'auto' to a concrete impl: 'pallas' on TPU, else 'xla'.

  The kernels are written for TPU (Mosaic) and checked in interpret mode;
  on GPU this JAX version lowers Pallas through Mosaic GPU, whose layout
  rules these kernels do not meet, so GPU uses the XLA path.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl must be one of {IMPLS}, got {impl!r}.')
  if impl == 'auto':
    return 'pallas' if jax.default_backend() == 'tpu' else 'xla'
  if impl == 'pallas' and jax.default_backend() == 'gpu':
    raise NotImplementedError(
      "impl='pallas' targets TPU; on GPU use impl='xla' (or 'auto')."
    )
  return impl


def compute_dtype(*dtypes) -> np.dtype:
  """Promoted dtype for the arithmetic: half precision accumulates in f32."""
  dt = jnp.result_type(*dtypes)
  if dt in (jnp.bfloat16, jnp.float16):
    return np.dtype(jnp.float32)
  return np.dtype(dt)


def check_float_dtype(name: str, dtype) -> None:
  """Raises TypeError unless dtype is real floating or complex."""
  if not (
    jnp.issubdtype(dtype, jnp.floating)
    or jnp.issubdtype(dtype, jnp.complexfloating)
  ):
    raise TypeError(
      f'{name} must have a floating or complex dtype, got {dtype}; cast it '
      'with .astype(jnp.float32) or .astype(jnp.complex64).'
    )


def is_complex(dtype) -> bool:
  return bool(jnp.issubdtype(dtype, jnp.complexfloating))


def split_planes(x: jax.Array) -> Planes:
  """Complex -> (real, imag); real -> (x,)."""
  if is_complex(x.dtype):
    return (jnp.real(x), jnp.imag(x))
  return (x,)


def merge_planes(planes: Planes) -> jax.Array:
  if len(planes) == 2:
    return jax.lax.complex(planes[0], planes[1])
  return planes[0]


def cmul(x: Planes, y: Planes) -> Planes:
  """Elementwise product of two values given as planes (1 or 2 each)."""
  if len(x) != len(y):
    raise ValueError('cmul needs operands with the same number of planes.')
  if len(x) == 1:
    return (x[0] * y[0],)
  xr, xi = x
  yr, yi = y
  return (xr * yr - xi * yi, xr * yi + xi * yr)


def cadd(x: Planes, y: Planes) -> Planes:
  return tuple(u + v for u, v in zip(x, y))


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def round_up(a: int, b: int) -> int:
  return cdiv(a, b) * b
