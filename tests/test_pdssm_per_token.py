"""PD-SSM transitions computed once per token id in the first block.

The first block of the sequence classifier sees a function of the token
alone, so its P_t (a Sinkhorn over N x N per position when relaxed) is
computed once per vocabulary id and gathered. These tests hold that path
to the per-position computation it replaces: the training loss, its
metrics and its gradients (relaxed, straight-through, with padding), and
the evaluation logits, for both PD-SSM blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm
from ddlm_jax.tasks import state_tracking as st_task
from experiments.configs import state_tracking as cfgs


def _config(model: str):
  c = cfgs.get_config(f'{model},s3,groups')
  c.model.d_model = 16
  return c


def _batch(config, hard: float):
  task = st_task.state_tracking_task(config)
  it = task.batches(0)
  for _ in range(900):  # Past the length curriculum: lengths up to 40.
    batch = next(it)
  batch = {k: jnp.asarray(v[:16]) for k, v in batch.items()}
  batch['relax_tau'] = jnp.full((16,), 0.4)
  batch['relax_hard'] = jnp.full((16,), hard)
  assert int(batch['lengths'].min()) < batch['tokens'].shape[1]  # Padding.
  return task, batch


def _per_position(monkeypatch, on: bool):
  if not on:
    monkeypatch.setattr(sc, '_per_token_transitions', lambda block: False)


@pytest.mark.parametrize('model', ['pdssm', 'pdssm_paper'])
@pytest.mark.parametrize('hard', [0.0, 1.0])
def test_training_loss_and_gradients_match_per_position(
  monkeypatch, model, hard
):
  config = _config(model)
  task, batch = _batch(config, hard)
  params = task.init(jax.random.key(3))
  grad_fn = lambda: jax.jit(jax.value_and_grad(task.loss, has_aux=True))
  (value, aux), grads = grad_fn()(params, jax.random.key(0), batch)
  _per_position(monkeypatch, False)
  (ref_value, ref_aux), ref_grads = grad_fn()(params, jax.random.key(0), batch)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  assert set(aux) == set(ref_aux) >= {'p_entropy', 'phase_sq'}
  for name in aux:
    np.testing.assert_allclose(aux[name], ref_aux[name], rtol=1e-5, atol=1e-7)
  flat, ref_flat = jax.tree.leaves(grads), jax.tree.leaves(ref_grads)
  assert len(flat) == len(ref_flat)
  largest = 0.0
  for g, r in zip(flat, ref_flat, strict=True):
    scale = float(jnp.abs(r).max()) + 1e-8
    np.testing.assert_allclose(g / scale, r / scale, atol=1e-4)
    largest = max(largest, float(jnp.abs(r).max()))
  assert largest > 0  # The gradients compared are not all zero.


@pytest.mark.parametrize('model', ['pdssm', 'pdssm_paper'])
@pytest.mark.parametrize('num_layers', [1, 2])
def test_evaluation_logits_match_per_position(monkeypatch, model, num_layers):
  # Two layers: the second block's input depends on the prefix, so ids
  # passed to it would change the logits.
  config = _config(model)
  config.model.num_layers = num_layers
  graphdef, init, _ = st_task.programs(st_task.classifier_config(config), False)
  params = init(jax.random.key(4))
  tokens_BxL = jax.random.randint(jax.random.key(5), (8, 60), 1, 7)
  lengths_B = jnp.array([60, 3, 17, 40, 59, 1, 33, 60])
  run = lambda: jax.jit(
    lambda p: nnx.merge(graphdef, p).logits_all(tokens_BxL, lengths_B)
  )
  logits = run()(params)
  _per_position(monkeypatch, False)
  np.testing.assert_allclose(logits, run()(params), rtol=1e-4, atol=1e-4)


def test_blocks_that_take_token_ids():
  c = _config('pdssm')
  c.model.num_layers = 2
  model = sc.SequenceClassifier(st_task.classifier_config(c), rngs=nnx.Rngs(0))
  assert [sc._per_token_transitions(b) for b in model.blocks] == [True, True]
  # The paper's layer (no Sinkhorn) keeps its per-position arithmetic,
  # until a relaxed training step sets a temperature.
  paper = cfgs.get_config('pdssm,parity,cpu_long')
  paper = sc.SequenceClassifier(
    st_task.classifier_config(paper), rngs=nnx.Rngs(0)
  )
  assert not sc._per_token_transitions(paper.blocks[0])
  paper.blocks[0].mixer.relax_temperature = 0.5
  assert sc._per_token_transitions(paper.blocks[0])
  plain = cfgs.get_config('complex_diag,s3,cpu')
  plain = sc.SequenceClassifier(
    st_task.classifier_config(plain), rngs=nnx.Rngs(0)
  )
  assert not any(sc._per_token_transitions(b) for b in plain.blocks)


def test_token_ids_change_nothing_outside_pdssm():
  mixer = ssm.SSMMixer(8, 4, mode='complex_diag', rngs=nnx.Rngs(0))
  u_BxLxD = jax.random.normal(jax.random.key(0), (2, 5, 8))
  ids_BxL = jnp.zeros((2, 5), jnp.int32)
  np.testing.assert_array_equal(
    mixer(u_BxLxD, None, (ids_BxL, 3)), mixer(u_BxLxD)
  )
