"""lm-evaluation-harness scores of several trained runs, as one JSON file.

  python -m experiments.benchmarks.lm_eval_runs \
    --run=mdlm=RUN_A --run=ar=RUN_B [--samples=64] \
    [--tasks=ddlm_local_mc,ddlm_local_ppl,ddlm_local_gen] \
    [--include_path=tests/fixtures/lm_eval] --json=SCORES.json

Each run is scored through lm-eval's own evaluator
(`lm_eval.simple_evaluate`) with the suite's `ddlm_jax` model
(`ddlm_jax.interop.lm_eval_backend`): a masked run by its Monte-Carlo
bound with `--samples` draws, an autoregressive run exactly. The JSON maps
each name to lm-eval's numeric results per task, e.g.
``{"ar": {"ddlm_local_ppl": {"bits_per_byte,none": 2.29, ...}}}``, which
is what a claim comparing runs reads (`python -m experiments.reproduce
lm-eval-ar-below-mdlm` runs this once per training seed). The local tasks
read their JSONL relative to the repository root, so this runs there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
TASKS = ('ddlm_local_mc', 'ddlm_local_ppl', 'ddlm_local_gen')
INCLUDE_PATH = os.path.join('tests', 'fixtures', 'lm_eval')


def parse_runs(items: list[str]) -> dict[str, str]:
  """{name: workdir} from NAME=WORKDIR items, each name once."""
  runs = {}
  for item in items:
    name, sep, workdir = item.partition('=')
    if not sep or not name or not workdir:
      raise ValueError(f'--run={item}: give NAME=WORKDIR, e.g. ar=runs/ar')
    if name in runs:
      raise ValueError(f'--run: {name} is named twice; give each run once')
    runs[name] = workdir
  if not runs:
    raise ValueError('give at least one --run=NAME=WORKDIR')
  return runs


def numbers(results: dict) -> dict[str, dict[str, float]]:
  """lm-eval's per-task results without its non-numeric fields."""
  return {
    task: {
      k: float(v)
      for k, v in metrics.items()
      if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    for task, metrics in results.items()
  }


def score(workdir: str, tasks, samples: int, include_path: str) -> dict:
  import lm_eval
  from lm_eval.tasks import TaskManager

  import ddlm_jax.interop.lm_eval_backend  # noqa: F401  (registers it)

  out = lm_eval.simple_evaluate(
    model='ddlm_jax',
    model_args={'workdir': workdir, 'samples': samples},
    tasks=list(tasks),
    task_manager=TaskManager(include_path=include_path),
  )
  return numbers(out['results'])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--run', action='append', default=[], help='NAME=WORKDIR')
  p.add_argument('--tasks', default=','.join(TASKS))
  p.add_argument('--samples', type=int, default=64)
  p.add_argument('--include_path', default=INCLUDE_PATH)
  p.add_argument('--json', default='', help='write the scores here')
  args = p.parse_args(argv)
  from ddlm_jax.tasks.language_model import load_config

  try:
    runs = parse_runs(args.run)
    if args.samples < 1:
      raise ValueError(f'--samples={args.samples}: give >= 1, e.g. 64')
    tasks = [t for t in args.tasks.split(',') if t]
    if not tasks:
      raise ValueError('--tasks is empty; e.g. --tasks=ddlm_local_ppl')
    if not os.path.isdir(args.include_path):
      raise ValueError(
        f'--include_path={args.include_path} is not a folder of lm-eval '
        'task files; run from the repository root'
      )
    for workdir in runs.values():
      load_config(workdir)  # FileNotFoundError naming a missing run.
  except (ValueError, FileNotFoundError) as err:
    print(f'error: {err}', file=sys.stderr)
    raise SystemExit(2) from None
  scores = {
    name: score(workdir, tasks, args.samples, args.include_path)
    for name, workdir in runs.items()
  }
  text = json.dumps(scores, indent=1)
  print(text, flush=True)
  if args.json:
    with open(args.json, 'w') as f:
      f.write(text + '\n')
  return scores


if __name__ == '__main__':
  main()
