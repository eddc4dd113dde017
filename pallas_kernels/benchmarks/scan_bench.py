"""Scan benchmarks on the local backend (CPU here).

Table 1: diagonal scan, sequential (lax.scan) vs associative
(lax.associative_scan) vs the chunked Pallas kernel (interpret mode on CPU,
so its time measures the interpreter, not a TPU).
Table 2: PD scan vs a dense-transition scan whose combine is an N x N matrix
product, both associative, plus the sequential versions.

Run: python -m pallas_kernels.benchmarks.scan_bench [--no-kernel] [--json=PATH]
(--json also writes both tables' numbers).
"""

from __future__ import annotations

import argparse
import json
import os

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


def linear_rows(lengths, widths, batch, repeats, with_kernel) -> list[dict]:
  """Median ms of each diagonal-scan implementation, one row per (L, N)."""
  rng = np.random.default_rng(0)
  rows = []
  # The compiled kernel on an accelerator, interpret mode on CPU.
  kernel = 'interpret' if jax.default_backend() == 'cpu' else 'pallas'
  impls = {'sequential': 'reference', 'associative': 'xla'}
  if with_kernel:
    impls[f'kernel_{kernel}'] = kernel
  for L in lengths:
    for N in widths:
      a = _complex(rng, (batch, L, N), 0.5)
      b = _complex(rng, (batch, L, N))
      row = {'L': L, 'N': N, 'batch': batch}
      for name, impl in impls.items():
        fn = jax.jit(lambda a, b, impl=impl: linear_scan(a, b, impl=impl)[0])
        row[f'{name}_ms'] = median_ms(fn, a, b, repeats=repeats)
      row['sequential_over_associative'] = (
        row['sequential_ms'] / row['associative_ms']
      )
      rows.append(row)
  return rows


def linear_table(rows: list[dict]) -> str:
  kernels = [k for k in rows[0] if k.startswith('kernel_')] if rows else []
  header = ['L', 'N', 'sequential ms', 'associative ms']
  header += [f'chunked Pallas ({k[7:-3]}) ms' for k in kernels]
  header.append('seq / assoc')
  body = [
    [r['L'], r['N'], f'{r["sequential_ms"]:.2f}', f'{r["associative_ms"]:.2f}']
    + [f'{r[k]:.2f}' for k in kernels]
    + [f'{r["sequential_over_associative"]:.1f}x']
    for r in rows
  ]
  return table(header, body)


def pd_rows(widths, length, batch, repeats) -> list[dict]:
  """PD scan against the dense-transition scan, one row per N."""
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
      {
        'N': N,
        'L': length,
        'batch': batch,
        'pd_ms': t_pd,
        'dense_ms': t_dense,
        'dense_over_pd': t_dense / t_pd,
        'pd_sequential_ms': t_pd_seq,
        'dense_sequential_ms': t_dense_seq,
        'max_rel_diff': err,
      }
    )
  return rows


def pd_table(rows: list[dict]) -> str:
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
  body = [
    [
      r['N'],
      r['L'],
      f'{r["pd_ms"]:.2f}',
      f'{r["dense_ms"]:.2f}',
      f'{r["dense_over_pd"]:.0f}x',
      f'{r["pd_sequential_ms"]:.2f}',
      f'{r["dense_sequential_ms"]:.2f}',
      f'{r["max_rel_diff"]:.1e}',
    ]
    for r in rows
  ]
  return table(header, body)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--no-kernel', action='store_true')
  parser.add_argument('--quick', action='store_true', help='L = 256, 1024')
  parser.add_argument('--lengths', default='256,1024,4096', help='table 1 L')
  parser.add_argument('--widths', default='16,256', help='table 1 N')
  parser.add_argument(
    '--pd_widths', default='16,64,128', help='state sizes N of table 2'
  )
  parser.add_argument('--json', default='', help='also write both tables')
  args = parser.parse_args(argv)
  if args.repeats < 1 or args.batch < 1:
    parser.error('--repeats and --batch must be >= 1')
  ints = lambda text: [int(x) for x in text.split(',') if x]
  lengths = [256, 1024] if args.quick else ints(args.lengths)
  widths, pd_widths = ints(args.widths), ints(args.pd_widths)
  if (
    not (lengths and widths and pd_widths)
    or min(lengths + widths + pd_widths) < 1
  ):
    parser.error('--lengths, --widths and --pd_widths need positive integers')
  print(f'backend: {jax.default_backend()}, batch {args.batch}, complex64\n')
  print('Diagonal scan h_t = a_t h_{t-1} + b_t\n')
  linear = linear_rows(
    lengths, widths, args.batch, args.repeats, not args.no_kernel
  )
  print(linear_table(linear))
  print('\nPD scan vs dense-transition scan (batch 1)\n')
  pd = pd_rows(pd_widths, 1024, 1, args.repeats)
  print(pd_table(pd))
  result = {
    'backend': jax.default_backend(),
    'jax': jax.__version__,
    'linear': linear,
    'pd': pd,
    'load_average': os.getloadavg()[0],
  }
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == '__main__':
  main()
