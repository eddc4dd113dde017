"""Scan benchmarks on the local backend (CPU here).

Table 1: diagonal scan, sequential (lax.scan) vs associative
(lax.associative_scan) vs the chunked Pallas kernel (interpret mode on CPU,
so its time measures the interpreter, not a TPU).
Table 2: PD scan vs a dense-transition scan whose combine is an N x N matrix
product, both associative, plus the sequential versions.

Run: python -m pallas_kernels.benchmarks.scan_bench
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels import linear_scan, pd_scan
from pallas_kernels.benchmarks._timing import median_ms, table


def _complex(rng, shape, scale=1.0):
  x = rng.normal(size=shape) + 1j * rng.normal(size=shape)
  return jnp.asarray(scale * x, jnp.complex64)


def dense_combine(earlier, later):
  """Affine maps with dense N x N matrices: O(N^3) per combine."""
  A_i, b_i = earlier
  A_j, b_j = later
  return A_j @ A_i, jnp.einsum('...ij,...j->...i', A_j, b_i) + b_j


@jax.jit
def dense_associative(A_BxLxNxN, b_BxLxN):
  _, h = lax.associative_scan(dense_combine, (A_BxLxNxN, b_BxLxN), axis=1)
  return h


@jax.jit
def dense_sequential(A_BxLxNxN, b_BxLxN):
  def step(h, x):
    h = jnp.einsum('bij,bj->bi', x[0], h) + x[1]
    return h, h

  h0 = jnp.zeros_like(b_BxLxN[:, 0])
  xs = (jnp.swapaxes(A_BxLxNxN, 0, 1), jnp.swapaxes(b_BxLxN, 0, 1))
  _, h = lax.scan(step, h0, xs)
  return jnp.swapaxes(h, 0, 1)


def _pd_to_dense(p, d):
  n = p.shape[-1]
  onehot = jax.nn.one_hot(p, n, axis=-2, dtype=d.dtype)  # [..., i, j]
  return onehot * d[..., None, :]


def linear_table(lengths, widths, batch, repeats, with_kernel):
  rng = np.random.default_rng(0)
  rows = []
  # The compiled kernel on an accelerator, interpret mode on CPU.
  kernel = 'interpret' if jax.default_backend() == 'cpu' else 'pallas'
  impls = ['reference', 'xla'] + ([kernel] if with_kernel else [])
  for L in lengths:
    for N in widths:
      a = _complex(rng, (batch, L, N), 0.5)
      b = _complex(rng, (batch, L, N))
      row = [L, N]
      for impl in impls:
        fn = jax.jit(lambda a, b, impl=impl: linear_scan(a, b, impl=impl)[0])
        row.append(f'{median_ms(fn, a, b, repeats=repeats):.2f}')
      seq, assoc = float(row[2]), float(row[3])
      row.append(f'{seq / assoc:.1f}x')
      rows.append(row)
  header = ['L', 'N', 'sequential ms', 'associative ms']
  if with_kernel:
    header.append(f'chunked Pallas ({kernel}) ms')
  header.append('seq / assoc')
  return table(header, rows)


def pd_table(widths, length, batch, repeats):
  rng = np.random.default_rng(1)
  rows = []
  for N in widths:
    p = jnp.asarray(rng.integers(0, N, (batch, length, N)), jnp.int32)
    d = _complex(rng, (batch, length, N), 0.5)
    b = _complex(rng, (batch, length, N))
    A = _pd_to_dense(p, d)
    pd_assoc = jax.jit(lambda p, d, b: pd_scan(p, d, b, impl='xla')[0])
    pd_seq = jax.jit(lambda p, d, b: pd_scan(p, d, b, impl='reference')[0])
    t_pd = median_ms(pd_assoc, p, d, b, repeats=repeats)
    t_pd_seq = median_ms(pd_seq, p, d, b, repeats=repeats)
    t_dense = median_ms(dense_associative, A, b, repeats=max(1, repeats // 2))
    t_dense_seq = median_ms(dense_sequential, A, b, repeats=repeats)
    err = float(
      jnp.max(jnp.abs(pd_assoc(p, d, b) - dense_associative(A, b)))
      / (1 + jnp.max(jnp.abs(dense_associative(A, b))))
    )
    rows.append(
      [
        N,
        length,
        f'{t_pd:.2f}',
        f'{t_dense:.2f}',
        f'{t_dense / t_pd:.0f}x',
        f'{t_pd_seq:.2f}',
        f'{t_dense_seq:.2f}',
        f'{err:.1e}',
      ]
    )
  header = [
    'N',
    'L',
    'PD assoc ms',
    'dense assoc ms',
    'dense / PD',
    'PD seq ms',
    'dense seq ms',
    'max rel diff',
  ]
  return table(header, rows)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--no-kernel', action='store_true')
  parser.add_argument('--quick', action='store_true', help='small sizes')
  args = parser.parse_args(argv)
  lengths = [256, 1024] if args.quick else [256, 1024, 4096]
  widths = [16, 256]
  print(f'backend: {jax.default_backend()}, batch {args.batch}, complex64\n')
  print('Diagonal scan h_t = a_t h_{t-1} + b_t\n')
  print(
    linear_table(lengths, widths, args.batch, args.repeats, not args.no_kernel)
  )
  print('\nPD scan vs dense-transition scan (batch 1)\n')
  print(pd_table([16, 64, 128], 1024, 1, args.repeats))


if __name__ == '__main__':
  main()
