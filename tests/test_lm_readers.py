"""Readers of a run restore its parameters only, never optimizer moments.

--mode=eval, --mode=sample and `load_run` score or sample a trained
network: they restore the parameters (and the EMA ones when evaluation
uses them) and never build an optimizer or its moments, which are twice
the parameters' memory for AdamW.
"""

import shutil

import jax
import numpy as np
import pytest

from ddlm_jax.tasks import language_model as lm
from ddlm_jax.training import config as config_lib
from ddlm_jax.training import fit
from ddlm_jax.training.checkpoint import Checkpointer

READ_FIELDS = {'params', 'ema_params'}


@pytest.fixture
def restores(monkeypatch):
  """The restore targets of every checkpoint read; building a train state
  or an optimizer fails the test."""
  targets = []
  real = Checkpointer.restore_latest

  def spy(self, abstract_state, initial_state=None):
    targets.append(abstract_state)
    return real(self, abstract_state, initial_state)

  def no_optimizer(*args, **kwargs):
    raise AssertionError('a reader built a train state or an optimizer')

  monkeypatch.setattr(Checkpointer, 'restore_latest', spy)
  monkeypatch.setattr(fit, 'build_state', no_optimizer)
  monkeypatch.setattr(fit, 'optimizer_from_config', no_optimizer)
  return targets


def _fields(target) -> set[str]:
  return set(target) if isinstance(target, dict) else {'not a dict'}


def test_eval_sample_and_load_run_restore_parameters_only(
  smoke_mdlm_run, tmp_path, restores
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(smoke_mdlm_run[0], workdir)  # Sampling writes files.
  config = lm.load_config(workdir)
  assert lm.Run(config, workdir).params is None  # Nothing allocated.
  result = lm.evaluate_checkpoint(config, workdir)
  assert np.isfinite(result['bits_per_token'])
  config.sample.num_samples = 2
  stats = lm.sample_checkpoint(config, workdir)
  assert stats['num_samples'] == 2
  run = lm.load_run(workdir)
  assert len(restores) == 3
  for target in restores:
    assert _fields(target) <= READ_FIELDS, _fields(target)
  # The leaves read are the network's parameters, nothing more.
  num_leaves = len(jax.tree.leaves(run.params))
  assert [len(jax.tree.leaves(t)) for t in restores] == [num_leaves] * 3
  assert not hasattr(run, 'state')
  run.close()


def _lsq_task():
  def loss(params, key, batch):
    del key
    err = batch['x'] @ params['w'] - batch['y']
    return (err**2).mean(), {}

  def batches(start):
    rng = np.random.default_rng(start)
    while True:
      x = rng.normal(size=(8, 3)).astype(np.float32)
      yield {'x': x, 'y': x.sum(-1)}

  return fit.Task(
    init=lambda key: {'w': jax.random.normal(key, (3,))},
    loss=loss,
    batches=batches,
  )


def test_restore_params_reads_the_ema_without_the_moments(tmp_path):
  cfg = config_lib.trainer_config(
    num_steps=4,
    seed=0,
    log_every=2,
    eval_every=0,
    checkpoint_every=4,
    ema_decay=0.5,
    optimizer=config_lib.optimizer_config(
      learning_rate=0.1, warmup_steps=1, total_steps=4
    ),
  )
  result = fit.fit(_lsq_task(), cfg, str(tmp_path))
  assert isinstance(result, fit.FitResult) and result.step == 4
  abstract = jax.eval_shape(lambda: result.state.params)
  ckpt = Checkpointer(str(tmp_path / 'checkpoints'), read_only=True)
  params, ema, step = fit.restore_params(ckpt, abstract, ema=True)
  plain = fit.restore_params(ckpt, abstract, ema=False)
  ckpt.close()
  assert step == 4 and plain[1] is None
  np.testing.assert_array_equal(params['w'], result.state.params['w'])
  np.testing.assert_array_equal(ema['w'], result.state.ema_params['w'])
  assert not np.allclose(ema['w'], params['w'])
