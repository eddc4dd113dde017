"""Runs the planner/executor reproduction and writes its table.

  python -m experiments.sweep_planner_executor --preset=cpu --seeds=0 \
    --out=runs/pe
  python -m experiments.sweep_planner_executor --task=sudoku4 --preset=cpu \
    --seeds=0,1,2 --out=runs/pe_sudoku4

Every variant is one run of experiments/configs/planner_executor.py with a
workdir under OUT/seed<s>/<variant>; the models are shared through
OUT/seed<s>/models, so the planner and the executors train once per seed.
Writes OUT/results.json (all summaries) and OUT/results.md (the table).
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging

from ddlm_jax.tasks.planner import run_planner_executor
from experiments import sweeps
from experiments.configs import planner_executor as pe_config
from experiments.configs.common import config_arg

# name -> (pipeline, overrides)
VARIANTS = {
  'direct': ('direct', {}),
  'cot': ('cot', {}),
  'text': ('text', {}),
  'text_4steps': ('text', {'plan.steps': 4}),
  # Adaptive decoding orders for global constraints: EB unmasks as many
  # tokens per step as an entropy budget allows; first-hitting one token
  # per step at the first-hitting times.
  'text_eb': ('text', {'plan.sampler': 'eb:greedy=True'}),
  'text_first_hitting': ('text', {'plan.sampler': 'first_hitting:greedy=True'}),
  'latent': ('latent', {}),
  'latent_masked': ('latent', {'latent.source': 'masked'}),
  'latent_unfrozen': ('latent', {'latent.unfreeze_executor': True}),
}

_PRESET = flags.DEFINE_string('preset', 'cpu', "'' | 'cpu' | 'smoke'.")
_TASK = flags.DEFINE_string('task', 'arithmetic', 'Planning task.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds.')
_VARIANTS = flags.DEFINE_list('variants', list(VARIANTS), 'Variants to run.')
_OUT = flags.DEFINE_string('out', 'runs/planner_executor', 'Output folder.')


def _fmt(values, scale=1.0, digits=1):
  return sweeps.mean_std(values, scale, digits)


def table(results: dict, train_levels=(1, 2, 3, 4)) -> str:
  """Markdown table: accuracy per level (%), NFE, tokens, FLOPs."""
  levels = None
  rows = []
  train = '/'.join(str(v) for v in train_levels)
  for name, runs in results.items():
    if not runs:
      continue
    levels = levels or list(runs[0]['per_level'])
    acc = [
      _fmt([r['per_level'][v]['accuracy'] for r in runs], 100) for v in levels
    ]
    plan = [
      _fmt([r['per_level'][v]['plan_accuracy'] for r in runs], 100)
      for v in levels
    ]
    r0 = runs[0]
    rows.append(
      [
        name,
        *acc,
        _fmt([r['accuracy_train_levels'] for r in runs], 100),
        f'{r0["planning_nfe"]:.0f}',
        r0['plan_tokens'],
        r0['latent_tokens'],
        _fmt([r['exec_tokens'] for r in runs], 1, 2),
        f'{r0["flops"] / 1e6:.2f}',
        f'{r0["flops_kv"] / 1e6:.2f}',
        ' / '.join(plan),
      ]
    )
  head = [
    'pipeline',
    *(f'L{v} %' for v in levels or []),
    f'L{train} %',
    'plan NFE',
    'plan tokens',
    'latent tokens',
    'exec tokens',
    'MFLOP/problem (as run)',
    'MFLOP (KV-cached ARM)',
    'plan exact % ' + '/'.join(f'L{v}' for v in levels or []),
  ]
  return sweeps.markdown_table(head, rows)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  out, preset, task = _OUT.value, _PRESET.value, _TASK.value
  train_levels = pe_config.get_config(
    config_arg('direct', task, preset)
  ).reasoning.train_levels
  for name in _VARIANTS.value:
    if name not in VARIANTS:
      raise ValueError(
        f'unknown variant {name!r}; choose from {list(VARIANTS)}.'
      )
  os.makedirs(out, exist_ok=True)
  results = {name: [] for name in _VARIANTS.value}
  t0 = time.time()
  runs = sweeps.grid(
    out,
    _VARIANTS.value,
    [int(s) for s in _SEEDS.value],
    dirname=os.path.join('seed{seed}', '{name}'),
    overrides=lambda name, seed: {
      'models_dir': os.path.join(out, f'seed{seed}', 'models'),
      **VARIANTS[name][1],
    },
  )

  def make_config(name):
    return pe_config.get_config(config_arg(VARIANTS[name][0], task, preset))

  def train(config, workdir):
    name = os.path.basename(workdir)
    print(f'== seed {config.seed} {name} ({time.time() - t0:.0f}s)', flush=True)
    return run_planner_executor(config, workdir)

  # done=None: every variant is scored again; its trainers resume from
  # their checkpoints and the shared models train once per seed.
  for result in sweeps.run_grid(runs, make_config, train):
    results[result.run.name].append(result.summary)
    with open(os.path.join(out, 'results.json'), 'w') as f:
      json.dump(results, f, indent=2)
    with open(os.path.join(out, 'results.md'), 'w') as f:
      f.write(table(results, train_levels) + '\n')
  print(table(results, train_levels))
  print(f'total {time.time() - t0:.0f}s')


if __name__ == '__main__':
  app.run(main)
