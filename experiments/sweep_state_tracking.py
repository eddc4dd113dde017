"""Sweep of the state-tracking benchmark: models x tasks x seeds, one process.

  python -m experiments.sweep_state_tracking --models=pdssm,complex_diag \
    --tasks=parity,cycle_nav --seeds=0,1,2 --preset=cpu --out=runs/st_sweep

Each run trains in OUT/MODEL_TASK_sSEED through
``st_task.train_state_tracking``; a run whose summary.json says it
finished is skipped, an interrupted one resumes from its checkpoint. Runs go
seed by seed (every model and task at seed 0 first), so a partial sweep
already fills the table. After every run OUT/results.json and OUT/results.md
are rewritten: test accuracy (%) mean +- std over the finished seeds per
(model, task), next to the paper's Table 2. At the
end OUT/curves.png plots validation accuracy against step for every run and
OUT/accuracy_by_length.png test accuracy against test length (``--rescore``
adds that breakdown to runs recorded without it).
"""

from __future__ import annotations

import itertools
import json
import os
import time

import ml_collections
import numpy as np
from absl import app, flags, logging

from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training.metrics import read_metrics, write_json
from experiments import sweeps
from experiments.configs import state_tracking as cfgs
from experiments.configs.common import config_arg

_MODELS = flags.DEFINE_list('models', ['pdssm', 'complex_diag'], 'Models.')
_TASKS = flags.DEFINE_list('tasks', ['parity', 'cycle_nav'], 'Tasks.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_PRESET = flags.DEFINE_string('preset', 'cpu', "'' (paper), 'cpu', 'smoke'.")
# Not a required flag: absl validates every registered flag on parse, and
# other entry points may parse in the same process (tests, notebooks).
_OUT = flags.DEFINE_string('out', 'runs/st_sweep', 'Output folder.')
_STEPS = flags.DEFINE_integer('num_steps', 0, 'Override train steps (0: no).')
_RESCORE = flags.DEFINE_bool(
  'rescore',
  False,
  'Only add accuracy by test length to finished runs that lack it (runs '
  'recorded before summaries carried it), then redraw the plots and table.',
)


def _name(model: str, task: str) -> str:
  return f'{model}_{task}'


def run_dir(out: str, model: str, task: str, seed: int) -> str:
  return os.path.join(out, f'{_name(model, task)}_s{seed}')


def _run_dirs(out: str, models, tasks, seeds):
  """(task, model, seed, workdir) for every run of the grid, task-major."""
  for task, model, seed in itertools.product(tasks, models, seeds):
    yield task, model, seed, run_dir(out, model, task, seed)


load_summary = sweeps.load_summary


def _done(summary: dict | None) -> bool:
  return bool(summary) and (summary['finished'] or summary['status'] == 'nan')


def _cell(values: list[float]) -> str:
  return sweeps.mean_std(values, scale=100, digits=1, show_n=True)


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
  rows, cells = [], []
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
          'test_accuracy_by_length': [
            r.get('test_accuracy_by_length') for r in runs
          ],
          'status': [r['status'] for r in runs],
          'wall_s': [r['wall_s'] for r in runs],
          'paper': cfgs.PAPER_TABLE2.get(model, {}).get(task),
        }
      )
      ours.append(_cell(acc))
      paper.append(_paper(model, task))
    cells += [[f'{model} (ours)', *ours], [f'{model} (paper)', *paper]]
  wall = sum(sum(r['wall_s']) for r in rows)
  text = (
    '# State-tracking sweep: test accuracy (%), mean +- std over seeds\n\n'
    + sweeps.markdown_table(['model', *tasks], cells)
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


def plot_curves(
  out: str, models: list[str], tasks: list[str], seeds: list[int]
) -> str | None:
  """OUT/curves.png: validation accuracy against step, one panel per task.

  State-tracking runs sit on a chance plateau and then jump; the curves show
  where (and whether) each seed left it, which the final table cannot.
  """
  curves = {}
  for task, model, seed, workdir in _run_dirs(out, models, tasks, seeds):
    val = [r for r in read_metrics(workdir) if r.get('split') == 'validation']
    if val:
      curves[(task, model, seed)] = (
        [r['step'] for r in val],
        [100 * r['accuracy'] for r in val],
      )
  if not curves:
    return None
  colors = {m: f'C{i}' for i, m in enumerate(models)}

  def draw(ax, task):
    for (t, model, seed), (steps, acc) in curves.items():
      if t == task:
        label = model if seed == min(seeds) else None
        ax.plot(steps, acc, color=colors[model], alpha=0.8, label=label)

  shown = [t for t in tasks if any(k[0] == t for k in curves)]
  return _task_panels(
    os.path.join(out, 'curves.png'),
    shown,
    draw,
    'step',
    'validation accuracy (%), lengths 40-256',
  )


def rescore_by_length(workdir: str, num_buckets: int = 6) -> dict:
  """Adds test accuracy by length bucket to a finished run's summary.json.

  For runs recorded before summaries carried the breakdown: rebuilds the
  test split and the model from workdir/config.json, restores the last
  checkpoint and scores its best-validation parameters. The overall accuracy
  must reproduce the recorded one (a mismatch raises: the run folder and the
  code disagree).
  """
  summary_path = os.path.join(workdir, 'summary.json')
  with open(summary_path) as f:
    summary = json.load(f)
  if not summary.get('finished') or 'test_accuracy' not in summary:
    raise ValueError(f'{workdir}: not a finished run with a test score.')
  with open(os.path.join(workdir, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  res, test = st_task.score_best(config, st_task.restore_state(config, workdir))
  if abs(res['accuracy'] - summary['test_accuracy']) > 1e-6:
    raise ValueError(
      f'{workdir}: rescored test accuracy {res["accuracy"]:.6f} differs '
      f'from the recorded {summary["test_accuracy"]:.6f}.'
    )
  summary['test_accuracy_by_length'] = st_task.accuracy_by_length(
    res['hit'], test['lengths'], num_buckets
  )
  write_json(summary_path, summary)
  return summary


def rescore(
  out: str, models: list[str], tasks: list[str], seeds: list[int]
) -> int:
  """Adds accuracy by length to finished runs that lack it; returns count."""
  count = 0
  for _, _, _, workdir in _run_dirs(out, models, tasks, seeds):
    summary = load_summary(workdir) or {}
    if (
      summary.get('finished')
      and 'test_accuracy' in summary
      and 'test_accuracy_by_length' not in summary
    ):
      rescore_by_length(workdir)
      print(f'rescored {workdir}', flush=True)
      count += 1
  return count


def plot_by_length(
  out: str, models: list[str], tasks: list[str], seeds: list[int]
) -> str | None:
  """OUT/accuracy_by_length.png: test accuracy against test length.

  One panel per task, one line per model (mean over the seeds that have the
  breakdown; thin lines are single seeds). Flat near 100% is extrapolation;
  a fall from the shortest test lengths is a model that fitted short
  sequences only.
  """
  data = {}
  for task, model, _, workdir in _run_dirs(out, models, tasks, seeds):
    rows = (load_summary(workdir) or {}).get('test_accuracy_by_length')
    if rows:
      data.setdefault((task, model), []).append(rows)
  if not data:
    return None

  def draw(ax, task):
    for i, model in enumerate(models):
      runs = data.get((task, model), [])
      for rows in runs:
        mid = [sum(r['lengths']) / 2 for r in rows]
        acc = [100 * r['accuracy'] for r in rows]
        ax.plot(mid, acc, color=f'C{i}', alpha=0.35, lw=0.8)
      if runs and all(len(r) == len(runs[0]) for r in runs):
        mid = [sum(r['lengths']) / 2 for r in runs[0]]
        acc = np.mean([[100 * r['accuracy'] for r in x] for x in runs], 0)
        ax.plot(mid, acc, color=f'C{i}', marker='o', ms=3, label=model)

  shown = [t for t in tasks if any(k[0] == t for k in data)]
  return _task_panels(
    os.path.join(out, 'accuracy_by_length.png'),
    shown,
    draw,
    'test length',
    'test accuracy (%)',
  )


def _task_panels(path, tasks, draw, xlabel: str, ylabel: str) -> str:
  """One accuracy panel per task, drawn by draw(ax, task); saved to path."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(
    1, len(tasks), figsize=(3.6 * len(tasks), 3.2), squeeze=False
  )
  for ax, task in zip(axes[0], tasks, strict=True):
    draw(ax, task)
    ax.set_title(task)
    ax.set_xlabel(xlabel)
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(ylabel)
  if axes[0][0].get_legend_handles_labels()[0]:  # A curve with a label.
    axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def sweep(
  out: str,
  models: list[str],
  tasks: list[str],
  seeds: list[int],
  preset: str = 'cpu',
  num_steps: int = 0,
) -> dict:
  """Runs every missing (model, task, seed); returns the results table."""
  configs = {
    _name(m, t): cfgs.get_config(config_arg(m, t, preset))
    for m in models
    for t in tasks
  }  # Validates every name before the first run starts.
  os.makedirs(out, exist_ok=True)

  def train(config, workdir):
    t0 = time.time()
    summary = st_task.train_state_tracking(config, workdir)
    print(
      f'== {config.model.mixer} {config.task.name} seed {config.seed}: test '
      f'{summary.get("test_accuracy", float("nan")):.4f} '
      f'({time.time() - t0:.0f} s)',
      flush=True,
    )
    return summary

  runs = sweeps.grid(
    out,
    [_name(m, t) for m in models for t in tasks],
    seeds,
    overrides=lambda name, seed: (
      {'train.num_steps': num_steps} if num_steps else {}
    ),
  )
  make_config = lambda name: configs[name].copy_and_resolve_references()
  for result in sweeps.run_grid(runs, make_config, train, done=_done):
    if result.trained:
      results_table(out, models, tasks, seeds)
  plot_curves(out, models, tasks, seeds)
  plot_by_length(out, models, tasks, seeds)
  return results_table(out, models, tasks, seeds)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in _SEEDS.value]
  out, models, tasks = _OUT.value, _MODELS.value, _TASKS.value
  if _RESCORE.value:
    print(f'rescored {rescore(out, models, tasks, seeds)} runs')
    plot_curves(out, models, tasks, seeds)
    plot_by_length(out, models, tasks, seeds)
    result = results_table(out, models, tasks, seeds)
  else:
    result = sweep(out, models, tasks, seeds, _PRESET.value, _STEPS.value)
  with open(os.path.join(out, 'results.md')) as f:
    print(f.read())
  print(f'total run wall time {result["total_wall_s"] / 60:.1f} min')


if __name__ == '__main__':
  app.run(main)
