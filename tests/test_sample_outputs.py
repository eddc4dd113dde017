"""Each sampling call writes files of its own; earlier samples are kept."""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from ddlm_jax.evaluation import sample_run
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks.language_model import load_config
from ddlm_jax.training.config import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_unnamed_calls_take_the_next_free_number(tmp_path):
  first = sample_run.write_samples(str(tmp_path), ['a'], {'n': 1})
  second = sample_run.write_samples(str(tmp_path), ['b'], {'n': 2})
  named = sample_run.write_samples(str(tmp_path), ['c'], {'n': 3}, 'eb')
  third = sample_run.write_samples(str(tmp_path), ['d'], {'n': 4})
  names = [pathlib.Path(p).name for p in (*first, *second, *named, *third)]
  assert names == [
    'samples.txt',
    'sample_stats.json',
    'samples_2.txt',
    'sample_stats_2.json',
    'samples_eb.txt',
    'sample_stats_eb.json',
    'samples_3.txt',
    'sample_stats_3.json',
  ]
  assert (tmp_path / 'samples.txt').read_text() == '=== sample 0 ===\na\n\n'
  assert json.loads((tmp_path / 'sample_stats_2.json').read_text()) == {'n': 2}


def test_a_taken_or_bad_name_is_refused(tmp_path):
  sample_run.write_samples(str(tmp_path), ['a'], {}, 'eb')
  with pytest.raises(ConfigError, match='exists already; choose another'):
    sample_run.output_paths(str(tmp_path), 'eb')
  with pytest.raises(ConfigError, match='letters, digits'):
    sample_run.output_paths(str(tmp_path), '../x')


@pytest.fixture
def run_copy(smoke_mdlm_run, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(smoke_mdlm_run[0], workdir)
  return workdir


def test_sample_mode_twice_keeps_the_first_samples(run_copy):
  config = load_config(
    str(run_copy), {'sample.num_samples': 2, 'sample.steps': 4}
  )
  lm.sample_checkpoint(config, str(run_copy))
  first = (run_copy / 'samples.txt').read_text()
  config.sample.seed = 1
  lm.sample_checkpoint(config, str(run_copy))
  assert (run_copy / 'samples.txt').read_text() == first
  assert (run_copy / 'samples_2.txt').read_text().count('=== sample') == 2
  assert json.loads((run_copy / 'sample_stats_2.json').read_text())['step']
  sample_run.name_samples(config, str(run_copy), 'seed1')
  lm.sample_checkpoint(config, str(run_copy))
  assert (run_copy / 'samples_seed1.txt').exists()


def test_cli_refuses_a_taken_name_before_any_compute(run_copy):
  (run_copy / 'samples_mine.txt').write_text('earlier\n')
  before = sorted(p.name for p in run_copy.iterdir())
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.run',
      '--config=experiments/configs/quickstart.py:smoke',
      f'--workdir={run_copy}',
      '--mode=sample',
      '--name=mine',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 2
  assert out.stderr.strip().count('\n') == 0
  assert 'samples_mine.txt exists already' in out.stderr
  assert sorted(p.name for p in run_copy.iterdir()) == before
  assert (run_copy / 'samples_mine.txt').read_text() == 'earlier\n'
