"""End to end: loss goes down, resume == uninterrupted, bad input handled."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.training import builders
from ddlm_jax.training.checkpoint import (
  Checkpointer,
  IncompatibleCheckpointError,
)
from experiments.configs import ar_quickstart, quickstart
from experiments.configs.common import override

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _config(**overrides):
  c = quickstart.get_config('smoke')
  c.sample.num_samples = 0
  c.mesh.shape = (1, 1, 1)
  return override(c, overrides)


def _records(workdir, split):
  path = os.path.join(workdir, 'metrics.jsonl')
  with open(path) as f:
    rows = [json.loads(x) for x in f]
  return [r for r in rows if r['split'] == split]


@pytest.fixture(scope='module')
def full_run(smoke_mdlm_run):
  """The shared smoke run (tests/conftest.py), trained with `_config()`."""
  return smoke_mdlm_run


def test_run_writes_its_record(full_run):
  workdir, summary = full_run
  for name in ['config.json', 'metrics.jsonl', 'summary.json', 'curves.png']:
    assert os.path.exists(os.path.join(workdir, name)), name
  assert summary['steps'] == 6
  assert summary['num_params'] > 0
  assert np.isfinite(summary['validation']['bits_per_token'])


@pytest.mark.slow
def test_resume_equals_uninterrupted(full_run, tmp_path):
  ref_dir, _ = full_run
  workdir = str(tmp_path)
  halted = lm.train_and_evaluate(
    _config(**{'train.halt_after_steps': 3}), workdir
  )
  assert halted['steps'] == 3 and 'validation' not in halted
  lm.train_and_evaluate(_config(), workdir)
  ref = _records(ref_dir, 'train')
  got = _records(workdir, 'train')
  assert [r['step'] for r in got] == [2, 3, 4, 6]  # 3 = the halt's log.
  ref_by_step = {r['step']: r for r in ref}
  for r in got:
    if r['step'] not in ref_by_step:
      continue
    np.testing.assert_allclose(
      r['loss'], ref_by_step[r['step']]['loss'], rtol=1e-6
    )
  np.testing.assert_allclose(
    _records(workdir, 'final_validation')[0]['nats_per_token'],
    _records(ref_dir, 'final_validation')[0]['nats_per_token'],
    rtol=1e-6,
  )


@pytest.mark.slow
def test_loss_decreases_when_training_longer(tmp_path):
  c = _config(**{'train.num_steps': 40, 'train.log_every': 5,
                 'train.eval_every': 0, 'train.checkpoint_every': 0,
                 'optim.learning_rate': 3e-3})  # fmt: skip
  lm.train_and_evaluate(c, str(tmp_path))
  losses = [r['nelbo_per_token'] for r in _records(str(tmp_path), 'train')]
  assert np.mean(losses[-2:]) < 0.8 * np.mean(losses[:2]), losses


def test_incompatible_checkpoint_is_refused_untouched(full_run):
  workdir, _ = full_run
  ckpt = os.path.join(workdir, 'checkpoints')
  before = sorted(os.listdir(ckpt))
  with pytest.raises(IncompatibleCheckpointError, match='width|shapes'):
    lm.evaluate_checkpoint(_config(**{'model.width': 48}), workdir)
  assert sorted(os.listdir(ckpt)) == before


def test_corrupt_latest_checkpoint_falls_back(full_run, tmp_path, caplog):
  import shutil

  src, _ = full_run
  workdir = str(tmp_path / 'copy')
  shutil.copytree(src, workdir)
  ckpt = pathlib.Path(workdir, 'checkpoints')
  steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
  assert steps[-1] == 6
  for f in (ckpt / '6' / 'state').rglob('*'):
    if f.is_file() and f.stat().st_size > 0:
      f.write_bytes(b'garbage')
  result = lm.evaluate_checkpoint(_config(), workdir)
  assert result['step'] == steps[-2]
  # A reader (eval) moves nothing; only a training run sets it aside.
  assert (ckpt / '6').exists() and not (ckpt / '6.corrupt').exists()


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
  """A process whose loss turns NaN on an all-zero batch (fed at step 5)."""
  real_process = builders.make_process
  real_batches = builders.train_batches

  @dataclasses.dataclass(frozen=True)
  class NaNOnZeros(MaskedDiffusion):
    @classmethod
    def of(cls, inner):
      fields = {
        f.name: getattr(inner, f.name) for f in dataclasses.fields(inner)
      }
      return cls(**fields)

    def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
      obj, nelbo, aux = super().loss(apply, key, x_BxL, loss_mask_BxL)
      poison = jnp.where(jnp.all(x_BxL == 0), jnp.nan, 1.0)
      return obj * poison, nelbo * poison, aux

  def poisoned(cfg, data, seed):
    it = real_batches(cfg, data, seed)

    class Wrapper:
      calls = 0

      def __next__(self):
        batch = next(it)
        Wrapper.calls += 1
        if Wrapper.calls == 5:
          batch = {'tokens': np.zeros_like(batch['tokens'])}
        return batch

      def get_state(self):
        return it.get_state()

      def set_state(self, s):
        it.set_state(s)

    return Wrapper()

  monkeypatch.setattr(
    builders, 'make_process', lambda *a: NaNOnZeros.of(real_process(*a))
  )
  monkeypatch.setattr(builders, 'train_batches', poisoned)
  workdir = str(tmp_path)
  with pytest.raises(lm.TrainingDivergedError, match='step 5'):
    lm.train_and_evaluate(_config(), workdir)
  ck = Checkpointer(os.path.join(workdir, 'checkpoints'))
  assert ck.all_steps() == [3]
  ck.close()


def test_out_of_range_token_ids_are_a_clear_error(tmp_path, monkeypatch):
  real_batches = builders.train_batches

  def bad(cfg, data, seed):
    it = real_batches(cfg, data, seed)

    class Wrapper:
      def __next__(self):
        return {'tokens': np.full_like(next(it)['tokens'], 10_000)}

      def get_state(self):
        return it.get_state()

    return Wrapper()

  monkeypatch.setattr(builders, 'train_batches', bad)
  with pytest.raises(ValueError, match='token id 10000'):
    lm.train_and_evaluate(_config(), str(tmp_path))


@pytest.mark.slow
def test_ar_twin_trains_with_exact_nll(tmp_path):
  c = ar_quickstart.get_config('smoke')
  c.mesh.shape = (1, 1, 1)
  c.sample.num_samples = 2
  c.sample.steps = 4
  summary = lm.train_and_evaluate(c, str(tmp_path))
  assert summary['process'] == 'ar'
  assert summary['samples']['nfe'] == c.data.seq_len
  text = (tmp_path / 'samples.txt').read_text()
  assert text.count('=== sample') == 2


@pytest.mark.parametrize('preset', ['', 'smoke'])
def test_quickstart_is_its_recipe_with_two_changes_and_the_twins_keep_it(
  preset,
):
  """The quickstart changes two things of the transformer, NELBO-trained
  recipe: the objective, and (not in the smoke preset) the backbone. The
  configs built on the recipe, whose results were measured with it, inherit
  neither."""
  from experiments.configs import bd3_quickstart, duo_quickstart, sm_continue

  got, base = quickstart.get_config(preset), quickstart.recipe(preset)
  assert (got.process.loss_type, base.process.loss_type) == (
    'simple_ce',
    'elbo',
  )
  backbone = 'transformer' if preset == 'smoke' else 'hybrid'
  assert (got.model.backbone, base.model.backbone) == (backbone, 'transformer')
  got.process.loss_type = 'elbo'
  got.model.backbone, got.model.state_size = (
    'transformer',
    base.model.state_size,
  )
  assert got.to_dict() == base.to_dict()
  twins = [
    bd3_quickstart.get_config('16,smoke' if preset else '16'),
    duo_quickstart.get_config(preset),
    sm_continue.get_config('sm,smoke' if preset else 'sm'),
  ]
  assert [t.process.loss_type for t in twins] == ['elbo'] * 3
  assert [t.model.backbone for t in twins] == ['transformer'] * 3


def test_seq_len_longer_than_split_is_a_clear_error(tmp_path):
  train = tmp_path / 'train.txt'
  train.write_text('abcdefgh' * 20)
  val = tmp_path / 'val.txt'
  val.write_text('abcdefgh' * 2)
  c = _config(**{'data.corpus': 'text_files', 'data.files.train': str(train),
                 'data.files.validation': str(val)})  # fmt: skip
  with pytest.raises(ValueError, match='seq_len'):
    lm.train_and_evaluate(c, str(tmp_path / 'run'))


def test_batch_not_divisible_by_mesh_is_a_clear_error(tmp_path):
  c = _config(**{'train.batch_size': 6, 'mesh.shape': (4, 1, -1)})
  with pytest.raises(ValueError, match='divisible'):
    lm.train_and_evaluate(c, str(tmp_path))


def _cli(*args, timeout=300):
  # One CPU device in the subprocess, as a user's laptop has: its smoke
  # programs are then the in-process tests' programs, which the shared
  # compilation cache already holds.
  flags = os.environ.get('XLA_FLAGS', '').split()
  kept = ' '.join(f for f in flags if 'device_count' not in f)
  env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=kept)
  return subprocess.run(
    [sys.executable, '-m', 'experiments.run', *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
  )


@pytest.mark.slow
def test_cli_smoke_and_sample_mode(tmp_path):
  cfg = 'experiments/configs/quickstart.py:smoke'
  out = _cli(f'--config={cfg}', f'--workdir={tmp_path}',
             '--config.train.num_steps=3')  # fmt: skip
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'final validation' in out.stdout
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['samples']['nfe'] <= summary['samples']['steps']
  again = _cli(f'--config={cfg}', f'--workdir={tmp_path}', '--mode=sample',
               '--config.train.num_steps=3')  # fmt: skip
  assert again.returncode == 0, again.stderr[-2000:]
  assert '--- sample done ---' in again.stdout and 'NFE' in again.stdout


def test_jax_sees_fake_devices():
  assert jax.device_count() == 8


@pytest.mark.slow
def test_cli_refuses_a_mode_the_config_cannot_run_in_one_line(tmp_path):
  out = _cli(
    '--config=experiments/configs/state_tracking.py:pdssm,parity,smoke',
    f'--workdir={tmp_path / "st"}',
    '--mode=sample',
  )
  assert out.returncode == 2, out.stderr[-2000:]
  assert 'state_tracking configs run --mode=train|eval' in out.stderr
  assert 'Traceback' not in out.stderr
  assert not (tmp_path / 'st').exists()
  typo = _cli(
    '--config=experiments/configs/quickstart.py:smoke',
    f'--workdir={tmp_path / "qs"}',
    '--config.model.widht=3',
  )
  assert typo.returncode == 2
  assert typo.stderr.strip().splitlines() == [
    'error: bad flag: \'widht\' Did you mean "width" instead of "widht"?'
  ]
