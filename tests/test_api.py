"""The Python API: load by workdir, score, generate, infill (ddlm_jax.api)."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import ddlm_jax
from ddlm_jax.evaluation.likelihood import evaluate_likelihood
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks.language_model import load_run
from ddlm_jax.training.config import ConfigError
from experiments.configs import ar_quickstart

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def model(smoke_mdlm_run):
  return ddlm_jax.load(smoke_mdlm_run[0])


def test_import_stays_cheap():
  code = 'import sys, ddlm_jax; print("jax" in sys.modules)'
  out = subprocess.run(
    [sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True
  )
  assert out.stdout.strip() == 'False', out.stderr


def test_load_restores_the_same_parameters_as_the_cli(smoke_mdlm_run, model):
  run = load_run(smoke_mdlm_run[0])
  want = jax.device_get(run.eval_params())
  step = run.checkpointer.latest_step()
  run.close()
  assert model.step == step
  got = jax.device_get(model.params)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def test_load_reads_no_optimizer_state(smoke_mdlm_run, monkeypatch):
  """Only the parameter subtree is asked of orbax."""
  import orbax.checkpoint as ocp

  asked = []
  original = ocp.PyTreeCheckpointer.restore

  def spy(self, path, *args, **kwargs):
    asked.append(set(kwargs['args'].item))
    return original(self, path, *args, **kwargs)

  monkeypatch.setattr(ocp.PyTreeCheckpointer, 'restore', spy)
  ddlm_jax.load(smoke_mdlm_run[0])
  assert asked == [{'params'}]


def test_score_has_one_bound_per_text_with_its_error(model):
  long = 'To be, or not to be, that is the question. ' * 3
  scores = model.score(['ROMEO:', long], samples=4)
  assert [s.text for s in scores] == ['ROMEO:', long]
  assert scores[0].num_tokens == len('ROMEO:')
  assert scores[1].num_tokens == len(long)  # Several rows, all counted.
  for s in scores:
    assert s.samples == 4
    assert np.isfinite(s.nats_per_token) and s.nats_per_token > 0
    assert s.nats_per_token_stderr > 0
    assert s.bits_per_token == pytest.approx(s.nats_per_token / np.log(2))
  # Deterministic for a seed, different draws for another.
  again = model.score(['ROMEO:', long], samples=4)
  assert again[1].nats_per_token == scores[1].nats_per_token
  other = model.score(['ROMEO:', long], samples=4, seed=1)
  assert other[1].nats_per_token != scores[1].nats_per_token


def test_generate_and_infill_return_text(model):
  length = model.seq_len
  texts = model.generate(3, sampler='ancestral', steps=8)
  assert len(texts) == 3 and all(len(t) == length for t in texts)
  assert model.last_stats['sampler'] == 'ancestral'
  assert model.last_stats['steps'] == 8
  (prompted,) = model.generate(['ROMEO:'], steps=8)
  assert prompted.startswith('ROMEO:') and len(prompted) == length
  (filled,) = model.infill(['To be, ', 5, ' to be'], steps=8)
  assert filled.startswith('To be, ') and filled.endswith(' to be')
  assert len(filled) == len('To be, ') + 5 + len(' to be')


def test_bad_requests_are_one_line_errors(model):
  with pytest.raises(ConfigError, match='unknown sampler'):
    model.generate(1, sampler='nosuch')
  with pytest.raises(ConfigError, match='unknown option'):
    model.generate(1, temprature=0.5)
  with pytest.raises(ValueError, match='no blank'):
    model.infill(['no blanks here'])
  with pytest.raises(ValueError, match='seq_len'):
    model.infill(['x' * (model.seq_len + 1), 2])
  with pytest.raises(FileNotFoundError, match='not a run directory'):
    ddlm_jax.load(os.path.join(model.workdir, 'nothing_here'))


def test_a_run_of_another_kind_is_refused(smoke_mdlm_run, tmp_path):
  workdir = tmp_path / 'st'
  shutil.copytree(smoke_mdlm_run[0], workdir)
  config = json.loads((workdir / 'config.json').read_text())
  config['kind'] = 'state_tracking'
  (workdir / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ConfigError, match="'state_tracking' run"):
    ddlm_jax.load(str(workdir))


@pytest.mark.slow
def test_ar_score_is_the_exact_nll_of_the_eval_path(tmp_path):
  c = ar_quickstart.get_config('smoke')
  c.mesh.shape = (1, 1, 1)
  c.sample.num_samples = 0
  lm.train_and_evaluate(c, str(tmp_path))
  model = ddlm_jax.load(str(tmp_path))
  text = 'First Citizen: Before we proceed any further, hear me.'
  row = model.tokenizer.encode(text)[: model.seq_len]
  (got,) = model.score([model.tokenizer.decode(row)])
  want = evaluate_likelihood(
    model.params,
    model.graphdef,
    model.process,
    [np.asarray(row, np.int32)[None]],
    key=jax.random.key(0),
  )
  assert got.samples == 1 and got.nats_per_token_stderr == 0
  assert got.nats_per_token == pytest.approx(want['nats_per_token'], 1e-5)
  assert model.generate(2)[0] and len(model.generate(2)) == 2
  with pytest.raises(ValueError, match='AR'):
    model.infill(['a', 2])


def _readme_example() -> str:
  readme = (ROOT / 'README.md').read_text()
  section = readme.split('## Python API', 1)[1]
  return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def test_readme_example_runs_as_written(smoke_mdlm_run, tmp_path):
  runs = tmp_path / 'runs'
  runs.mkdir()
  shutil.copytree(smoke_mdlm_run[0], runs / 'quickstart')
  code = _readme_example()
  assert "ddlm_jax.load('runs/quickstart')" in code
  out = subprocess.run(
    [sys.executable, '-c', code],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': str(ROOT)},
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert re.fullmatch(r'\d+\.\d{3} \+- \d+\.\d{3} bits/char', lines[0])
  assert len(lines) >= 4
