"""Hardening P_t by linear assignment (model.harden='matching').

The assignment is checked against exact enumeration of every permutation,
against column argmax where that is already a bijection, and as the forward
of the PD-SSM layer: evaluation and the straight-through training forward
run the same one-hot P_t, a bijection for every token.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm
from ddlm_jax.models.hardmax import assignment_indices, column_argmax
from ddlm_jax.tasks import state_tracking as st_task
from experiments.configs import state_tracking as cfgs


def _best_by_enumeration(m_NxN: np.ndarray) -> tuple[int, ...]:
  n = m_NxN.shape[0]
  return max(
    itertools.permutations(range(n)),
    key=lambda p: sum(m_NxN[p[j], j] for j in range(n)),
  )


def test_assignment_is_the_best_permutation_by_enumeration():
  m_KxNxN = np.asarray(jax.random.normal(jax.random.key(0), (6, 5, 5)))
  got = np.asarray(assignment_indices(jnp.asarray(m_KxNxN)))
  for k in range(6):
    assert tuple(got[k]) == _best_by_enumeration(m_KxNxN[k])


def test_assignment_is_a_bijection_where_column_maxima_collide():
  m = np.zeros((4, 4), np.float32)
  m[0, :] = 1.0  # Every column's maximum is row 0.
  m += 1e-2 * np.asarray(jax.random.uniform(jax.random.key(4), (4, 4)))
  assert len(set(np.asarray(column_argmax(jnp.asarray(m))).tolist())) == 1
  got = np.asarray(assignment_indices(jnp.asarray(m)))
  assert sorted(got.tolist()) == [0, 1, 2, 3]
  assert tuple(got) == _best_by_enumeration(m)


def test_assignment_equals_column_argmax_on_a_bijection():
  perm = np.array([2, 0, 3, 1, 4])
  noise = 0.1 * np.asarray(jax.random.normal(jax.random.key(1), (5, 5)))
  m = np.eye(5)[perm].T + noise  # Column j peaks at row perm[j].
  np.testing.assert_array_equal(
    assignment_indices(jnp.asarray(m)), column_argmax(jnp.asarray(m))
  )


def test_assignment_batches_under_vmap_and_jit():
  m = jax.random.normal(jax.random.key(2), (3, 2, 4, 4))
  want = np.asarray(assignment_indices(m))
  got = jax.jit(jax.vmap(assignment_indices))(m)
  np.testing.assert_array_equal(got, want)
  assert want.shape == (3, 2, 4)


def _mixer():
  return ssm.SSMMixer(
    16,
    6,
    num_dict=4,
    initial_state='onehot',
    harden='matching',
    harden_temperature=0.05,
    relax_normalize=True,
    rngs=nnx.Rngs(0),
  )


def test_matching_layer_runs_one_bijection_per_step_and_trains():
  mixer = _mixer()
  u_BxLxD = jax.random.normal(jax.random.key(3), (2, 9, 16))
  mask_BxL = jnp.arange(9)[None] < jnp.array([[9], [5]])
  p_idx = np.asarray(mixer.transition_indices(u_BxLxD))
  for row in p_idx.reshape(-1, 6):
    assert sorted(row.tolist()) == list(range(6))
  hard = mixer(u_BxLxD, mask_BxL)  # The evaluation layer.
  mixer.relax_temperature = 0.3
  mixer.relax_hard = True  # Straight-through: the same forward.
  np.testing.assert_allclose(mixer(u_BxLxD, mask_BxL), hard, atol=1e-5)
  graphdef, params = nnx.split(mixer)

  def loss(params):
    m = nnx.merge(graphdef, params)
    return jnp.sum(jnp.abs(m(u_BxLxD, mask_BxL)))

  grads = jax.jit(jax.grad(loss))(params)
  assert float(jnp.abs(grads['dictionary'][...]).max()) > 0


def test_matching_option_reaches_the_mixer():
  c = cfgs.get_config('pdssm,s3,groups')
  c.model.harden = 'matching'
  ccfg = st_task.classifier_config(c)
  model = sc.SequenceClassifier(ccfg, rngs=nnx.Rngs(0))
  assert model.blocks[0].mixer.harden == 'matching'
  default = sc.SequenceClassifier(
    st_task.classifier_config(cfgs.get_config('pdssm,s3,groups')),
    rngs=nnx.Rngs(0),
  )
  assert default.blocks[0].mixer.harden == 'argmax'
