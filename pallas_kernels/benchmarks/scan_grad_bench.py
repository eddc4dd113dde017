"""Sequential vs associative scan, forward + backward: what 'auto' picks.

Times the gradient of a scan (what training runs) for the linear and the PD
scan with impl='reference' (a sequential lax.scan) and impl='xla' (the
associative scan), alternating the two in every repeat because shared
machines drift, and reports compile seconds too. `_common.AUTO_IMPL` takes
the faster one per platform.

  python -m pallas_kernels.benchmarks.scan_grad_bench
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.benchmarks._timing import table
from pallas_kernels.scan import linear_scan, pd_scan

SHAPES = ((32, 256, 16), (64, 256, 64), (8, 1024, 64), (4, 1024, 256))
IMPLS = ('reference', 'xla')


def _complex(rng, shape, scale=1.0):
  z = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
  return jnp.asarray(z * scale, jnp.complex64)


def _grad_fns(kind: str, p_BxLxN):
  fns = {}
  for impl in IMPLS:
    if kind == 'linear':

      def loss(a, b, impl=impl):
        return jnp.sum(jnp.abs(linear_scan(a, b, impl=impl)[0]) ** 2)

    else:

      def loss(d, b, impl=impl):
        return jnp.sum(jnp.abs(pd_scan(p_BxLxN, d, b, impl=impl)[0]) ** 2)

    fns[impl] = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return fns


def measure(kind: str, shape, repeats: int) -> list:
  """[kind, B, L, N, seq ms, assoc ms, seq/assoc, compile s seq, assoc]."""
  rng = np.random.default_rng(0)
  B, L, N = shape
  p = jnp.asarray(rng.integers(0, N, shape), jnp.int32)
  x, b = _complex(rng, shape, 0.5), _complex(rng, shape)
  fns = _grad_fns(kind, p)
  compile_s = {}
  for impl, fn in fns.items():
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x, b))
    compile_s[impl] = time.perf_counter() - t0
  times = {impl: [] for impl in IMPLS}
  for r in range(repeats):
    for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
      t0 = time.perf_counter()
      jax.block_until_ready(fns[impl](x, b))
      times[impl].append(time.perf_counter() - t0)
  ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
  return [
    kind,
    B,
    L,
    N,
    f'{ms["reference"]:.2f}',
    f'{ms["xla"]:.2f}',
    f'{ms["reference"] / ms["xla"]:.2f}',
    f'{compile_s["reference"]:.1f}',
    f'{compile_s["xla"]:.1f}',
  ]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--tiny', action='store_true', help='one small shape')
  args = parser.parse_args(argv)
  shapes = ((2, 16, 4),) if args.tiny else SHAPES
  rows = [measure(k, s, args.repeats) for k in ('linear', 'pd') for s in shapes]
  header = ['scan', 'B', 'L', 'N', 'sequential ms', 'associative ms']
  header += ['seq / assoc', 'compile seq s', 'compile assoc s']
  print(f'backend: {jax.default_backend()}')
  print(table(header, rows))


if __name__ == '__main__':
  main()
