"""The one loop's policies, tested once for every task (training.fit).

A tiny least-squares task keeps each run to a second or two; the LM, state
tracking and planner tasks are the same loop (their own tests check their
summaries).
"""

import dataclasses
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.training import config as config_lib
from ddlm_jax.training import fit, steps
from ddlm_jax.training.checkpoint import (
  Checkpointer,
  IncompatibleCheckpointError,
)
from ddlm_jax.training.workdir_lock import WorkdirLockedError

DIM = 4


def _batches(seed=0, poison_at=None, signal_at=None):
  """start -> resumable stream of regression batches (by step index)."""

  def make(start):
    step = start
    while True:
      rng = np.random.default_rng([seed, step])
      x = rng.normal(size=(8, DIM)).astype(np.float32)
      y = x @ np.arange(1, DIM + 1, dtype=np.float32)
      step += 1
      if step == poison_at:
        x = np.full_like(x, np.inf)
      if step == signal_at:
        os.kill(os.getpid(), signal.SIGTERM)
      yield {'x': x, 'y': y}

  return make


def _task(batches=None, **kw):
  def loss(params, key, batch):
    del key
    err = batch['x'] @ params['w'] - batch['y']
    return jnp.mean(err**2), {'abs_err': jnp.mean(jnp.abs(err))}

  return fit.Task(
    init=lambda key: {'w': jax.random.normal(key, (DIM,)) * 0.1},
    loss=loss,
    batches=batches or _batches(),
    evaluate=lambda params, step: {'w0': float(params['w'][0])},
    **kw,
  )


def _cfg(**kw):
  fields = dict(
    num_steps=8,
    seed=0,
    log_every=2,
    eval_every=4,
    checkpoint_every=4,
    optimizer=config_lib.optimizer_config(
      learning_rate=0.05, warmup_steps=1, total_steps=8
    ),
  )
  fields.update(kw)
  return config_lib.trainer_config(**fields)


def _params(workdir):
  ck = Checkpointer(os.path.join(workdir, 'checkpoints'))
  steps_ = ck.all_steps()
  ck.close()
  return steps_


def _records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(x) for x in f]


def test_halt_then_resume_equals_uninterrupted(tmp_path):
  full = fit.fit(_task(), _cfg(), str(tmp_path / 'full'))
  part_dir = str(tmp_path / 'part')
  part = fit.fit(_task(), _cfg(halt_after_steps=3), part_dir)
  assert part.summary['steps'] == 3 and not part.summary['finished']
  resumed = fit.fit(_task(), _cfg(), part_dir)
  assert resumed.summary['finished'] and resumed.summary['start_step'] == 3
  got = [r for r in _records(part_dir) if r['split'] == 'train']
  ref = [r for r in _records(str(tmp_path / 'full')) if r['split'] == 'train']
  # Same records, no duplicates: the halt's extra log at step 3 only.
  assert [r['step'] for r in got] == [2, 3, 4, 6, 8]
  ref_loss = {r['step']: r['loss'] for r in ref}
  for r in got:
    if r['step'] in ref_loss:
      np.testing.assert_allclose(r['loss'], ref_loss[r['step']], rtol=1e-6)
  assert full.summary['steps'] == resumed.summary['steps'] == 8
  with open(tmp_path / 'full' / 'summary.json') as f:
    assert json.load(f)['status'] == 'ok'


def test_non_finite_step_stops_names_it_and_saves_nothing_bad(tmp_path):
  workdir = str(tmp_path)
  task = _task(batches=_batches(poison_at=6))
  with pytest.raises(fit.TrainingDivergedError, match='at step 6') as err:
    fit.fit(task, _cfg(), workdir)
  assert 'last good checkpoint (step 4)' in str(err.value)
  assert err.value.summary['status'] == 'nan'
  assert err.value.summary['bad_step'] == 6
  assert _params(workdir) == [4]  # Nothing saved after the bad step.
  assert {'step': 6, 'split': 'train', 'bad_step': 6} in _records(workdir)


def test_non_finite_before_any_checkpoint_says_none_was_saved(tmp_path):
  task = _task(batches=_batches(poison_at=1))
  with pytest.raises(fit.TrainingDivergedError, match='No checkpoint was'):
    fit.fit(task, _cfg(log_every=1), str(tmp_path))
  assert _params(str(tmp_path)) == []


def test_early_stop_is_final_across_restarts(tmp_path):
  def after_eval(state, metrics, step):
    del metrics
    return state, step >= 4

  task = _task(after_eval=after_eval)
  first = fit.fit(task, _cfg(), str(tmp_path))
  assert first.summary['early_stop_step'] == 4 and first.summary['steps'] == 4
  assert first.summary['finished']
  again = fit.fit(task, _cfg(), str(tmp_path))
  assert again.summary['steps'] == 4 and again.summary['early_stop_step'] == 4


def test_sigterm_saves_and_the_resumed_run_matches(tmp_path):
  ref = fit.fit(_task(), _cfg(), str(tmp_path / 'ref'))
  workdir = str(tmp_path / 'run')
  out = fit.fit(_task(batches=_batches(signal_at=3)), _cfg(), workdir)
  assert out.summary == {'preempted_at_step': 3, 'status': 'preempted'}
  assert _params(workdir) == [3]
  done = fit.fit(_task(), _cfg(), workdir)
  assert (
    done.summary['finished'] and done.summary['steps'] == ref.summary['steps']
  )
  final = lambda d: [
    r for r in _records(d) if r['split'] == 'train' and r['step'] == 8
  ][0]['loss']
  np.testing.assert_allclose(final(workdir), final(str(tmp_path / 'ref')))


def test_ema_is_kept_for_any_task(tmp_path):
  state = fit.fit(_task(), _cfg(ema_decay=0.5), str(tmp_path)).state
  assert state.ema_params is not None
  assert not np.allclose(state.ema_params['w'], state.params['w'])


def test_accumulation_weights_micro_batches_by_their_tokens():
  """Padded micro-batches: the accumulated gradient is the full batch's."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
  mask = jnp.asarray([[1] * 6, [1] * 6, [1, 0, 0, 0, 0, 0], [1] + [0] * 5])
  batch = {'x': x, 'mask': mask.astype(jnp.float32)}

  def loss(params, key, b):
    del key
    per = (b['x'] * params['w']) ** 2 * b['mask']
    return per.sum() / b['mask'].sum(), {}

  weight = lambda b: b['mask'].sum()
  params = {'w': jnp.float32(1.5)}
  key = jax.random.key(0)
  full = steps.accumulate_grads(loss, params, key, batch, 1, weight)
  accum = steps.accumulate_grads(loss, params, key, batch, 2, weight)
  np.testing.assert_allclose(accum[0], full[0], rtol=1e-6)
  np.testing.assert_allclose(accum[2]['w'], full[2]['w'], rtol=1e-6)
  # Per-micro-batch normalisation (the old rule) gives a different answer.
  mean_of_means = np.mean(
    [loss(params, key, {k: v[i : i + 2] for k, v in batch.items()})[0]
     for i in (0, 2)]
  )  # fmt: skip
  assert abs(mean_of_means - float(full[0])) > 1e-3


def test_a_step_dependent_process_sees_the_global_step(monkeypatch):
  """Processes with uses_step (Duo's curriculum) get state.step, per
  micro-batch too; other processes get step=None (every loss takes it)."""
  import optax

  from ddlm_jax.training.state import TrainState

  class StepProcess:
    uses_step = True

    def loss(self, apply, key, x_BxL, loss_mask_BxL=None, step=None):
      del apply, key, loss_mask_BxL
      value_B = jnp.full((x_BxL.shape[0],), 1.0) * step.astype(jnp.float32)
      return value_B * x_BxL.shape[1], value_B * x_BxL.shape[1], {}

  class PlainProcess(StepProcess):
    uses_step = False

    def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
      assert step is None, 'a process without uses_step saw the step'
      return super().loss(apply, key, x_BxL, loss_mask_BxL, step=jnp.int32(0))

  monkeypatch.setattr(steps, 'make_apply', lambda graphdef, params: None)
  graphdef = None
  tx = optax.sgd(0.0)
  params = {'w': jnp.zeros(())}
  state = TrainState(
    step=jnp.int32(7),
    params=params,
    opt_state=tx.init(params),
    ema_params=None,
    rng=jax.random.key(0),
    bad_step=jnp.int32(-1),
    extra=None,
  )
  batch = {'tokens': jnp.zeros((4, 3), jnp.int32)}
  for process, expect in ((StepProcess(), 7.0), (PlainProcess(), 0.0)):
    loss = steps.lm_loss(graphdef, process)
    for accum in (1, 2):
      _, metrics = steps.train_step(
        state, batch, loss=loss, tx=tx, ema_decay=0.0, accum_steps=accum,
        weight=steps.lm_weight, uses_step=process.uses_step,
      )  # fmt: skip
      assert float(metrics['loss']) == expect


@pytest.mark.parametrize(
  'field,value,match',
  [
    ('num_steps', -1, r'train.num_steps=-1: must be in \[1, inf\]'),
    ('log_every', 0, 'train.log_every=0'),
    ('checkpoint_every', -1, 'train.checkpoint_every=-1'),
    ('halt_after_steps', -2, 'train.halt_after_steps=-2'),
    ('max_checkpoints', 0, 'train.max_checkpoints=0'),
    ('ema_decay', 1.0, r'optim.ema_decay=1.0: must be in \[0, 1\)'),
    ('grad_accum_steps', 0, 'optim.grad_accum_steps=0'),
    ('mesh_shape', (0, 1, 1), 'mesh.shape'),
  ],
)
def test_nonsense_loop_settings_are_refused(field, value, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    _cfg(**{field: value})


def test_nonsense_optimizer_settings_are_refused():
  with pytest.raises(config_lib.ConfigError, match='optim.learning_rate=-1'):
    config_lib.optimizer_config(learning_rate=-1, warmup_steps=0, total_steps=1)
  with pytest.raises(config_lib.ConfigError, match='optim.b2=1.5'):
    config_lib.optimizer_config(
      learning_rate=1e-3, warmup_steps=0, total_steps=1, b2=1.5
    )


def _experiment(spec):
  """'module:preset' -> that experiments config. Imported here, not at the
  top: the kill -9 victims import this file and start 1.5 s sooner."""
  import importlib

  module, preset = spec.split(':')
  return importlib.import_module(f'experiments.configs.{module}').get_config(
    preset
  )


@pytest.mark.parametrize(
  'spec,mode,ok',
  [
    ('quickstart:smoke', 'sample', True),
    ('state_tracking:pdssm,parity,smoke', 'eval', True),
    ('state_tracking:pdssm,parity,smoke', 'sample', False),
    ('planner_executor:direct,smoke', 'eval', True),
    ('planner_executor:direct,smoke', 'sample', False),
  ],
)
def test_every_config_declares_its_modes(spec, mode, ok):
  from experiments import modes as run_cli

  config = _experiment(spec)
  if ok:
    assert run_cli.check_mode(config, mode) == config.kind
  else:
    with pytest.raises(ValueError, match=f'{config.kind} configs run'):
      run_cli.check_mode(config, mode)


def test_eval_mode_needs_a_trained_run(tmp_path):
  from experiments import modes as run_cli

  c = _experiment('state_tracking:pdssm,parity,smoke')
  with pytest.raises(FileNotFoundError, match='No checkpoint in'):
    run_cli.run(c, str(tmp_path), 'eval')
  p = _experiment('planner_executor:direct,smoke')
  with pytest.raises(FileNotFoundError, match='train first'):
    run_cli.run(p, str(tmp_path / 'pe'), 'eval')
  assert not os.path.exists(tmp_path / 'pe')  # Nothing written.


@pytest.mark.slow
def test_a_second_writer_is_refused_before_anything_is_written(tmp_path):
  import subprocess
  import sys
  import time

  workdir = tmp_path / 'run'
  holder = subprocess.Popen(
    [sys.executable, '-c',
     'import sys, time\n'
     'from ddlm_jax.training.workdir_lock import WorkdirLock\n'
     f'with WorkdirLock({str(workdir)!r}, enabled=True):\n'
     '  print("held", flush=True); time.sleep(60)\n'],
    stdout=subprocess.PIPE, text=True,
  )  # fmt: skip
  try:
    assert holder.stdout.readline().strip() == 'held'
    t0 = time.perf_counter()
    with pytest.raises(WorkdirLockedError, match=f'pid {holder.pid}'):
      fit.fit(_task(), _cfg(), str(workdir), config_record={'a': 1})
    assert time.perf_counter() - t0 < 30  # At once, no waiting.
    assert sorted(os.listdir(workdir)) == ['.lock']
  finally:
    holder.kill()
    holder.wait()
  # The holder died: its lock is stale and the next run takes it over.
  assert fit.fit(_task(), _cfg(), str(workdir)).summary['finished']


@pytest.mark.parametrize(
  'changed',
  [{'ema_decay': 0.5}, {'optimizer': 'no_clip'}],
  ids=['ema_on', 'grad_clip_0'],
)
def test_a_changed_hyperparameter_resumes_and_keeps_every_checkpoint(
  tmp_path, changed
):
  workdir = str(tmp_path)
  fit.fit(_task(), _cfg(halt_after_steps=4), workdir)
  before = _params(workdir)
  if changed.get('optimizer') == 'no_clip':
    changed = {
      'optimizer': config_lib.optimizer_config(
        learning_rate=0.05, warmup_steps=1, total_steps=8, grad_clip=0.0
      )
    }
  out = fit.fit(_task(), _cfg(**changed), workdir)
  assert out.summary['finished'] and out.summary['start_step'] == 4
  names = os.listdir(os.path.join(workdir, 'checkpoints'))
  assert not [n for n in names if 'corrupt' in n], names
  assert set(before) <= set(_params(workdir)) | {4}


def test_an_incompatible_resume_touches_nothing(tmp_path):
  workdir = str(tmp_path)
  fit.fit(_task(), _cfg(halt_after_steps=4), workdir, config_record={'v': 1})
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  wider = dataclasses.replace(
    _task(), init=lambda key: {'w': jnp.zeros((DIM + 1,))}
  )
  with pytest.raises(IncompatibleCheckpointError, match='w'):
    fit.fit(wider, _cfg(), workdir, config_record={'v': 2})
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f) == {'v': 1}
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before


# A run of the least-squares task that a test can kill at any moment: a
# checkpoint every step, so a kill lands in a step, a save or a log write.
_KILLED_RUN = dict(num_steps=20, checkpoint_every=1, log_every=1, eval_every=0)
_VICTIM = """
import sys
sys.path.insert(0, {tests!r})
from test_fit import _KILLED_RUN, _cfg, _task
from ddlm_jax.training import fit
result = fit.fit(_task(), _cfg(**_KILLED_RUN), {workdir!r})
print(result.summary['steps'], flush=True)
"""


def _saved_steps(workdir) -> list[int]:
  """Finished checkpoints, read from the directory names (no orbax)."""
  ckpts = os.path.join(workdir, 'checkpoints')
  names = os.listdir(ckpts) if os.path.isdir(ckpts) else []
  return sorted(int(n) for n in names if n.isdigit())


@pytest.mark.slow
def test_kill_9_at_random_moments_ends_like_an_uninterrupted_run(tmp_path):
  """Each victim is killed at a random moment within 0.5 s after it saved
  a new step, so the kill lands mid-training (in a step, a save or a log
  write), not in the seconds Python and jax take to start; the last run
  resumes and ends as the uninterrupted one."""
  import subprocess
  import sys
  import time

  tests = os.path.dirname(__file__)
  num_steps = _KILLED_RUN['num_steps']

  # Every victim compiles the same small programs, each under the cache's
  # floor (0.3 s, tests/conftest.py): cached, the later ones start ~1 s of
  # CPU sooner. A kill
  # mid-write leaves a bad entry, which jax reads as a miss.
  env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')

  def start(workdir):
    code = _VICTIM.format(tests=tests, workdir=str(workdir))
    return subprocess.Popen(
      [sys.executable, '-c', code], stdout=subprocess.PIPE, text=True, env=env
    )

  ref = fit.fit(_task(), _cfg(**_KILLED_RUN), str(tmp_path / 'ref'))
  rng = np.random.default_rng(0)
  workdir = tmp_path / 'killed'
  kills = 0
  for _ in range(2):
    saved = _saved_steps(workdir)
    proc = start(workdir)
    deadline = time.monotonic() + 300
    while proc.poll() is None and _saved_steps(workdir) == saved:
      assert time.monotonic() < deadline, 'the victim saved nothing'
      time.sleep(0.02)
    time.sleep(float(rng.uniform(0.0, 0.5)))
    if proc.poll() is None:
      proc.kill()  # SIGKILL: no handler runs, no save.
      kills += 1
    proc.wait()
  # 20 steps with a save after each cannot all fit in the 0.5 s a victim
  # lives after its first new save: both victims die mid-run.
  assert kills == 2
  last = start(workdir)
  assert last.communicate(timeout=300)[0].strip().endswith(str(num_steps))
  assert ref.summary['steps'] == num_steps
  got, ref_ck = (
    Checkpointer(os.path.join(d, 'checkpoints'))
    for d in (workdir, tmp_path / 'ref')
  )
  assert got.latest_step() == ref_ck.latest_step() == num_steps
  final = lambda d: [
    r
    for r in _records(str(d))
    if r['split'] == 'train' and r['step'] == num_steps
  ]
  # The resumed run's last loss equals the uninterrupted one's, and the
  # log has each step once (replayed steps replaced, not duplicated).
  np.testing.assert_allclose(
    final(workdir)[0]['loss'], final(tmp_path / 'ref')[0]['loss'], rtol=1e-6
  )
  steps_logged = [
    r['step'] for r in _records(str(workdir)) if r['split'] == 'train'
  ]
  assert steps_logged == sorted(set(steps_logged))
  got.close()
  ref_ck.close()


def test_the_final_phase_runs_after_fit_returned_and_joins_the_records(
  tmp_path,
):
  result = fit.fit(_task(), _cfg(), str(tmp_path))
  with pytest.raises(dataclasses.FrozenInstanceError):
    result.step = 0
  with open(tmp_path / 'summary.json') as f:
    assert 'final' not in json.load(f)  # Written before the final phase.

  def final(res, writer):
    writer.write(res.step, 'test', {'accuracy': 0.5})
    return {'final': float(res.params['w'][0])}

  out = fit.finish(result, final)
  assert out['final'] == float(result.state.params['w'][0])
  assert out['status'] == 'ok' and out['steps'] == 8
  with open(tmp_path / 'summary.json') as f:
    assert json.load(f)['final'] == out['final']
  assert {'step': 8, 'split': 'test', 'accuracy': 0.5} in _records(
    str(tmp_path)
  )
