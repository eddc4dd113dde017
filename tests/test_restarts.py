"""Restarts trained side by side (``train.restarts``).

Each replica must train exactly as it would alone: its gradient is the one
of its own loss, the optimizer clips and decays it alone. Validation picks
the best replica (accuracy, then faithful relations); the run resumes like
any other and tests the chosen replica.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training import restarts as restarts_lib
from ddlm_jax.training.metrics import read_metrics
from ddlm_jax.training.optimizer import make_optimizer
from experiments.configs import state_tracking as cfgs

R = 3


def _params(key):
  k1, k2, k3 = jax.random.split(key, 3)
  return {
    'w': jax.random.normal(k1, (4, 5)),
    'b': jax.random.normal(k2, (5,)),
    'scale': jax.random.normal(k3, ()),
  }


def test_optimizer_treats_each_replica_as_a_run_of_its_own():
  params_R = jax.vmap(_params)(jax.random.split(jax.random.key(0), R))
  # Gradients of very different sizes: only some replicas get clipped.
  grads_R = jax.tree.map(
    lambda p: p * jnp.array([0.01, 1.0, 30.0]).reshape(-1, *[1] * (p.ndim - 1)),
    params_R,
  )
  kw = dict(learning_rate=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5)
  stacked, _ = make_optimizer(**kw, replica_axis=True)
  single, _ = make_optimizer(**kw)
  state = stacked.init(params_R)
  for _ in range(3):
    updates_R, state = stacked.update(grads_R, state, params_R)
  for r in range(R):
    p, g = restarts_lib.replica(params_R, r), restarts_lib.replica(grads_R, r)
    state_r = single.init(p)
    for _ in range(3):
      updates, state_r = single.update(g, state_r, p)
    for got, want in zip(
      jax.tree.leaves(restarts_lib.replica(updates_R, r)),
      jax.tree.leaves(updates),
      strict=True,
    ):
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  # The stacked clip is not the joint one: joint clipping would shrink the
  # small replica's update too.
  joint, _ = make_optimizer(**kw)
  joint_updates, _ = joint.update(grads_R, joint.init(params_R), params_R)
  assert not np.allclose(joint_updates['w'][0], updates_R['w'][0])


def test_stacked_loss_gives_each_replica_its_own_gradient():
  def loss(params, key, batch):
    noise = jax.random.normal(key, ())
    value = jnp.sum((batch['x'] @ params['w'] + params['b']) ** 2) * (
      1 + 0.1 * noise
    )
    return value, {'acc': value / 10}

  init = restarts_lib.stack_init(_params, R)
  params_R = init(jax.random.key(1))
  assert params_R['w'].shape == (R, 4, 5)
  batch = {'x': jax.random.normal(jax.random.key(2), (6, 4))}
  key = jax.random.key(3)
  stacked = restarts_lib.stack_loss(loss, R)
  (value, aux), grads_R = jax.value_and_grad(stacked, has_aux=True)(
    params_R, key, batch
  )
  keys = jax.random.split(key, R)
  values = []
  for r in range(R):
    p = restarts_lib.replica(params_R, r)
    (v, _), g = jax.value_and_grad(loss, has_aux=True)(p, keys[r], batch)
    values.append(v)
    for got, want in zip(
      jax.tree.leaves(restarts_lib.replica(grads_R, r)),
      jax.tree.leaves(g),
      strict=True,
    ):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(value, sum(values), rtol=1e-5)
  np.testing.assert_allclose(aux['acc'], np.mean(values) / 10, rtol=1e-5)
  np.testing.assert_allclose(aux['acc_best'], max(values) / 10, rtol=1e-5)
  # Each replica starts from its own initialisation.
  assert not np.allclose(params_R['w'][0], params_R['w'][1])


def _state(extra_acc, extra_rel):
  class State:
    def __init__(self, params, extra):
      self.params, self.extra = params, extra

    def replace(self, extra):
      return State(self.params, extra)

  params_R = jax.vmap(_params)(jax.random.split(jax.random.key(0), R))
  extra = st_task._init_extra_restarts(params_R)
  extra['best_val_acc'] = jnp.float32(extra_acc)
  extra['best_relations'] = jnp.float32(extra_rel)
  return State(params_R, extra)


def test_selection_prefers_the_replica_that_represents_the_group():
  keep = st_task._keep_best_restart(early_stop=1.0)
  state = _state(1.0, 0.2)  # A best so far that fits but is no action.
  res = {'accuracy': 1.0, 'faithful_relations': 1.0, 'restart': 2}
  new, stop = keep(state, res, 500)
  assert stop and int(new.extra['best_restart']) == 2
  assert int(new.extra['best_step']) == 500
  np.testing.assert_array_equal(
    new.extra['best_params']['w'], state.params['w'][2]
  )
  # 100% validation without a faithful representation: kept if better,
  # but no early stop.
  res = {'accuracy': 1.0, 'faithful_relations': 0.5, 'restart': 1}
  new, stop = keep(_state(0.9, 1.0), res, 250)
  assert not stop and int(new.extra['best_restart']) == 1
  # Lower accuracy never replaces the best, whatever its relations.
  res = {'accuracy': 0.8, 'faithful_relations': 1.0, 'restart': 0}
  new, stop = keep(_state(0.9, 0.0), res, 250)
  assert not stop and int(new.extra['best_step']) == 0
  # Tasks without the group diagnostic stop on accuracy alone.
  new, stop = keep(_state(0.5, 0.0), {'accuracy': 1.0, 'restart': 0}, 9)
  assert stop


@pytest.mark.slow
def test_restarts_train_resume_and_test_the_chosen_replica(tmp_path):
  c = cfgs.get_config('pdssm,s3,smoke')
  c.train.restarts = 2
  c.train.num_steps = 6
  c.train.eval_every = c.train.checkpoint_every = 3
  full = st_task.train_state_tracking(c, str(tmp_path / 'full'))
  assert full['restarts'] == 2 and full['best_restart'] in (0, 1)
  assert 0 <= full['test_accuracy'] <= 1 and full['steps'] == 6
  c.train.halt_after_steps = 3
  st_task.train_state_tracking(c, str(tmp_path / 'part'))
  resumed = st_task.train_state_tracking(c, str(tmp_path / 'part'))
  for key in ('test_accuracy', 'test_accuracy_final', 'best_restart'):
    assert resumed[key] == full[key], key
  # The chosen replica is what the test scored: its parameters alone give
  # the summary's test accuracy.
  state = st_task.restore_state(c, str(tmp_path / 'full'))
  res, _ = st_task.score_best(c, state)
  assert res['accuracy'] == full['test_accuracy']
  assert state.params['embed']['embedding'].shape[0] == 2
  # The summary's group maps are those of the tested parameters: the same
  # as the validation record that chose them.
  rows = read_metrics(str(tmp_path / 'full'))
  chosen = next(
    r
    for r in rows
    if r.get('split') == 'validation' and r['step'] == full['best_step']
  )
  assert set(full['group_maps']) >= {'bijective_frac', 'faithful_relations'}
  for key, value in full['group_maps'].items():
    assert value == pytest.approx(chosen[key]), key
