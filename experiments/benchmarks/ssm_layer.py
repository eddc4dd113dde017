"""PD-SSM layer forward+backward time vs sequence length, vs a dense SSM.

Times one jitted ``value_and_grad`` (forward + backward w.r.t. all layer
parameters) of ``SSMMixer(mode='pdssm')`` for each length, and of a
dense-transition SSM at the same N built from the same layer: identical
D_t, B, C and relaxed transition, but A_t = column_softmax(M_t) * D_t is a
dense N x N matrix, scanned either sequentially (``lax.scan`` of mat-vecs,
O(L N^2)) or in parallel (``lax.associative_scan`` of mat-mats, O(L N^3)
work) - the cost the PD structure avoids. PD-SSM time should grow about
linearly in L.

Usage:
  python -m experiments.benchmarks.ssm_layer --lengths 64,256,1024
  python -m experiments.benchmarks.ssm_layer --json /tmp/ssm_layer.json
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.models import ssm
from ddlm_jax.parallel import keep_freed_memory


def dense_states(
  mixer: ssm.SSMMixer, u_BxLxD: jax.Array, parallel: bool
) -> jax.Array:
  """h_BxLxN of the dense-transition SSM sharing ``mixer``'s parameters."""
  d = mixer.diagonal(u_BxLxD)
  b = mixer.inputs(u_BxLxD)
  a = mixer.relaxed_transition(u_BxLxD) * d[..., None, :]  # [B, L, N, N]
  if parallel:

    def combine(earlier, later):
      a_i, b_i = earlier
      a_j, b_j = later
      return a_j @ a_i, jnp.einsum('...ij,...j->...i', a_j, b_i) + b_j

    _, h = jax.lax.associative_scan(combine, (a, b), axis=1)
    return h

  def step(h, ab):
    h = jnp.einsum('bij,bj->bi', ab[0], h) + ab[1]
    return h, h

  h0 = jnp.zeros((b.shape[0], b.shape[-1]), b.dtype)
  _, h = jax.lax.scan(step, h0, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))
  return jnp.swapaxes(h, 0, 1)


def _forward(variant: str, mixer: ssm.SSMMixer, u: jax.Array) -> jax.Array:
  if variant.startswith('pd-'):
    mixer.scan_impl = variant[3:]
    return mixer(u)
  h = dense_states(mixer, u, parallel=variant == 'dense-parallel')
  return mixer.readout(h, u)


def time_variant(
  variant: str,
  mixer: ssm.SSMMixer,
  u: jax.Array,
  repeats: int,
) -> tuple[float, float]:
  """(compile seconds, median seconds per fwd+bwd call)."""
  graphdef, params = nnx.split(mixer)

  @jax.jit
  def fwd_bwd(params, u):
    def loss(p):
      y = _forward(variant, nnx.merge(graphdef, p), u)
      return jnp.mean(y * y)

    return jax.value_and_grad(loss)(params)

  t0 = time.perf_counter()
  compiled = fwd_bwd.lower(params, u).compile()
  t_compile = time.perf_counter() - t0
  jax.block_until_ready(compiled(params, u))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(params, u))
    times.append(time.perf_counter() - t0)
  return t_compile, float(np.median(times))


def main(argv: list[str] | None = None) -> list[dict]:
  keep_freed_memory()  # ddlm_jax.parallel.host_memory
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--lengths', default='128,512,2048')
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--d_model', type=int, default=64)
  parser.add_argument('--state', type=int, default=64)
  parser.add_argument('--dict', type=int, default=8)
  parser.add_argument(
    '--variants',
    default='pd-xla,pd-reference,dense-sequential,dense-parallel',
    help='pd-<impl> (pallas_kernels impl) | dense-sequential | dense-parallel',
  )
  parser.add_argument(
    '--dense_max_len',
    type=int,
    default=512,
    help='skip dense variants above this length (memory: B L N^2).',
  )
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--json', default=None, help='write rows here')
  args = parser.parse_args(argv)

  lengths = [int(x) for x in args.lengths.split(',')]
  variants = args.variants.split(',')
  mixer = ssm.SSMMixer(
    args.d_model, args.state, num_dict=args.dict, rngs=nnx.Rngs(0)
  )
  rows = []
  print(
    f'backend={jax.default_backend()} B={args.batch} D={args.d_model} '
    f'N={args.state} K={args.dict}; median of {args.repeats} fwd+bwd calls'
  )
  print('| L | variant | ms / fwd+bwd | ms / step (ms / L) | compile s |')
  print('|---|---|---|---|---|')
  for L in lengths:
    u = jax.random.normal(jax.random.key(L), (args.batch, L, args.d_model))
    for variant in variants:
      if variant.startswith('dense') and L > args.dense_max_len:
        continue
      t_c, t = time_variant(variant, mixer, u, args.repeats)
      row = {
        'L': L,
        'variant': variant,
        'ms': 1e3 * t,
        'ms_per_step': 1e3 * t / L,
        'compile_s': t_c,
      }
      rows.append(row)
      print(
        f'| {L} | {variant} | {row["ms"]:.2f} | '
        f'{row["ms_per_step"]:.4f} | {t_c:.1f} |',
        flush=True,
      )
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'args': vars(args), 'rows': rows}, f, indent=1)
  return rows


if __name__ == '__main__':
  main()
