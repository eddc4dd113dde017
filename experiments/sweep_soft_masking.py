"""Soft-masking reproduction: three arms x seeds, then quality against T.

  python -m experiments.sweep_soft_masking --init_from=runs/mdlm_quickstart \
    --scorer=runs/ar_quickstart --seeds=0,1,2 --out=runs/sm

For every seed, trains the arms of experiments/configs/sm_continue.py (SM,
plain at equal steps, plain at equal compute) from the same MDLM checkpoint
into OUT/ARM_sSEED (a finished run is skipped, an interrupted one resumes),
then samples each run with the cached ancestral sampler at every --steps
value and scores the samples (gen-ppl under the AR scorer, unigram entropy,
MAUVE against validation text) through experiments.sweep_samplers, into
OUT/ARM_sSEED/sweep. The starting checkpoint is swept too (OUT/start_sweep).
Writes OUT/results.json, OUT/results.md (validation bits/token and
bits/char, quality per T, mean +- std over seeds) and
OUT/quality_vs_steps.png.

--base=CONFIG.py runs the arms in another regime: every data, model,
process and eval key, and train.batch_size, in which that config (e.g.
experiments/configs/quickstart_bpe.py, the BPE quickstart) differs from
the quickstart recipe (mdlm_quickstart.py) is set on each arm, so the arms keep
their optimiser, steps and soft-masking settings and match the --init_from
run's tokenizer, sequence length and network:

  python -m experiments.sweep_soft_masking --init_from=runs/quickstart_bpe \
    --scorer=runs/quickstart_bpe_ar \
    --base=experiments/configs/quickstart_bpe.py --out=runs/sm_bpe
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np

from ddlm_jax.evaluation import soft_masking
from ddlm_jax.tasks.language_model import chars_per_token, load_run
from experiments import sweeps
from experiments.configs import quickstart, sm_continue
from experiments.configs.common import config_arg, override

METRICS = (
  ('gen_ppl_corpus', 'gen-ppl'),
  ('unigram_entropy_bits', 'entropy (bits)'),
  ('mauve', 'MAUVE'),
)


def _finished(summary: dict | None) -> bool:
  return bool(summary) and 'validation' in summary


def _train(config, workdir) -> dict:
  from ddlm_jax.tasks.language_model import train_and_evaluate

  return train_and_evaluate(config, workdir)


# Keys --base may carry over: these blocks and the training batch (it sets
# the tokens per step with data.seq_len); optimiser, steps, soft_mask and
# the sampling block (the sweep samples through sweep_samplers) stay the
# arm's.
BASE_BLOCKS = ('data', 'model', 'process', 'eval')
BASE_KEYS = ('train.batch_size',)
# What the --init_from network must share with the arms to warm-start them.
MATCH_KEYS = (
  'data.tokenizer',
  'data.bpe_vocab_size',
  'data.seq_len',
  'data.corpus',
  'model.width',
  'model.depth',
  'model.num_heads',
  'process.kind',
)


def _flat(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def load_config_module(path: str):
  """The module of a config file path (as --config=PATH names it)."""
  if not os.path.isfile(path):
    raise ValueError(
      f'--base={path!r} is not a file; pass a config path such as '
      'experiments/configs/quickstart_bpe.py.'
    )
  spec = importlib.util.spec_from_file_location('_sm_base_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def base_overrides(base_path: str, preset: str) -> dict:
  """{dotted key: value} where the base differs from quickstart.recipe."""
  if not base_path:
    return {}
  base = _flat(load_config_module(base_path).get_config(preset).to_dict())
  ref = _flat(quickstart.recipe(preset).to_dict())
  return {
    k: v
    for k, v in base.items()
    if (k.split('.')[0] in BASE_BLOCKS or k in BASE_KEYS) and ref.get(k) != v
  }


def arm_config(arm: str, args):
  """sm_continue's arm, moved to the --base regime."""
  c = sm_continue.get_config(config_arg(arm, args.preset))
  return override(c, base_overrides(args.base, args.preset))


def check_init_from(config, init_from: str):
  """ValueError before training if the start run cannot warm-start arms."""
  path = os.path.join(init_from, 'config.json')
  if not os.path.exists(path):
    raise ValueError(
      f'--init_from={init_from!r} has no config.json; train that run first.'
    )
  with open(path) as f:
    start = _flat(json.load(f))
  arm = _flat(config.to_dict())
  bad = [
    f'{k}: start {start.get(k)!r} vs arm {arm.get(k)!r}'
    for k in MATCH_KEYS
    if start.get(k) != arm.get(k)
  ]
  if bad:
    raise ValueError(
      f'--init_from={init_from} was trained with other settings than the '
      f'arms ({"; ".join(bad)}); pass --base=CONFIG.py with the config that '
      'run was trained with (e.g. experiments/configs/quickstart_bpe.py).'
    )


def train_arms(arms, seeds, args):
  """Trains every arm at every seed into OUT/ARM_sSEED (finished: skipped)."""
  runs = sweeps.grid(
    args.out,
    arms,
    seeds,
    overrides=lambda arm, seed: {
      'train.init_from': args.init_from,
      'sample.num_samples': 0,  # The sweep below samples.
    },
  )
  make_config = lambda arm: arm_config(arm, args)
  return sweeps.run_grid(runs, make_config, _train, done=_finished)


def sweep(workdir: str, args) -> dict:
  """Runs experiments.sweep_samplers on a run; returns its results.json."""
  out = os.path.join(workdir, 'sweep') if workdir != args.init_from else (
    os.path.join(args.out, 'start_sweep')
  )  # fmt: skip
  path = os.path.join(out, 'results.json')
  if not os.path.exists(path):
    cmd = [
      sys.executable, '-m', 'experiments.sweep_samplers',
      f'--workdir={workdir}', f'--scorer={args.scorer}',
      '--samplers=ancestral', f'--steps={args.steps}',
      f'--num_samples={args.num_samples}', f'--out={out}',
    ]  # fmt: skip
    if args.mauve:
      cmd.append('--mauve')
    if args.batch:
      cmd.append(f'--batch={args.batch}')
    subprocess.run(cmd, check=True)
  with open(path) as f:
    return json.load(f)


def lambda_profile(workdir: str, num_batches: int = 8) -> dict:
  """Mean lambda over masked validation positions at fixed times t."""
  run = load_run(workdir)
  run.close()
  return soft_masking.lambda_profile(run, num_batches=num_batches)


_mean_std = sweeps.mean_std


def aggregate(results: dict, steps: list[int]) -> str:
  """Markdown tables: validation bound per arm, quality per (arm, T)."""
  bound = []
  cpt = results.get('chars_per_token', 1.0)
  for arm, runs in results['arms'].items():
    if runs:
      bpt = [r['validation']['bits_per_token'] for r in runs]
      bound.append([
        arm, runs[0]['steps'], _mean_std(bpt, digits=4),
        _mean_std(bpt, scale=1.0 / cpt, digits=4), len(runs),
      ])  # fmt: skip
  quality = []
  arms = [(a, r) for a, r in results['arms'].items() if r]
  for arm, runs in [('start', [results['start']])] + arms:
    for t in steps:
      rows = [_row(r['sweep'], t) for r in runs]
      rows = [r for r in rows if r]
      if rows:
        cells = [_mean_std([r.get(k) for r in rows]) for k, _ in METRICS]
        quality.append([arm, t, _mean_std([r['nfe'] for r in rows]), *cells])
  tables = [
    sweeps.markdown_table(
      ['arm', 'steps', 'validation bits/token', 'bits/char', 'n'], bound
    ),
    sweeps.markdown_table(
      ['arm', 'T', 'NFE', *(n for _, n in METRICS)], quality
    ),
  ]
  sm_runs = [r for r in results['arms'].get('sm', []) if r.get('lambda')]
  if sm_runs:
    head = ['SM run', 'w_s', 'w_a', 'w_b']
    head += [f'mean lambda at t={t}' for t in soft_masking.PROFILE_TIMES]
    rows = []
    for r in sm_runs:
      prof = r['lambda']
      rows.append(
        [f'seed {r["seed"]}']
        + [f'{prof[w]:.3f}' for w in ('w_s', 'w_a', 'w_b')]
        + [
          f'{prof["by_t"][str(t)]["mean_lambda"]:.4f}'
          for t in soft_masking.PROFILE_TIMES
        ]
      )
    tables.append(sweeps.markdown_table(head, rows))
  ref = results['start']['sweep']['reference']
  return (
    '\n\n'.join(tables)
    + f'\n\nValidation text: gen-ppl {ref["gen_ppl_corpus"]:.3f}, entropy '
    f'{ref["unigram_entropy_bits"]:.3f} bits.\n'
  )


def _row(sweep_result: dict, t: int) -> dict | None:
  for r in sweep_result['rows']:
    if r['params'].get('num_steps') == t:
      return r
  return None


def plot(results: dict, steps: list[int], path: str):
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
  groups = [('start', [results['start']])] + list(results['arms'].items())
  for ax, (key, name) in zip(axes, METRICS):
    for arm, runs in groups:
      mean, std, ts = [], [], []
      for t in steps:
        vals = [(_row(r['sweep'], t) or {}).get(key) for r in runs]
        vals = [v for v in vals if v is not None]
        if vals:
          ts.append(t)
          mean.append(np.mean(vals))
          std.append(np.std(vals))
      if ts:
        ax.errorbar(ts, mean, yerr=std, marker='o', capsize=3, label=arm)
    ref = results['start']['sweep']['reference'].get(key)
    if ref is not None and key != 'gen_ppl_corpus':  # 4.9: off the scale.
      ax.axhline(ref, color='gray', ls=':', label='validation text')
    ax.set_xscale('log', base=2)
    ax.set_xlabel('sampling steps T')
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle('Soft-masking vs plain MDLM (mean +- std over seeds)')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--init_from', required=True, help='MDLM run directory')
  p.add_argument('--scorer', required=True, help='AR run directory')
  p.add_argument('--arms', default=','.join(sm_continue.ARMS))
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--steps', default='8,16,32,64,128')
  p.add_argument('--num_samples', type=int, default=128)
  p.add_argument('--no_mauve', dest='mauve', action='store_false')
  p.add_argument('--out', default='runs/sm')
  p.add_argument('--preset', default='', help="'smoke': seconds (tests)")
  p.add_argument(
    '--base',
    default='',
    help='config file of the regime (default: the char quickstart)',
  )
  p.add_argument(
    '--batch', type=int, default=0, help='samples per sampler call'
  )
  args = p.parse_args()
  steps = [int(s) for s in args.steps.split(',')]
  arms = args.arms.split(',')
  check_init_from(arm_config(arms[0], args), args.init_from)
  os.makedirs(args.out, exist_ok=True)
  results = {'arms': {a: [] for a in arms}, 'args': vars(args)}
  results['chars_per_token'] = chars_per_token(args.init_from)
  results['start'] = {'sweep': sweep(args.init_from, args)}
  seeds = [int(s) for s in args.seeds.split(',')]
  for result in train_arms(arms, seeds, args):
    arm, workdir, summary = result.run.name, result.run.workdir, result.summary
    results['arms'][arm].append(
      {
        'seed': result.run.seed,
        'steps': summary['steps'],
        'train_seconds': summary.get('train_seconds'),
        'validation': summary['validation'],
        'sweep': sweep(workdir, args),
      }
    )
    if arm == 'sm':
      results['arms'][arm][-1]['lambda'] = lambda_profile(workdir)
    with open(os.path.join(args.out, 'results.json'), 'w') as f:
      json.dump(results, f, indent=2)
    table = aggregate(results, steps)
    with open(os.path.join(args.out, 'results.md'), 'w') as f:
      f.write(table)
    plot(results, steps, os.path.join(args.out, 'quality_vs_steps.png'))
  print(table)


if __name__ == '__main__':
  main()
