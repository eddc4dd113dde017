"""Sweep of the state-tracking benchmark: models x tasks x seeds, one process.

  python -m experiments.sweep_state_tracking --models=pdssm,complex_diag \
    --tasks=parity,cycle_nav --seeds=0,1,2 --preset=cpu --out=runs/st_sweep

Each run trains in OUT/MODEL_TASK_sSEED through
``classification.train_state_tracking``; a run whose summary.json says it
finished is skipped, an interrupted one resumes from its checkpoint. Runs go
seed by seed (every model and task at seed 0 first), so a partial sweep
already fills the table. After every run OUT/results.json and OUT/results.md
are rewritten: test accuracy (%) mean +- std over the finished seeds per
(model, task), next to the paper's Table 2 (REFERENCE.md section 5).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import app, flags, logging

from experiments.configs import state_tracking as cfgs

_MODELS = flags.DEFINE_list('models', ['pdssm', 'complex_diag'], 'Models.')
_TASKS = flags.DEFINE_list('tasks', ['parity', 'cycle_nav'], 'Tasks.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_PRESET = flags.DEFINE_string('preset', 'cpu', "'' (paper), 'cpu', 'smoke'.")
# Not a required flag: absl validates every registered flag on parse, and
# other entry points may parse in the same process (tests, notebooks).
_OUT = flags.DEFINE_string('out', 'runs/st_sweep', 'Output folder.')
_STEPS = flags.DEFINE_integer('num_steps', 0, 'Override train steps (0: no).')


def run_dir(out: str, model: str, task: str, seed: int) -> str:
  return os.path.join(out, f'{model}_{task}_s{seed}')


def load_summary(workdir: str) -> dict | None:
  path = os.path.join(workdir, 'summary.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _done(summary: dict | None) -> bool:
  return bool(summary) and (summary['finished'] or summary['status'] == 'nan')


def _cell(values: list[float]) -> str:
  if not values:
    return '-'
  v = 100 * np.asarray(values)
  return f'{v.mean():.1f} +- {v.std():.1f} (n={len(v)})'


def _paper(model: str, task: str) -> str:
  entry = cfgs.PAPER_TABLE2.get(model, {}).get(task)
  if entry is None:
    return '-'
  mean, std = entry
  return f'{mean:.1f}' if std is None else f'{mean:.1f} +- {std:.1f}'


def results_table(
  out: str, models: list[str], tasks: list[str], seeds: list[int]
) -> dict:
  """Collects the finished runs; writes OUT/results.{json,md}."""
  rows, lines = [], []
  header = '| model | ' + ' | '.join(tasks) + ' |'
  lines += [header, '|---' * (len(tasks) + 1) + '|']
  for model in models:
    ours, paper = [], []
    for task in tasks:
      runs = [load_summary(run_dir(out, model, task, s)) for s in seeds]
      runs = [r for r in runs if _done(r) and 'test_accuracy' in r]
      acc = [r['test_accuracy'] for r in runs]
      rows.append(
        {
          'model': model,
          'task': task,
          'seeds': [r['seed'] for r in runs],
          'test_accuracy': acc,
          'mean': float(np.mean(acc)) if acc else None,
          'std': float(np.std(acc)) if acc else None,
          'test_accuracy_final': [r['test_accuracy_final'] for r in runs],
          'status': [r['status'] for r in runs],
          'wall_s': [r['wall_s'] for r in runs],
          'paper': cfgs.PAPER_TABLE2.get(model, {}).get(task),
        }
      )
      ours.append(_cell(acc))
      paper.append(_paper(model, task))
    lines.append(f'| {model} (ours) | ' + ' | '.join(ours) + ' |')
    lines.append(f'| {model} (paper) | ' + ' | '.join(paper) + ' |')
  wall = sum(sum(r['wall_s']) for r in rows)
  text = (
    '# State-tracking sweep: test accuracy (%), mean +- std over seeds\n\n'
    + '\n'.join(lines)
    + f'\n\nTotal run wall time {wall / 60:.1f} min. Paper: Table 2 of '
    'arXiv 2509.22284, 5 seeds (random: 50 / 20 / 20 / 50 for parity / '
    'cycle nav / mod arith / even pairs).\n'
  )
  with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write(text)
  result = {'runs': rows, 'total_wall_s': wall}
  with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump(result, f, indent=2)
  return result


def sweep(
  out: str,
  models: list[str],
  tasks: list[str],
  seeds: list[int],
  preset: str = 'cpu',
  num_steps: int = 0,
) -> dict:
  """Runs every missing (model, task, seed); returns the results table."""
  from ddlm_jax.training import classification

  configs = {
    (m, t): cfgs.get_config(f'{m},{t},{preset}') for m in models for t in tasks
  }  # Validates every name before the first run starts.
  os.makedirs(out, exist_ok=True)
  for seed in seeds:
    for model in models:
      for task in tasks:
        workdir = run_dir(out, model, task, seed)
        if _done(load_summary(workdir)):
          print(f'skip {workdir} (finished)', flush=True)
          continue
        config = configs[(model, task)].copy_and_resolve_references()
        config.seed = seed
        if num_steps:
          config.train.num_steps = num_steps
        t0 = time.time()
        summary = classification.train_state_tracking(config, workdir)
        print(
          f'== {model} {task} seed {seed}: test '
          f'{summary.get("test_accuracy", float("nan")):.4f} '
          f'({time.time() - t0:.0f} s)',
          flush=True,
        )
        results_table(out, models, tasks, seeds)
  return results_table(out, models, tasks, seeds)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in _SEEDS.value]
  result = sweep(
    _OUT.value, _MODELS.value, _TASKS.value, seeds, _PRESET.value, _STEPS.value
  )
  with open(os.path.join(_OUT.value, 'results.md')) as f:
    print(f.read())
  print(f'total run wall time {result["total_wall_s"] / 60:.1f} min')


if __name__ == '__main__':
  app.run(main)
