"""Records: what was measured for a claim, where, when and by which command.

A record is one JSON file in ``experiments/claims/records/`` named
``CLAIM.TAG.json`` (TAG orders the records of one claim; the newest wins:
``reproduce`` uses the UTC time). Fields:

  claim, source, commit, date, host, command, budget ('cpu', 'paper',
  'smoke' or 'as published'), budget_fraction (ours over the paper's, or
  null), seed_kind ('training', 'sampling', 'rounds'), arms {name:
  {seeds, values, stderr?, entropy?} or, where only a summary was
  published, {mean, sd or se, n, entropy?}}, exact_test {test, passed}?, notes,
  figures? (paths under docs/images, relative to the repository, that
  docs/RESULTS.md shows under the claim).

Records transcribed from earlier measurements say so in ``source``; their
verdicts are computed by the same rules as new ones.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import subprocess
from typing import Any

from experiments.claims.verdict import REPRODUCE

RECORDS_DIR = os.path.join(os.path.dirname(__file__), 'records')
REQUIRED = ('claim', 'source', 'commit', 'date', 'host', 'command', 'arms')


def validate(record: dict[str, Any]) -> None:
  """Refuses a record that lacks a field or has an arm without values."""
  missing = [k for k in REQUIRED if k not in record]
  if missing:
    raise ValueError(
      f'record for {record.get("claim", "?")} lacks {missing}; every record '
      f'needs {REQUIRED}'
    )
  for figure in record.get('figures', ()):
    if not figure.startswith('docs/images/'):
      raise ValueError(
        f'record {record["claim"]}: figure {figure!r} must be a path under '
        'docs/images/ (relative to the repository)'
      )
  for name, arm in record['arms'].items():
    values = arm.get('values')
    if not values and arm.get('mean') is None:
      raise ValueError(
        f'record {record["claim"]}: arm {name} has neither values nor a mean'
      )
    seeds = arm.get('seeds')
    if values and seeds is not None and len(seeds) != len(values):
      raise ValueError(
        f'record {record["claim"]}: arm {name} has {len(values)} values for '
        f'{len(seeds)} seeds'
      )
    for key, per_seed in arm.get('details', {}).items():
      if seeds is None or len(per_seed) != len(seeds):
        raise ValueError(
          f'record {record["claim"]}: arm {name} detail {key} needs one '
          f'value per seed ({len(seeds or ())}), has {len(per_seed)}'
        )


def start(
  claim: str,
  command: str,
  *,
  budget: str,
  seeds,
  seed_kind: str = 'training',
  repo: str = '.',
  now: datetime.datetime | None = None,
) -> dict[str, Any]:
  """A record's first fields, before its arms: the claim, the command
  (run by ``experiments.reproduce``), this commit, now (UTC), this host,
  the budget and the seeds. A paper-budget record is at the paper's
  budget (fraction 1); otherwise the claim's own fraction applies."""
  now = now or datetime.datetime.now(datetime.UTC)
  record = {
    'claim': claim,
    'source': REPRODUCE,
    'commit': git_commit(repo),
    'date': now.strftime('%Y-%m-%d %H:%M UTC'),
    'host': host_info(),
    'command': command,
    'budget': budget,
    'seeds': list(seeds),
    'seed_kind': seed_kind,
    'arms': {},
  }
  if budget == 'paper':
    record['budget_fraction'] = 1.0
  return record


def arm_of(seeds, per_seed) -> dict[str, list]:
  """A record's arm from one ``{'value': x, FIELD: y, ...}`` per seed:
  ``{'seeds': [...], 'values': [...], FIELD: [...]}`` (a field such as the
  entropy a value was read at keeps one entry per seed)."""
  arm = {'seeds': list(seeds)}
  for fields in per_seed:
    for key, x in fields.items():
      arm.setdefault('values' if key == 'value' else key, []).append(x)
  return arm


def load_all(records_dir: str = RECORDS_DIR) -> dict[str, list[dict]]:
  """claim id -> its records, oldest first (by file name)."""
  out: dict[str, list[dict]] = {}
  for path in sorted(glob.glob(os.path.join(records_dir, '*.json'))):
    with open(path) as f:
      record = json.load(f)
    validate(record)
    record['_file'] = os.path.basename(path)
    out.setdefault(record['claim'], []).append(record)
  return out


def latest(records_dir: str = RECORDS_DIR) -> dict[str, dict]:
  """claim id -> its newest record that is not a smoke run."""
  out = {}
  for claim, recs in load_all(records_dir).items():
    real = [r for r in recs if r.get('budget') != 'smoke']
    if real:
      out[claim] = real[-1]
  return out


def write(record: dict[str, Any], tag: str, records_dir: str) -> str:
  validate(record)
  os.makedirs(records_dir, exist_ok=True)
  path = os.path.join(records_dir, f'{record["claim"]}.{tag}.json')
  clean = {k: v for k, v in record.items() if not k.startswith('_')}
  with open(path, 'w') as f:
    json.dump(clean, f, indent=1, sort_keys=True)
    f.write('\n')
  return path


def _cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
  """The vector-unit flags that change XLA:CPU's speed (not the full list)."""
  wanted = ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'fma', 'neon')
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith(('flags', 'Features')):
          have = set(line.split(':', 1)[1].split())
          return [w for w in wanted if w in have]
  except OSError:
    pass
  return []


def host_info() -> dict[str, Any]:
  """CPU model and flags, core count, Python, jax/jaxlib/flax versions."""
  from importlib import metadata

  def version(pkg):
    try:
      return metadata.version(pkg)
    except metadata.PackageNotFoundError:
      return None

  return {
    'cpu': _cpu_model(),
    'cpu_flags': _cpu_flags(),
    'cores': os.cpu_count(),
    'python': platform.python_version(),
    'jax': version('jax'),
    'jaxlib': version('jaxlib'),
    'flax': version('flax'),
  }


def git_commit(repo: str) -> str:
  """HEAD's short hash, with '+dirty' when tracked files are modified."""
  try:
    head = subprocess.run(
      ['git', 'rev-parse', '--short', 'HEAD'],
      cwd=repo,
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
    dirty = subprocess.run(
      ['git', 'status', '--porcelain', '--untracked-files=no'],
      cwd=repo,
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return head + ('+dirty' if dirty else '')
