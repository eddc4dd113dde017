"""Shared helpers for the kernels: impl selection, dtypes, complex planes.

Pallas kernels (TPU Mosaic in particular) have no complex dtype, so complex
arrays enter a kernel as separate real and imaginary planes and the kernel
does the complex arithmetic by hand. These helpers keep that bookkeeping in
one place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

IMPLS = ('auto', 'reference', 'xla', 'pallas', 'interpret')
KERNELS = ('attention', 'linear_scan', 'pd_scan')

# Platforms whose compiled Pallas path each kernel claims: TPU through Mosaic,
# GPU ('gpu' backend, exported as 'cuda') through Triton. Each claim is
# checked by tests/test_kernels_export.py (lowering by export from the CPU).
PALLAS_PLATFORMS = {
  'attention': ('tpu', 'gpu'),
  'linear_scan': ('tpu', 'gpu'),
  'pd_scan': ('tpu', 'gpu'),
}

# What impl='auto' picks per kernel and backend. No benchmark of the compiled
# kernels exists yet on either accelerator (pallas_kernels/benchmarks/ has
# only run on CPU, where the Pallas path is interpret mode): TPU keeps the
# kernels, which were written for it, and GPU keeps XLA until
# ``python -m pallas_kernels.benchmarks.scan_bench`` /
# ``attention_bench`` are run on a GPU and show the Triton kernels ahead.
# Attention's public dispatch (attention.api) decides 'auto' with its own
# AUTO_TABLE; the 'attention' row here only serves resolve_impl's callers.
# On CPU the scans run sequentially ('reference', a lax.scan): measured
# forward+backward (`python -m pallas_kernels.benchmarks.scan_grad_bench`) it is
# 2.5-6x faster than the associative scan at every shape tried (B 4-64, L
# 256-1024, N 16-256) and compiles 10-20x faster (docs/HISTORY.md section 3).
AUTO_IMPL = {
  'attention': {'tpu': 'pallas', 'gpu': 'xla'},
  'linear_scan': {'tpu': 'pallas', 'gpu': 'xla', 'cpu': 'reference'},
  'pd_scan': {'tpu': 'pallas', 'gpu': 'xla', 'cpu': 'reference'},
}

Planes = tuple[jax.Array, ...]


def resolve_impl(impl: str, kernel: str = 'attention') -> str:
  """Maps 'auto' to a concrete impl for this backend (see ``AUTO_IMPL``).

  'pallas' stays 'pallas' on a backend the kernel claims (``PALLAS_PLATFORMS``)
  and raises on one it does not; on CPU it is left to fail at lowering
  (only 'interpret' runs Pallas there).
  """
  if impl not in IMPLS:
    raise ValueError(f'impl must be one of {IMPLS}, got {impl!r}.')
  if kernel not in KERNELS:
    raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}.')
  backend = jax.default_backend()
  if impl == 'auto':
    return AUTO_IMPL[kernel].get(backend, 'xla')
  if impl == 'pallas' and backend == 'gpu':
    if 'gpu' not in PALLAS_PLATFORMS[kernel]:
      raise NotImplementedError(
        f"impl='pallas' for {kernel} has no GPU kernel; use impl='xla' (or "
        "'auto')."
      )
  return impl


# Lowering platforms (as ``jax.export`` and ``lax.platform_dependent`` name
# them) of each backend a kernel may claim.
_LOWERING_PLATFORMS = {'tpu': ('tpu',), 'gpu': ('cuda',)}


def compiler_params(
  platform: str,
  *,
  dimension_semantics: tuple[str, ...] | None = None,
  num_warps: int = 4,
  num_stages: int = 2,
):
  """Backend compiler parameters for one lowering platform.

  'tpu': Mosaic params (``dimension_semantics`` per grid axis); 'gpu' or
  'cuda': Triton params (warps per program, software-pipelining stages);
  'interpret': None. A pallas_call accepts one backend's params only, so the
  choice is made per platform by ``platform_call``.
  """
  if platform == 'interpret':
    return None
  if platform == 'tpu':
    return pltpu.CompilerParams(dimension_semantics=dimension_semantics)
  if platform in ('gpu', 'cuda'):
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  raise ValueError(
    f"platform must be 'tpu', 'gpu', 'cuda' or 'interpret', got {platform!r}."
  )


def platform_call(fn, *args, platforms: tuple[str, ...], interpret: bool):
  """Calls ``fn(*args, platform=p)`` for the platform p being lowered for.

  The branch is chosen at lowering time (``lax.platform_dependent``), not from
  the local backend, so ``jax.export`` from a CPU host lowers the TPU or the
  GPU kernel as asked; only that branch is lowered. ``platforms`` holds
  backend names ('tpu', 'gpu'); lowering for any other platform fails with
  JAX's error naming the platforms. With interpret=True, fn runs once with
  platform='interpret' (any backend).
  """
  if interpret:
    return fn(*args, platform='interpret')
  branches = {}
  for backend in platforms:
    for p in _LOWERING_PLATFORMS[backend]:
      branches[p] = functools.partial(fn, platform=backend)
  return jax.lax.platform_dependent(*args, **branches)


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


def next_pow2(n: int) -> int:
  """Smallest power of two >= n (Triton needs power-of-two tensor sizes)."""
  return 1 << max(int(n) - 1, 0).bit_length()
