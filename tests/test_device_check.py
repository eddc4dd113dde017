"""experiments/benchmarks/device_check.py runs unchanged on CPU (--tiny).

The GPU machine it is written for has jax, flax, optax, orbax and numpy but
no grain, ml_collections or tensorflow_datasets, so the run happens in a
subprocess whose imports of those raise (a sys.meta_path finder): any
module-level import of them on the script's import chain fails the test.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKED = ('grain', 'ml_collections', 'tensorflow_datasets', 'tensorflow')

_RUNNER = textwrap.dedent(
  """
  import importlib.abc, runpy, sys

  BLOCKED = {blocked!r}

  class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
      if name.split('.')[0] in BLOCKED:
        raise ImportError(f'{{name}} is not installed on the GPU machine')

  sys.meta_path.insert(0, Block())
  import experiments.benchmarks.device_check as dc
  for name in dc.LAZY_IMPORTS:
    __import__(name)
  print('imports ok', flush=True)
  if sys.argv[1] != '--imports-only':
    sys.argv = ['device_check'] + sys.argv[1:]
    runpy.run_module(
      'experiments.benchmarks.device_check', run_name='__main__'
    )
  """
).format(blocked=BLOCKED)


def _blocked_run(*args, timeout=600):
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, '-c', _RUNNER, *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return proc


def _check_selected(session) -> bool:
  """Whether a test of this run uses `checked`, whose subprocess also
  imports LAZY_IMPORTS first (one Python and jax start-up, not two)."""
  return any('checked' in getattr(i, 'fixturenames', ()) for i in session.items)


@pytest.mark.slow
def test_import_chain_needs_no_grain_ml_collections_or_tfds(request):
  """The script and every module it imports lazily (LAZY_IMPORTS) import
  with those packages absent."""
  if _check_selected(request.session):
    proc = request.getfixturevalue('checked')[2]
  else:
    proc = _blocked_run('--imports-only', timeout=120)
  assert 'imports ok' in proc.stdout


@pytest.fixture(scope='module')
def checked(tmp_path_factory):
  """The whole --tiny check in a subprocess without those packages (about
  15 s of CPU: every section compiles its programs), after LAZY_IMPORTS."""
  out = tmp_path_factory.mktemp('device_check')
  proc = _blocked_run('--tiny', f'--out={out}')
  result = json.loads((out / 'device_check.json').read_text())
  return result, (out / 'device_check.md').read_text(), proc


@pytest.mark.slow
def test_runs_without_grain_ml_collections_or_tfds(checked):
  result = checked[0]
  assert result['backend'] == 'cpu' and result['tiny']
  assert all(status == 'ok' for status in result['sections'].values()), result[
    'sections'
  ]


@pytest.mark.slow
def test_kernels_match_their_references_and_skips_say_why(checked):
  result = checked[0]
  rows = result['kernels']
  ran = [r for r in rows if 'ok' in r]
  assert not [r for r in rows if 'error' in r]
  assert all(r['ok'] for r in ran), [r for r in ran if not r['ok']]
  kinds = {(r['kernel'], r['impl']) for r in ran}
  # XLA and the interpreted Pallas kernels ran forward and backward.
  for kernel in ('attention', 'linear_scan', 'pd_scan'):
    assert (kernel, 'xla') in kinds and (kernel, 'interpret') in kinds
  for r in ran:
    assert r['fwd_rel_err'] <= r['rel_tol'] and r['bwd_rel_err'] <= r['rel_tol']
  skipped = {r['impl']: r['skipped'] for r in rows if 'skipped' in r}
  # Backends CPU cannot run are skipped with their reason, not dropped.
  for impl in ('cudnn', 'splash', 'pallas'):
    assert impl in skipped and skipped[impl] != 'time budget', skipped


@pytest.mark.slow
def test_timings_mfu_and_targets_are_reported(checked):
  result, table, _ = checked
  peak = result['matmul_peak_tflops']
  assert peak['bfloat16'] > 0 and peak['float32'] > 0
  train = result['train_step']
  assert train['final_loss_finite'] and train['tokens_per_sec'] > 0
  assert 0 < train['mfu'] < 10  # CPU cost models are loose, not absurd.
  timed = [r for r in result['attention'] if 'ms' in r]
  assert {r['impl'] for r in timed} >= {'xla', 'auto'}
  assert all(r['ms'] > 0 for r in timed)
  assert result['sampler']['tokens_per_sec'] > 0
  assert result['sampler']['nfe'] <= result['sampler']['steps']
  scans = {r['impl']: r for r in result['scans'] if r['op'].startswith('pd')}
  assert scans['xla']['ms'] > 0 and 'skipped' in scans['pallas']
  names = [t['target'] for t in result['targets']]
  assert any(n.startswith('train step MFU') for n in names)
  assert any(n.startswith('auto <= xla') for n in names)
  assert 'MFU' in table and '| mask | L | D |' in table


def test_budget_skips_instead_of_overrunning(tmp_path):
  """A budget too small for anything: every section says so, the files are
  still written, and the run ends at once (in-process)."""
  from experiments.benchmarks import device_check

  result = device_check.main(['--tiny', f'--out={tmp_path}', '--budget_s=1e-9'])
  assert set(result['sections'].values()) == {'skipped: time budget'}
  assert result['targets'] == []
  assert (tmp_path / 'device_check.json').exists()
  assert (tmp_path / 'device_check.md').exists()
  with pytest.raises(SystemExit, match='budget_s'):
    device_check.main(['--tiny', f'--out={tmp_path}', '--budget_s=0'])
