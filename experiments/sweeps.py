"""What the experiments/sweep_*.py scripts share: a grid of runs and tables.

A sweep is a list of `Run`s, one config (a name plus dotted overrides, the
seed among them) in its own subfolder of the output folder. `run_grid`
trains them in order and reads a finished one's summary.json back instead,
so a stopped sweep restarts where it stopped; `mean_std` and
`markdown_table` turn the summaries into the mean +- std over seeds tables.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from experiments.configs.common import override


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep: config `name` with `overrides`, in `workdir`."""

  name: str
  seed: int
  workdir: str
  overrides: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result:
  run: Run
  summary: dict
  trained: bool  # False: skipped, read back from summary.json.


def grid(
  out: str,
  names: Iterable[str],
  seeds: Iterable[int],
  dirname: str = '{name}_s{seed}',
  overrides: Callable[[str, int], dict] | None = None,
) -> list[Run]:
  """Every name at every seed, seed-major: a partial sweep fills the table.

  Each run's overrides are {'seed': seed, **overrides(name, seed)}; its
  workdir is OUT/dirname.format(name=..., seed=...).
  """
  names = list(names)
  return [
    Run(
      name,
      seed,
      os.path.join(out, dirname.format(name=name, seed=seed)),
      {'seed': seed, **(overrides(name, seed) if overrides else {})},
    )
    for seed in seeds
    for name in names
  ]


def load_summary(workdir: str) -> dict | None:
  """workdir/summary.json, or None before the run has written one."""
  path = os.path.join(workdir, 'summary.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def run_grid(
  runs: Iterable[Run],
  make_config: Callable,
  train: Callable,
  done: Callable[[dict | None], bool] | None = None,
) -> Iterator[Result]:
  """Trains each run in turn; yields its summary after it.

  make_config(name) builds the run's config, to which its overrides are
  applied; train(config, workdir) returns the summary. A run whose
  summary.json satisfies done(summary) is not trained again (done=None
  trains every run; the trainer may still resume from its checkpoints).
  """
  for run in runs:
    summary = load_summary(run.workdir)
    if done is not None and done(summary):
      print(f'skip {run.workdir} (finished)', flush=True)
      yield Result(run, summary, trained=False)
      continue
    config = override(make_config(run.name), run.overrides)
    yield Result(run, train(config, run.workdir), trained=True)


def mean_std(
  values, scale: float = 1.0, digits: int = 3, show_n: bool = False
) -> str:
  """'mean +- std' of the values that are not None ('-' when none).

  A single value prints alone unless show_n, which always prints the std
  and appends the count: '75.0 +- 25.0 (n=2)'.
  """
  v = scale * np.asarray([x for x in values if x is not None], float)
  if v.size == 0:
    return '-'
  text = f'{v.mean():.{digits}f} +- {v.std():.{digits}f}'
  if show_n:
    return f'{text} (n={len(v)})'
  return text if len(v) > 1 else f'{v[0]:.{digits}f}'


def markdown_table(header: Iterable[str], rows: Iterable[Iterable]) -> str:
  """A markdown table (no trailing newline) from a header and cell rows."""
  header = list(header)
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
  return '\n'.join(lines)
