"""Sampler throughput: the cached sampler vs md4's loop and a Python loop.

  python -m experiments.benchmarks.samplers [--workdir=RUN] \
    [--steps=256,1024] [--dtype=bfloat16]

At length 256 and batch 4 (defaults) it times, for each T, the baseline (a
Python loop over T steps, each a jitted network call plus ancestral reveal),
the same uncached ancestral sampler as one jitted loop
(`ancestral_jit_no_cache`: what md4 runs, whose md4/sampling.py `generate`
is a `jax.lax.fori_loop` over the T uncached steps; its ratio to the
baseline is what compiling the loop buys), the cached ancestral sampler
(what caching buys on top), and the samplers named in --fixed once (their
NFE does not depend on T). The cached sampler gets the model itself, whose
`logits_at` lets a call run the last block's queries, MLP and the head
only at the positions its step reveals (and a time-free first block's
Q/K/V per token); `ancestral_cached_full_pass` (--full_pass_row)
is the same sampler with a full pass per call, so the two rows separate
what that buys from what caching buys. Reports NFE, seconds, ms per
network call, samples/s, tokens/s and the speed-ups over the baseline and
over md4's loop (`speedup_vs_md4_loop`, with --jit_no_cache) at the same
T. The per-T functions run in alternating order ABCCBA... (--repeats
rounds, best time of each; the median is kept too), so load from other
processes on a shared host favours none. Without --workdir the model is a
random-init Transformer (width 256, 4 layers, --dtype compute; the
zero-init head is randomised so the predictions are not uniform). Every
timed call is compiled first.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import keep_freed_memory
from ddlm_jax.sampling.noise import sample_categorical
from ddlm_jax.sampling.registry import get_sampler, parse_spec


def random_model(args):
  cfg = TransformerConfig(
    vocab_size=args.vocab,
    input_vocab_size=args.vocab + 1,
    width=args.width,
    depth=args.depth,
    num_heads=args.heads,
    dtype=args.dtype,
  )
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  head = params['head']['kernel']
  params['head']['kernel'] = 0.05 * jax.random.normal(
    jax.random.key(1), head.shape
  )
  process = MaskedDiffusion(get_schedule('loglinear'), vocab_size=args.vocab)
  return graphdef, params, process


def load_model(workdir):
  from ddlm_jax.tasks.language_model import load_run

  run = load_run(workdir)
  return run.graphdef, run.eval_params(), run.process


def baseline(apply_params, process, key, *, batch, length, steps):
  """A Python loop, one jitted network call per step (md4 itself jits the
  whole loop: `ancestral_jit_no_cache`)."""
  mask_id, vocab = process.mask_id, process.vocab_size

  @jax.jit
  def step(z, key, i):
    t = 1.0 - i / steps
    s = 1.0 - (i + 1) / steps
    logits = apply_params(z, jnp.full((batch,), t))
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    q = process.reverse_probs(probs, z, s, t)
    stay = jnp.where(i == steps - 1, 0.0, q[..., vocab:])
    q = jnp.concatenate([q[..., :vocab], stay], axis=-1)
    draw = sample_categorical(key, jnp.log(q))
    return jnp.where(z == mask_id, draw, z).astype(jnp.int32)

  def run(key):
    z = jnp.full((batch, length), mask_id, jnp.int32)
    for i in range(steps):
      key, sub = jax.random.split(key)
      z = step(z, sub, i)
    return z, steps

  return run


def _once(fn, key):
  t0 = time.perf_counter()
  tokens, nfe = fn(key)
  jax.block_until_ready(tokens)
  return time.perf_counter() - t0, int(np.sum(np.asarray(nfe)))


def timed(fn, key):
  jax.block_until_ready(fn(key))  # compile / warm up
  return _once(fn, key)


def timed_rounds(fns, key, repeats: int):
  """(best, median, NFE) of each function, run in ABCCBA... order.

  Alternating the order each round spreads load from other processes on a
  shared host over all of them.
  """
  for fn in fns:
    jax.block_until_ready(fn(key))  # compile / warm up
  times = [[] for _ in fns]
  nfes = [0] * len(fns)
  for r in range(repeats):
    order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
    for i in order:
      sec, nfes[i] = _once(fns[i], key)
      times[i].append(sec)
  return [(min(t), float(np.median(t)), n) for t, n in zip(times, nfes)]


def nfe_table(length: int, batch: int, steps_list, vocab: int = 65):
  """NFE of the ancestral sampler vs T: per-row cache, batch cache, none.

  The reveal schedule of ancestral sampling does not depend on the network,
  so a free dummy network gives the exact NFE of any model. The batch-level
  cache (reuse only when no row changed; MDLM's ddpm_cache on a batch) is
  ReMDM with eta = 0 and use_cache.
  """
  process = MaskedDiffusion(get_schedule('loglinear'), vocab_size=vocab)
  dummy = lambda z, t: jnp.zeros(z.shape + (vocab,))
  rows = []
  for steps in steps_list:
    out = {'T': steps, 'length': length, 'batch': batch}
    for label, sampler in (
      ('nfe_per_row_cache', get_sampler('ancestral', num_steps=steps)),
      (
        'nfe_batch_cache',
        get_sampler('remdm', num_steps=steps, eta=0.0, use_cache=True),
      ),
    ):
      fn = jax.jit(
        lambda k, s=sampler: s(dummy, k, process, batch=batch, length=length)
      )
      out[label] = int(fn(jax.random.key(0))[1])
    out['nfe_no_cache'] = steps
    rows.append(out)
    print(json.dumps(out), flush=True)
  return rows


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--workdir', default='', help='run dir (else random model)')
  p.add_argument('--steps', default='64,256,1024')
  p.add_argument('--length', type=int, default=256)
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--width', type=int, default=256)
  p.add_argument('--depth', type=int, default=4)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--vocab', type=int, default=65)
  p.add_argument('--dtype', default='float32', help='random model compute')
  p.add_argument(
    '--fixed',
    default='confidence:tokens_per_step=4',
    help="';'-separated sampler specs timed once",
  )
  p.add_argument('--repeats', type=int, default=2, help='alternating rounds')
  p.add_argument(
    '--repeat_max_steps', type=int, default=256, help='repeat only T <= this'
  )
  p.add_argument(
    '--jit_no_cache',
    action=argparse.BooleanOptionalAction,
    default=True,
    help='also time the uncached ancestral sampler as one jitted loop',
  )
  p.add_argument(
    '--full_pass_row',
    action=argparse.BooleanOptionalAction,
    default=True,
    help='also time the cached sampler with a full pass per call (no '
    'logits_at), to separate what reading only the revealed positions buys',
  )
  p.add_argument('--out', default='', help='write the rows as JSON here')
  p.add_argument(
    '--nfe_table',
    action='store_true',
    help='only print NFE vs --steps for the caches (free dummy network)',
  )
  return p


def run(args) -> list[dict]:
  """The timed rows (one per sampler and T), printed as they come."""
  steps_list = [int(s) for s in args.steps.split(',')]
  if min(steps_list) < 1 or args.repeats < 1:
    raise ValueError('--steps must be positive integers and --repeats >= 1.')
  if args.workdir:
    graphdef, params, process = load_model(args.workdir)
  else:
    graphdef, params, process = random_model(args)
  model = nnx.merge(graphdef, params)
  # The module itself offers logits_at (the cached sampler reads only the
  # revealed positions); the lambda hides it: every call is a full pass.
  full_pass = lambda z, t: model(z, t)
  key = jax.random.key(0)
  shape = dict(batch=args.batch, length=args.length)
  tokens = args.batch * args.length
  rows = []

  def record(name, steps, timing, base=None, md4=None):
    seconds, median, nfe = timing
    row = {
      'sampler': name,
      'T': steps,
      'nfe': nfe,
      'seconds': seconds,
      'seconds_median': median,
      'ms_per_call': 1e3 * seconds / max(nfe, 1),
      'samples_per_sec': args.batch / seconds,
      'tokens_per_sec': tokens / seconds,
      'speedup_vs_baseline': (base / seconds) if base else None,
      'speedup_vs_md4_loop': (md4 / seconds) if md4 else None,
    }
    rows.append(row)
    print(json.dumps(row), flush=True)

  jitted = lambda sampler, apply=model: jax.jit(
    lambda k: sampler(apply, k, process, **shape)
  )
  for steps in steps_list:
    named = {
      'baseline_python_loop': baseline(
        full_pass, process, key, steps=steps, **shape
      )
    }
    if args.jit_no_cache:
      named['ancestral_jit_no_cache'] = jitted(
        get_sampler('ancestral', num_steps=steps, use_cache=False), full_pass
      )
    cached = get_sampler('ancestral', num_steps=steps, use_cache=True)
    if args.full_pass_row:
      named['ancestral_cached_full_pass'] = jitted(cached, full_pass)
    named['ancestral_cached'] = jitted(cached)
    repeats = args.repeats if steps <= args.repeat_max_steps else 1
    timings = timed_rounds(list(named.values()), key, repeats)
    base_s = timings[0][0]
    md4_s = dict(zip(named, timings)).get('ancestral_jit_no_cache')
    for i, (name, timing) in enumerate(zip(named, timings)):
      cached_row = name.startswith('ancestral_cached')
      vs_md4 = md4_s[0] if md4_s and cached_row else None
      record(name, steps, timing, base_s if i else None, vs_md4)
  for spec in filter(None, args.fixed.split(';')):
    name, params = parse_spec(spec)
    sec, nfe = timed(jitted(get_sampler(name, **params)), key)
    record(spec, 0, (sec, sec, nfe))
  return rows


def table(rows: list[dict]) -> str:
  lines = [
    '| sampler | T | NFE | s | ms/call | samples/s | tokens/s | vs baseline '
    '| vs md4 loop |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  fmt = lambda x: f'{x:.2f}x' if x else ''
  for r in rows:
    lines.append(
      f'| {r["sampler"]} | {r["T"] or "-"} | {r["nfe"]} | '
      f'{r["seconds"]:.4g} | {r["ms_per_call"]:.4g} | '
      f'{r["samples_per_sec"]:.3f} | {r["tokens_per_sec"]:.1f} | '
      f'{fmt(r["speedup_vs_baseline"])} | {fmt(r["speedup_vs_md4_loop"])} |'
    )
  return '\n'.join(lines)


def main(argv=None):
  keep_freed_memory()  # ddlm_jax.parallel.host_memory
  args = make_parser().parse_args(argv)
  if args.nfe_table:
    steps = [int(s) for s in args.steps.split(',')]
    return nfe_table(args.length, args.batch, steps)
  rows = run(args)
  print('\n' + table(rows))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == '__main__':
  main()
