"""Attention benchmark: XLA path vs the flash kernel, per mask kind.

For each mask kind prints the fraction of (128 x 128) tiles the kernel skips
(EMPTY) and runs without a mask (FULL), and the forward time of the dense
XLA path and of the Pallas kernel. On CPU the kernel runs in interpret mode,
so its time measures the interpreter (a grid loop in XLA), not a TPU; the
tile fractions are what carries over.

Run: python -m pallas_kernels.benchmarks.attention_bench
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import MaskSpec, attention
from pallas_kernels.attention import skipped_fraction
from pallas_kernels.benchmarks._timing import median_ms, table


def masks(B: int, L: int, rng) -> dict[str, MaskSpec]:
  seg = np.repeat(np.arange(4), L // 4)[None].repeat(B, 0)
  valid = np.arange(L)[None].repeat(B, 0) < (3 * L) // 4
  ids = np.repeat(np.arange(4), L // 4)[None].repeat(B, 0)
  # Group g sees itself and group 0 (a shared prompt), nothing else.
  vis = np.eye(4, dtype=bool)
  vis[:, 0] = True
  return {
    'full': MaskSpec.full(),
    'full + 25% padding': MaskSpec.full(jnp.asarray(valid)),
    'causal': MaskSpec.causal(),
    'block_causal(256)': MaskSpec.block_causal(256),
    'prefix_lm(L/2)': MaskSpec.prefix_lm(L // 2),
    'segments (4 packed)': MaskSpec.segments(jnp.asarray(seg)),
    'groups (4, prompt shared)': MaskSpec.groups(
      jnp.asarray(ids), jnp.asarray(vis[None].repeat(B, 0))
    ),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--heads', type=int, default=4)
  parser.add_argument('--kv-heads', type=int, default=2)
  parser.add_argument('--length', type=int, default=1024)
  parser.add_argument('--dim', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args(argv)
  B, H, K, L, D = args.batch, args.heads, args.kv_heads, args.length, args.dim
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(B, H, L, D)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, K, L, D)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, K, L, D)), jnp.float32)
  kernel_impl = 'interpret' if jax.default_backend() == 'cpu' else 'pallas'
  rows = []
  for name, mask in masks(B, L, rng).items():
    empty, full = skipped_fraction(mask, B, L, L)
    xla = jax.jit(lambda q, k, v, m: attention(q, k, v, mask=m, impl='xla'))
    ker = jax.jit(
      lambda q, k, v, m: attention(q, k, v, mask=m, impl=kernel_impl)
    )
    t_xla = median_ms(xla, q, k, v, mask, repeats=args.repeats)
    t_ker = median_ms(ker, q, k, v, mask, repeats=args.repeats)
    err = float(jnp.max(jnp.abs(xla(q, k, v, mask) - ker(q, k, v, mask))))
    rows.append(
      [
        name,
        f'{empty:.0%}',
        f'{full:.0%}',
        f'{1 - empty - full:.0%}',
        f'{t_xla:.1f}',
        f'{t_ker:.1f}',
        f'{err:.1e}',
      ]
    )
  print(
    f'backend: {jax.default_backend()}, B={B} H={H} K={K} L=S={L} D={D}, '
    f'f32, kernel impl={kernel_impl}, 128x128 tiles\n'
  )
  print(
    table(
      [
        'mask',
        'tiles skipped (EMPTY)',
        'FULL (no mask)',
        'PARTIAL',
        'xla ms',
        f'kernel ({kernel_impl}) ms',
        'max abs diff',
      ],
      rows,
    )
  )


if __name__ == '__main__':
  main()
