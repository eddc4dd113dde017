"""Soft-masking reproduction: three arms x seeds, then quality against T.

  python -m experiments.sweep_soft_masking --init_from=runs/quickstart \
    --scorer=runs/ar_quickstart --seeds=0,1,2 --out=runs/sm

For every seed, trains the arms of experiments/configs/sm_continue.py (SM,
plain at equal steps, plain at equal compute) from the same MDLM checkpoint
into OUT/ARM_sSEED (a finished run is skipped, an interrupted one resumes),
then samples each run with the cached ancestral sampler at every --steps
value and scores the samples (gen-ppl under the AR scorer, unigram entropy,
MAUVE against validation text) through experiments.sweep_samplers, into
OUT/ARM_sSEED/sweep. The starting checkpoint is swept too (OUT/start_sweep).
Writes OUT/results.json, OUT/results.md (validation bits/char and quality
per T, mean +- std over seeds) and OUT/quality_vs_steps.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from experiments.configs import sm_continue

METRICS = (
  ('gen_ppl_corpus', 'gen-ppl'),
  ('unigram_entropy_bits', 'entropy (bits)'),
  ('mauve', 'MAUVE'),
)


def train_arm(arm, seed, init_from, workdir, preset='') -> dict:
  """Trains one arm (skipped when its summary says it finished)."""
  from ddlm_jax.training.loop import train_and_evaluate

  path = os.path.join(workdir, 'summary.json')
  if os.path.exists(path):
    with open(path) as f:
      summary = json.load(f)
    if 'validation' in summary:
      print(f'skip {workdir} (finished)', flush=True)
      return summary
  config = sm_continue.get_config(f'{arm},{preset}' if preset else arm)
  config.seed = seed
  config.train.init_from = init_from
  config.sample.num_samples = 0  # The sweep below samples.
  return train_and_evaluate(config, workdir)


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
    subprocess.run(cmd, check=True)
  with open(path) as f:
    return json.load(f)


PROFILE_TIMES = (0.1, 0.3, 0.5, 0.7, 0.9)


def lambda_profile(workdir: str, num_batches: int = 8) -> dict:
  """Mean lambda over masked validation positions at fixed times t.

  z_t is drawn at each t, pass 1 (the plain network) predicts, and lambda
  is read from its logits exactly as pass 2 would: how much feedback the
  trained SM layer lets through at each masking level.
  """
  import jax
  import jax.numpy as jnp

  from ddlm_jax.training.restore import load_run
  from ddlm_jax.training.steps import make_apply

  run = load_run(workdir)
  process = run.process
  graphdef = run.graphdef

  @jax.jit
  def stats(params, key, x_BxL, t):
    model = make_apply(graphdef, params)
    t_B = jnp.full((x_BxL.shape[0],), t)
    z_BxL = process.corrupt(key, x_BxL, t_B)
    lam_BxL = model.feedback_lambda(model(z_BxL, t_B))
    masked = (z_BxL == process.mask_id).astype(jnp.float32)
    return jnp.sum(lam_BxL * masked), jnp.sum(masked), jnp.max(lam_BxL)

  batches = run.data.eval_batches(
    'validation', seq_len=run.config.data.seq_len, batch_size=32,
    max_batches=num_batches,
  )  # fmt: skip
  out = {}
  for t in PROFILE_TIMES:
    num = den = peak = 0.0
    for i, b in enumerate(batches):
      n, d, m = stats(
        run.eval_params(), jax.random.key(i), jnp.asarray(b['tokens']), t
      )
      num, den, peak = num + float(n), den + float(d), max(peak, float(m))
    out[str(t)] = {'mean_lambda': num / max(den, 1.0), 'max_lambda': peak}
  w_s, w_a, w_b = (
    float(v)
    for v in make_apply(graphdef, run.eval_params()).soft_mask.scalars()
  )
  run.checkpointer.close()
  return {'by_t': out, 'w_s': w_s, 'w_a': w_a, 'w_b': w_b}


def _mean_std(values) -> str:
  v = np.asarray([x for x in values if x is not None], float)
  if v.size == 0:
    return '-'
  return f'{v.mean():.3f} +- {v.std():.3f}' if v.size > 1 else f'{v[0]:.3f}'


def aggregate(results: dict, steps: list[int]) -> str:
  """Markdown tables: validation bound per arm, quality per (arm, T)."""
  lines = ['| arm | steps | validation bits/char | n |', '|---|---|---|---|']
  for arm, runs in results['arms'].items():
    if not runs:
      continue
    bpc = [r['validation']['bits_per_token'] for r in runs]
    lines.append(
      f'| {arm} | {runs[0]["steps"]} | {_mean_std(bpc)} | {len(runs)} |'
    )
  lines += ['', '| arm | T | NFE | ' + ' | '.join(n for _, n in METRICS)
            + ' |', '|---|---|---|' + '---|' * len(METRICS)]  # fmt: skip
  arms = [(a, r) for a, r in results['arms'].items() if r]
  for arm, runs in [('start', [results['start']])] + arms:
    for t in steps:
      rows = [_row(r['sweep'], t) for r in runs]
      rows = [r for r in rows if r]
      if not rows:
        continue
      cells = [_mean_std([r.get(k) for r in rows]) for k, _ in METRICS]
      nfe = _mean_std([r['nfe'] for r in rows])
      lines.append(f'| {arm} | {t} | {nfe} | ' + ' | '.join(cells) + ' |')
  profiles = [
    r['lambda'] for r in results['arms'].get('sm', []) if 'lambda' in r
  ]
  if profiles:
    lines += ['', '| SM run | w_s | w_a | w_b | ' + ' | '.join(
      f'mean lambda at t={t}' for t in PROFILE_TIMES) + ' |',
      '|---|---|---|---|' + '---|' * len(PROFILE_TIMES)]  # fmt: skip
    for r in results['arms']['sm']:
      prof = r.get('lambda')
      if prof:
        cells = [f'{prof["by_t"][str(t)]["mean_lambda"]:.4f}'
                 for t in PROFILE_TIMES]  # fmt: skip
        lines.append(
          f'| seed {r["seed"]} | {prof["w_s"]:.3f} | {prof["w_a"]:.3f} | '
          f'{prof["w_b"]:.3f} | ' + ' | '.join(cells) + ' |'
        )
  ref = results['start']['sweep']['reference']
  lines.append(
    f'\nValidation text: gen-ppl {ref["gen_ppl_corpus"]:.3f}, entropy '
    f'{ref["unigram_entropy_bits"]:.3f} bits.'
  )
  return '\n'.join(lines) + '\n'


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
  args = p.parse_args()
  steps = [int(s) for s in args.steps.split(',')]
  arms = args.arms.split(',')
  os.makedirs(args.out, exist_ok=True)
  results = {'arms': {a: [] for a in arms}, 'args': vars(args)}
  results['start'] = {'sweep': sweep(args.init_from, args)}
  for seed in [int(s) for s in args.seeds.split(',')]:
    for arm in arms:
      workdir = os.path.join(args.out, f'{arm}_s{seed}')
      summary = train_arm(arm, seed, args.init_from, workdir, args.preset)
      results['arms'][arm].append(
        {
          'seed': seed,
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
