"""Fast-dLLM's decoding figures on trained runs, one per training seed.

  python -m experiments.benchmarks.fast_decoding \
    --workdir=runs/quickstart_bpe_long_s0 \
    --workdir=runs/quickstart_bpe_long_s1 \
    --workdir=runs/quickstart_bpe_long_s2 \
    [--scorer=runs/quickstart_bpe_long_ar] [--num_samples=16] \
    [--cache_samples=8] [--repeats=3] [--temperatures=0.8,0.9,1.0] \
    [--out=DIR]

(The runs: `python -m experiments.run
--config=experiments/configs/quickstart_bpe.py:long --workdir=RUN
--config.seed=S` after its AR twin `ar_quickstart_bpe.py:long`.)

Fast-dLLM (arXiv 2505.22618) reports two things for bidirectional masked
models: confidence-threshold parallel decoding (threshold 0.9) reveals
several tokens per network call at almost the quality of one token per
step, and its approximate dual KV cache multiplies tokens/s again at small
quality loss. Per workdir this measures both with the registered samplers:

* threshold, at --threshold_length (256) tokens: the `threshold` sampler at
  threshold 1.0 (one token per call, T = L) and 0.9: tokens per call at
  temperature 1 and the AR twin's gen-NLL at matched entropy (the frontier's
  temperature sweep, interpolated at the validation text's unigram entropy).
* cache, at --cache_length (512) tokens: `approx_cache` in 32-token blocks
  with the same threshold-0.9 rule and a floor of CACHE_FLOOR (4) tokens per
  call, cache 'none' (every call a full pass)
  against 'dual' refreshed at block starts (Fast-dLLM's setting): matched
  gen-NLL, the cache-error meter (KL of cached against exact logits at the
  positions read), and tokens/s of the two compiled samplers timed in
  alternating rounds (ABBA..., best of --repeats) on --cache_samples rows.

Each part's rows are also written as a frontier table and plot
(OUT/sS/threshold_L, OUT/sS/cache_L), and all seeds' results as
OUT/fast_decoding.json. `python -m experiments.reproduce
threshold-tokens-per-call` (or `threshold-gen-nll`, `dual-cache-speedup`,
`dual-cache-gen-nll`; experiments/claims/samplers.py) trains the runs and
runs this once per training seed. Timings mean something only on an idle
host: each result carries the load average seen at its end.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from experiments import frontier
from experiments.benchmarks import seed_results
from experiments.claims.samplers import BLOCK, CACHE_FLOOR, THRESHOLD

TEMPERATURES = (0.8, 0.9, 1.0)


def _config_at(workdir: str, length: int):
  from ddlm_jax.tasks.language_model import load_config

  config = load_config(workdir)
  config.data.seq_len = length
  return config


def _seed_of(workdir: str) -> int:
  from ddlm_jax.tasks.language_model import load_config

  return int(load_config(workdir).seed)


def _point(curve: str, knob: str, params: dict, name: str) -> dict:
  return {'name': name, 'curve': curve, 'knob': knob, 'params': params}


def threshold_points() -> list[dict]:
  """One token per call (threshold 1.0) and the parallel rule (0.9)."""
  return [
    _point('threshold', 'threshold', {'threshold': t}, 'threshold')
    for t in (1.0, THRESHOLD)
  ]


def cache_points() -> list[dict]:
  """Block-wise threshold decoding without a cache and with the dual one.

  Both reveal at least CACHE_FLOOR tokens per call: a small model rarely
  reaches confidence 0.9, and without the floor each 32-token block would
  take 32 calls, which measures the cache on a decoding nobody runs.
  """
  base = {
    'block_length': BLOCK,
    'threshold': THRESHOLD,
    'min_tokens': CACHE_FLOOR,
  }
  return [
    _point('approx_cache none', '', {**base, 'cache': 'none'}, 'approx_cache'),
    _point(
      'approx_cache dual',
      'refresh',
      {**base, 'cache': 'dual', 'refresh': 0},
      'approx_cache',
    ),
  ]


def _saved_rows(out: str, workdir: str, length: int, points, opts, scorer):
  """The rows of an earlier identical part (OUT/frontier.json), or None."""
  path = os.path.join(out, 'frontier.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    old = json.load(f)
  same = (
    old.get('workdir') == workdir
    and old.get('length') == length
    and old.get('scorer') == scorer
    and old.get('num_samples') == opts.num_samples
    and old.get('temperatures') == list(opts.temperatures)
    and [r.get('params') for r in old.get('rows', [])]
    == [p['params'] for p in points]
  )
  return old['rows'] if same else None


def _part(workdir, length, points, opts, out) -> list[dict]:
  config = _config_at(workdir, length)
  loaded = frontier.load(config, workdir, opts)
  rows = _saved_rows(out, workdir, length, points, opts, loaded.scorer_dir)
  if rows is not None:
    print(f'reusing {out}/frontier.json', flush=True)
    return rows, loaded
  skipped: list = []
  rows = frontier.measure(loaded, points, opts, skipped)
  if skipped:
    raise ValueError(f'{workdir}: points failed: {skipped}')
  frontier.write(loaded, workdir, rows, skipped, opts_with(opts, out=out))
  return rows, loaded


def opts_with(opts: frontier.Options, **changes) -> frontier.Options:
  import dataclasses

  return dataclasses.replace(opts, **changes)


def alternating_speed(loaded, points, num_samples: int, repeats: int):
  """Tokens/s of each point's sampler (T = 1), timed ABBA... after compiling.

  Returns [(best seconds, median seconds, NFE)] in points' order.
  """
  import jax

  from ddlm_jax.evaluation.sample_run import make_apply
  from ddlm_jax.sampling.registry import get_sampler
  from experiments.benchmarks.samplers import timed_rounds

  run = loaded.run
  model = make_apply(run.graphdef, run.eval_params())
  length = int(run.settings.data.seq_len)
  fns = []
  for point in points:
    sampler = get_sampler(point['name'], **point['params'])

    def fn(key, sampler=sampler):
      out = sampler.generate(
        model, key, run.process, batch=num_samples, length=length
      )
      return out.tokens_BxL, out.nfe

    fns.append(jax.jit(fn))
  return timed_rounds(fns, jax.random.key(0), repeats)


SETTINGS = (
  'scorer', 'num_samples', 'cache_samples', 'threshold_length',
  'cache_length', 'repeats', 'temperatures',
)  # fmt: skip


def measure_workdir(workdir: str, args) -> dict:
  """Both parts for one training seed's run, reused when already measured.

  A seed's result is saved as OUT/sS/result.json with the settings it was
  measured with; a later call with the same run and settings reads it back
  instead of measuring again, so seeds can be measured as their runs finish
  and the records written once all are in.
  """
  seed = _seed_of(workdir)
  settings = {k: getattr(args, k) for k in SETTINGS}
  saved = seed_results.path(args.out, seed)
  old = seed_results.load_matching(saved, settings=settings, workdir=workdir)
  if old is not None:
    return old
  opts = frontier.Options(
    scorer=args.scorer,
    temperatures=args.temperatures,
    num_samples=args.num_samples,
    seeds=(0,),
  )
  out = os.path.join(args.out, f's{seed}')
  t0 = time.perf_counter()
  thr_rows, _ = _part(
    workdir,
    args.threshold_length,
    threshold_points(),
    opts,
    os.path.join(out, f'threshold_{args.threshold_length}'),
  )
  cache_opts = opts_with(opts, num_samples=args.cache_samples)
  cache_rows, loaded = _part(
    workdir,
    args.cache_length,
    cache_points(),
    cache_opts,
    os.path.join(out, f'cache_{args.cache_length}'),
  )
  timing = alternating_speed(
    loaded, cache_points(), args.cache_samples, args.repeats
  )
  tokens = args.cache_samples * args.cache_length
  one, par = thr_rows
  none, dual = cache_rows
  (none_best, none_med, none_nfe), (dual_best, dual_med, dual_nfe) = timing
  result = {
    'workdir': workdir,
    'seed': seed,
    'threshold': {
      'length': args.threshold_length,
      'one_per_call': _brief(one),
      f'threshold_{THRESHOLD}': _brief(par),
      'gen_nll_ratio': par['gen_nll_matched'] / one['gen_nll_matched'],
    },
    'cache': {
      'length': args.cache_length,
      'none': _brief(none),
      'dual': {**_brief(dual), 'meter': dual.get('meter')},
      'gen_nll_ratio': dual['gen_nll_matched'] / none['gen_nll_matched'],
      'timing': {
        'rows': args.cache_samples,
        'repeats': args.repeats,
        'none_seconds_best': none_best,
        'none_seconds_median': none_med,
        'dual_seconds_best': dual_best,
        'dual_seconds_median': dual_med,
        'none_nfe': none_nfe,
        'dual_nfe': dual_nfe,
        'none_tokens_per_sec': tokens / none_best,
        'dual_tokens_per_sec': tokens / dual_best,
        'speedup': none_best / dual_best,
        'speedup_median': none_med / dual_med,
      },
    },
    'seconds': time.perf_counter() - t0,
    'load_average': os.getloadavg(),
    'settings': settings,
  }
  print(json.dumps(result, indent=1), flush=True)
  seed_results.save(saved, result)
  return result


def _brief(row: dict) -> dict:
  keys = (
    'nfe', 'tokens_per_call', 'tokens_per_sec', 'flops_per_sample',
    'entropy', 'gen_nll', 'gen_nll_matched', 'entropy_gap',
  )  # fmt: skip
  return {k: row[k] for k in keys if k in row}


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[1])
  p.add_argument('--workdir', action='append', required=True)
  p.add_argument('--scorer', default='', help='AR twin (default: the config)')
  p.add_argument('--num_samples', type=int, default=16)
  p.add_argument('--cache_samples', type=int, default=8)
  p.add_argument('--threshold_length', type=int, default=256)
  p.add_argument('--cache_length', type=int, default=512)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument(
    '--temperatures',
    type=lambda text: [float(t) for t in text.split(',') if t.strip()],
    default=list(TEMPERATURES),
    help='the sweep that matches entropy, e.g. 0.8,0.9,1.0',
  )
  p.add_argument('--out', default='runs/fast_decoding')
  return p


def check_args(args) -> None:
  """One-line errors before any run is loaded."""
  from ddlm_jax.tasks.language_model import load_config

  if min(args.num_samples, args.cache_samples, args.repeats) < 1:
    raise ValueError(
      '--num_samples, --cache_samples and --repeats must be >= 1'
    )
  if not args.temperatures or min(args.temperatures) <= 0:
    raise ValueError(
      f'--temperatures={args.temperatures}: give positive values, e.g. 0.9,1.0'
    )
  if args.cache_length % BLOCK or args.threshold_length < 1:
    raise ValueError(
      f'--cache_length={args.cache_length} must be a multiple of the '
      f'{BLOCK}-token block; --threshold_length must be positive.'
    )
  for workdir in args.workdir:
    load_config(workdir)  # FileNotFoundError naming a missing run.
  seeds = [_seed_of(w) for w in args.workdir]
  if len(set(seeds)) != len(seeds):
    raise ValueError(
      f'--workdir runs share training seeds {seeds}: give one run per seed.'
    )


def main(argv=None) -> list[dict]:
  import sys

  args = make_parser().parse_args(argv)
  try:
    check_args(args)
  except (ValueError, FileNotFoundError) as err:
    print(f'error: {err}', file=sys.stderr)
    raise SystemExit(2) from None
  results = [measure_workdir(w, args) for w in args.workdir]
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'fast_decoding.json'), 'w') as f:
    json.dump(results, f, indent=1)
  speed = [r['cache']['timing']['speedup'] for r in results]
  tpc = [
    r['threshold'][f'threshold_{THRESHOLD}']['tokens_per_call'] for r in results
  ]
  print(f'threshold {THRESHOLD}: tokens/call {np.round(tpc, 2).tolist()}')
  print(f'dual cache speed-up: {np.round(speed, 2).tolist()}')
  return results


if __name__ == '__main__':
  main()
