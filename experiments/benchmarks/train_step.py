"""Train-step throughput, model-FLOP utilisation and memory.

  python -m experiments.benchmarks.train_step [--width=256 --depth=4 ...]

FLOPs per step come from XLA's cost analysis of the compiled step; the
machine's peak is a dense float32 matmul timed in the same run, so the
utilisation is a ratio of two numbers measured together. Also reports the
forward pass alone (backward / forward cost ratio) and peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import make_mesh
from ddlm_jax.training.optimizer import make_optimizer
from ddlm_jax.training.state import init_train_state
from ddlm_jax.training.steps import jit_train_step, loss_fn


def _median_seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost['flops'])


def matmul_peak(n: int, repeats: int, dtype=jnp.float32) -> float:
  """FLOP/s of an n x n x n matmul (best of `repeats`)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  best = min(
    _median_seconds(lambda: f(a, b), 1) for _ in range(max(repeats, 3))
  )
  return 2.0 * n**3 / best


def run(args) -> dict:
  cfg = TransformerConfig(
    vocab_size=args.vocab,
    input_vocab_size=args.vocab + 1,
    width=args.width,
    depth=args.depth,
    num_heads=args.heads,
    mlp_kind=args.mlp,
    dtype=args.dtype,
  )
  process = MaskedDiffusion(get_schedule('loglinear'), args.vocab, t_min=1e-3)
  tx, _ = make_optimizer(learning_rate=1e-3, warmup_steps=10, total_steps=1000)
  mesh = make_mesh((1, 1, 1))
  graphdef, state, shardings = init_train_state(
    lambda rngs: Transformer(cfg, rngs=rngs),
    tx,
    seed=0,
    mesh=mesh,
    use_ema=False,
  )
  step = jit_train_step(graphdef, process, tx, 0.0, shardings, mesh)
  x = jax.random.randint(
    jax.random.key(0), (args.batch, args.length), 0, args.vocab
  )
  batch = {'tokens': x}
  compiled = step.lower(state, batch).compile()
  step_flops = _flops(compiled)
  mem = compiled.memory_analysis()

  fwd = jax.jit(
    lambda p, k: loss_fn(p, k, x, graphdef=graphdef, process=process)
  )
  fwd_compiled = fwd.lower(state.params, jax.random.key(0)).compile()
  fwd_flops = _flops(fwd_compiled)

  holder = {'state': state}

  def one_step():
    holder['state'], m = compiled(holder['state'], batch)
    return m['loss']

  for _ in range(args.warmup):
    one_step()
  step_s = _median_seconds(one_step, args.repeats)
  fwd_s = _median_seconds(
    lambda: fwd_compiled(holder['state'].params, jax.random.key(1)),
    args.repeats,
  )
  peak = matmul_peak(args.peak_n, args.repeats)
  tokens = args.batch * args.length
  result = {
    'config': vars(args),
    'params': int(sum(np.prod(p.shape) for p in jax.tree.leaves(state.params))),
    'step_seconds': step_s,
    'tokens_per_sec': tokens / step_s,
    'step_gflops': step_flops / 1e9,
    'achieved_gflops_per_sec': step_flops / step_s / 1e9,
    'matmul_peak_gflops_per_sec': peak / 1e9,
    'mfu': step_flops / step_s / peak,
    'forward_seconds': fwd_s,
    'forward_gflops': fwd_flops / 1e9,
    'step_over_forward_time': step_s / fwd_s,
    'compiled_temp_mib': getattr(mem, 'temp_size_in_bytes', 0) / 2**20,
    'compiled_argument_mib': getattr(mem, 'argument_size_in_bytes', 0) / 2**20,
    'process_peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    / 1024,
    'backend': jax.default_backend(),
    'devices': str(jax.devices()[0]),
  }
  return result


def main():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--width', type=int, default=256)
  p.add_argument('--depth', type=int, default=4)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--length', type=int, default=256)
  p.add_argument('--batch', type=int, default=16)
  p.add_argument('--vocab', type=int, default=128)
  p.add_argument('--mlp', default='swiglu')
  p.add_argument('--dtype', default='float32')
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--warmup', type=int, default=3)
  p.add_argument('--peak-n', type=int, default=2048)
  p.add_argument('--json', default='', help='Also write the result here.')
  args = p.parse_args()
  result = run(args)
  print(json.dumps(result, indent=2))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=2)


if __name__ == '__main__':
  main()
