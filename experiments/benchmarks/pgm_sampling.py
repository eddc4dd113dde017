"""PGM's sampling cost against MDLM's: FLOPs per sample and tokens/s.

For each seed, one trained MDLM run and one trained PGM run of the same
length draw samples at T = L (MDLM: the cached ancestral sampler, the
suite's default; PGM: its random-order sampler, one position per decoder
call). FLOPs per sample are the work each sampler counts
(`evaluation.sample_run.draw_samples`). Tokens/s come from both samplers
compiled first and then timed in alternating rounds (ABBA..., best of
--repeats; `benchmarks.samplers.timed_rounds`), so load from other
processes falls on both. The ratios MDLM / PGM of FLOPs per sample and
PGM / MDLM of tokens/s are the values of claims `pgm-sampling-flops` and
`pgm-sampling-speed`.

  python -m experiments.benchmarks.pgm_sampling \
    --mdlm=MDLM_RUN_S{seed} --pgm=PGM_RUN_S{seed} --seeds=0,1,2 \
    [--num_samples=4] [--repeats=4] [--json=ROWS.json]

`python -m experiments.reproduce pgm-sampling-speed` (or -flops) runs it
once per seed on the runs of `pgm-bound-near-mdlm`, training them first.

Timings need an idle host: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os

from ddlm_jax.evaluation.sample_run import draw_samples
from ddlm_jax.sampling.registry import get_sampler
from ddlm_jax.tasks.language_model import load_run


def _timed_fn(run, sampler, num_samples: int):
  """The jitted sampler as key -> (tokens, nfe), for `timed_rounds`."""
  import jax

  from ddlm_jax.evaluation.sample_run import make_apply

  apply = make_apply(run.graphdef, run.eval_params())
  length = int(run.settings.data.seq_len)
  return jax.jit(
    lambda key: sampler(
      apply, key, run.process, batch=num_samples, length=length
    )
  )


def measure(
  mdlm_dir: str, pgm_dir: str, *, num_samples: int, seed: int, repeats: int
):
  """{'flops_ratio', 'speed_ratio', 'mdlm': stats, 'pgm': stats}."""
  import jax

  from experiments.benchmarks.samplers import timed_rounds

  out, fns = {}, []
  for name, workdir, spec in (
    ('mdlm', mdlm_dir, 'ancestral'),
    ('pgm', pgm_dir, 'pgm'),
  ):
    run = load_run(workdir)
    steps = run.settings.data.seq_len  # T = L
    sampler = get_sampler(spec, num_steps=steps)
    _, stats = draw_samples(run, sampler, num_samples=num_samples, seed=seed)
    out[name] = {k: stats[k] for k in ('nfe', 'flops_per_sample', 'steps')}
    fns.append(_timed_fn(run, sampler, num_samples))
  timing = timed_rounds(fns, jax.random.key(seed), repeats)
  for name, (best, median, _) in zip(('mdlm', 'pgm'), timing):
    tokens = num_samples * out[name]['steps']
    out[name]['seconds_best'] = best
    out[name]['seconds_median'] = median
    out[name]['sample_tokens_per_sec'] = tokens / best
  out['flops_ratio'] = (
    out['mdlm']['flops_per_sample'] / out['pgm']['flops_per_sample']
  )
  out['speed_ratio'] = (
    out['pgm']['sample_tokens_per_sec'] / out['mdlm']['sample_tokens_per_sec']
  )
  out['load_average'] = os.getloadavg()[0]
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--mdlm', required=True, help='workdir, {seed} filled')
  parser.add_argument('--pgm', required=True, help='workdir, {seed} filled')
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--num_samples', type=int, default=4)
  parser.add_argument('--repeats', type=int, default=4)
  parser.add_argument('--json', default='', help='write the rows here')
  args = parser.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(',')]
  if args.repeats < 1 or args.num_samples < 1:
    parser.error('--repeats and --num_samples must be >= 1')
  rows = []
  for seed in seeds:
    row = measure(
      args.mdlm.format(seed=seed),
      args.pgm.format(seed=seed),
      num_samples=args.num_samples,
      seed=seed,
      repeats=args.repeats,
    )
    print(json.dumps({'seed': seed, **row}), flush=True)
    rows.append(row)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump([{'seed': s, **r} for s, r in zip(seeds, rows)], f, indent=1)
  return rows


if __name__ == '__main__':
  main()
