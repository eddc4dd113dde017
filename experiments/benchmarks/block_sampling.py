"""Block-diffusion sampling throughput with and without the KV cache.

  python -m experiments.benchmarks.block_sampling [--workdir=RUN] \
    [--lengths=512,1024] [--block=16] [--inner_steps=8] [--repeats=2]

For each length it draws one batch with the `block` sampler (inner sampler
ancestral with --inner_steps steps per block, not cached) twice: with the
KV cache over finished blocks (each call runs one block of L' tokens
against the cache) and without it (each call runs the 2L training pass
over the whole sequence). Both give the same tokens for the same key
(tested in tests/test_block_sampling.py; checked here too). The two are
timed in ABBA order (--repeats rounds, best time of each), so load from
other processes favours neither, after compiling both. Without --workdir
the network is a random-init block-diffusion Transformer (width 128, 4
layers, 4 heads, V = 85, the quickstart's shape; the zero-init head is
randomised so predictions are not uniform). Prints one JSON line per
length with tokens/s, NFE and the cached/uncached speedup; --json=PATH
also writes the lines as one JSON list.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np
from flax import nnx

from ddlm_jax.diffusion import get_schedule
from ddlm_jax.diffusion.block import BlockDiffusion
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import keep_freed_memory
from ddlm_jax.sampling.block import BlockSampler


def random_model(args):
  cfg = TransformerConfig(
    vocab_size=args.vocab,
    input_vocab_size=args.vocab + 1,
    width=args.width,
    depth=args.depth,
    num_heads=args.heads,
    block_size=args.block,
  )
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  head = params['head']['kernel']
  params['head']['kernel'] = 0.05 * jax.random.normal(
    jax.random.key(1), head.shape
  )
  process = BlockDiffusion(
    get_schedule('loglinear'), vocab_size=args.vocab, block_size=args.block
  )
  return graphdef, params, process


def load_model(workdir):
  from ddlm_jax.tasks.language_model import load_run

  run = load_run(workdir)
  return run.graphdef, run.eval_params(), run.process


def main(argv=None) -> list[dict]:
  keep_freed_memory()  # ddlm_jax.parallel.host_memory
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--workdir', default='')
  p.add_argument('--lengths', default='512,1024')
  p.add_argument('--block', type=int, default=16)
  p.add_argument('--inner_steps', type=int, default=8)
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--repeats', type=int, default=2)
  p.add_argument('--vocab', type=int, default=85)
  p.add_argument('--width', type=int, default=128)
  p.add_argument('--depth', type=int, default=4)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--json', default='', help='also write the rows here')
  args = p.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',') if x]
  if not lengths or min(lengths) < 1 or args.repeats < 1:
    p.error('--lengths needs positive integers and --repeats must be >= 1')
  if args.workdir:
    graphdef, params, process = load_model(args.workdir)
  else:
    graphdef, params, process = random_model(args)
  rows = []
  for length in lengths:
    fns = {}
    for cached in (True, False):
      sampler = BlockSampler(
        inner='ancestral',
        inner_params=(('num_steps', args.inner_steps), ('use_cache', False)),
        use_kv_cache=cached,
      )

      def draw(params, key, sampler=sampler, length=length):
        model = nnx.merge(graphdef, params)
        return sampler(model, key, process, batch=args.batch, length=length)

      fns[cached] = jax.jit(draw).lower(params, jax.random.key(0)).compile()
    outs, best = {}, {True: np.inf, False: np.inf}
    order = [True, False, False, True] * args.repeats
    for cached in order:
      t0 = time.perf_counter()
      tokens, nfe = jax.block_until_ready(
        fns[cached](params, jax.random.key(0))
      )
      best[cached] = min(best[cached], time.perf_counter() - t0)
      outs[cached] = (np.asarray(tokens), int(nfe))
    same = bool(np.array_equal(outs[True][0], outs[False][0]))
    tokens = args.batch * length
    rows.append(
      {
        'length': length,
        'block': process.block_size,
        'inner_steps': args.inner_steps,
        'batch': args.batch,
        'nfe': outs[True][1],
        'same_tokens': same,
        'cached_seconds': best[True],
        'uncached_seconds': best[False],
        'cached_tokens_per_sec': tokens / best[True],
        'uncached_tokens_per_sec': tokens / best[False],
        'speedup': best[False] / best[True],
        'load_average': os.getloadavg()[0],
      }
    )
    print(json.dumps(rows[-1]), flush=True)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == '__main__':
  main()
