"""The estimator-variance benchmark on a smoke run: rows, figures, records.

The benchmark's figures are spreads of Monte-Carlo estimates; on a smoke
run with few repeats they are noisy, so the tests check what must hold
whatever the draws (rows from the validation split, one figure per
estimator, records the registry accepts and judges), and that a
measurement with a known answer comes out: 128 i.i.d. draws spread less
than 16 of them.
"""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ddlm_jax
from ddlm_jax.data import corpus
from ddlm_jax.training.config import ConfigError
from experiments.benchmarks import likelihood_variance as lv
from experiments.claims import records
from experiments.claims import verdict as v
from experiments.claims.evaluation import best_of_16

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('variance') / 'qs'
  subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.run',
      '--config=experiments/configs/quickstart.py:smoke',
      f'--workdir={workdir}',
      '--config.sample.num_samples=0',
    ],
    cwd=ROOT,
    check=True,
    capture_output=True,
  )
  return str(workdir)


def test_rows_come_from_the_validation_split(run):
  model = ddlm_jax.load(run)
  x = lv.rows_of(model, 3)
  assert x.shape == (3, model.seq_len)
  text = corpus.load_text_splits('shakespeare')['validation']
  ids = np.asarray(model.tokenizer.encode(text), np.int32)
  rows, _ = model._rows(ids)
  for row in x:
    assert (rows == row).all(-1).any()
  assert not (x[0] == x[1]).all()  # Spaced over the split, not repeated.
  with pytest.raises(ConfigError, match='--texts='):
    lv.rows_of(model, 10**7)


def test_measures_every_estimator_and_writes_judged_records(
  run, tmp_path, judge_results
):
  out = lv.measure_run(
    run, texts=2, repeats=6, reference=256, text='validation', cases=['full']
  )
  full = out['full']
  names = {k for k in full if k != 'reference'}
  assert {'iid@128', 'iid@16', 'stratified@16', 'antithetic@16'} <= names
  assert full['iid@128']['stderr'] < full['iid@16']['stderr']
  for name in names:
    row = full[name]
    assert row['stderr'] > 0 and row['bias_stderr'] > 0
  assert full['reference']['samples'] == 256
  # Two training seeds, as `experiments.reproduce` records them.
  other = dict(out, seed=out['seed'] + 1)
  best = best_of_16(full)
  named = {
    'best-16-draws-beat-iid-128': f'per seed: {best}, {best}.',
    'estimators-unbiased': f'({best}, {best}; full bound)',
  }
  for claim, text in named.items():
    rec, judged = judge_results(claim, [(0, out), (1, other)])
    records.write(rec, 'test', str(tmp_path))
    # Two training seeds are fewer than the rules' three.
    assert judged.label in (v.PARTIAL, v.MISS), judged
    assert rec['seeds'] == [0, 1] and text in rec['notes']
  spread = records.load_all(str(tmp_path))['best-16-draws-beat-iid-128'][0]
  assert spread['arms']['best@16']['values'] == [full[best]['stderr']] * 2
  assert spread['arms']['iid@128']['values'][0] == full['iid@128']['stderr']
  assert 'validation rows of' in spread['notes']


def test_bad_cases_refused():
  with pytest.raises(ConfigError, match='--cases='):
    lv.main(['--workdir=x', '--cases=conditional'])
  with pytest.raises(ConfigError, match='--workdir'):
    lv.main([])
