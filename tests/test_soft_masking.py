"""Soft-masking: the blend, the two-pass objective, feedback sampling, runs."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.diffusion.soft_masking import SoftMaskedDiffusion
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.models.soft_masking import (
  SoftMaskedModel,
  SoftMaskInput,
  feedback_lambda,
  soft_mask_embeddings,
)
from ddlm_jax.sampling.registry import get_sampler
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.training import warm_start
from ddlm_jax.training.optimizer import make_optimizer
from experiments.configs import sm_continue
from experiments.configs.common import override

V = 11


def _model(k=2, w_s=0.3, seed=0):
  cfg = TransformerConfig(
    vocab_size=V, input_vocab_size=V + 1, width=32, depth=2, num_heads=2
  )
  net = Transformer(cfg, rngs=nnx.Rngs(seed))
  # The head starts at zero; random weights make every output informative.
  head = net.head.kernel
  head[...] = jax.random.normal(jax.random.key(seed + 100), head.shape)
  return SoftMaskedModel(net, V, SoftMaskInput(k=k, w_s=w_s))


def _run(fn, model, *args):
  """fn(model, *args) under jit (eager NNX calls are slow on CPU)."""
  graph, state = nnx.split(model)
  return jax.jit(lambda st, *a: fn(nnx.merge(graph, st), *a))(state, *args)


def _process(sm_prob=0.8):
  return SoftMaskedDiffusion(get_schedule('loglinear'), V, sm_prob=sm_prob)


def test_scalars_start_at_the_paper_values():
  w_s, w_a, w_b = SoftMaskInput(w_s=0.25).scalars()
  np.testing.assert_allclose([w_s, w_a, w_b], [0.25, 6.66, -0.75], rtol=1e-5)
  with pytest.raises(ValueError, match='w_a > 0 and w_b < 0'):
    SoftMaskInput(w_b=0.5)
  with pytest.raises(ValueError, match='k must be'):
    SoftMaskInput(k=0)


def test_lambda_matches_a_hand_computation():
  logits = np.array([[[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]]], np.float32)
  w_s, w_a, w_b = 0.4, 6.66, -0.75
  got = feedback_lambda(jnp.asarray(logits), w_s, w_a, w_b)
  for j in range(2):
    p = np.exp(logits[0, j]) / np.exp(logits[0, j]).sum()
    h = -(p * np.log(p)).sum()
    want = w_s / (1.0 + math.exp(-w_a * (-h - w_b)))
    np.testing.assert_allclose(got[0, j], want, rtol=1e-5)
  # Uniform predictions (max entropy) get less weight than peaked ones.
  assert got[0, 1] < got[0, 0]


def test_blend_changes_only_masked_positions_and_uses_top_k():
  key = jax.random.key(0)
  x = jax.random.normal(key, (2, 5, 4))
  table = jax.random.normal(jax.random.fold_in(key, 1), (V + 1, 4))
  logits = jax.random.normal(jax.random.fold_in(key, 2), (2, 5, V)) * 3
  masked = jnp.array([[1, 0, 1, 0, 0], [0, 0, 0, 1, 1]], bool)
  lam = jnp.full((2, 5), 0.3)
  out = jax.jit(soft_mask_embeddings, static_argnames='k')(
    x, table, masked, logits, lam, k=2
  )
  np.testing.assert_array_equal(out[~masked], x[~masked])
  # Hand computation at one masked position.
  top_v, top_i = jax.lax.top_k(logits[0, 0], 2)
  pi = np.exp(top_v) / np.exp(top_v).sum()
  mix = pi[0] * table[top_i[0]] + pi[1] * table[top_i[1]]
  np.testing.assert_allclose(out[0, 0], 0.7 * x[0, 0] + 0.3 * mix, rtol=1e-5)


def test_zero_w_s_reproduces_the_plain_model_exactly():
  model = _model()
  model.soft_mask.r_s[...] = -jnp.inf  # w_s = sigmoid(-inf) = 0 exactly.
  z = jnp.array([[V, 1, V, 3, V, 5, 6, V]] * 2)
  prev = jax.random.normal(jax.random.key(1), (2, 8, V)) * 5
  x = jax.random.randint(jax.random.key(2), (4, 16), 0, V)
  plain = MaskedDiffusion(get_schedule('loglinear'), V)
  key = jax.random.key(3)

  def both(m, z, prev, x):
    return (
      m(z, None, prev_logits=prev),
      m.net(z),
      _process(1.0).loss(m, key, x)[1],
      plain.loss(m.net, key, x)[1],
    )

  sm_out, plain_out, sm_nelbo, plain_nelbo = _run(both, model, z, prev, x)
  np.testing.assert_array_equal(sm_out, plain_out)
  # ... and so the two-pass NELBO equals the plain process's, per sequence.
  np.testing.assert_array_equal(sm_nelbo, plain_nelbo)


def test_feedback_reaches_the_masked_positions_only():
  model = _model(w_s=0.9)
  model.soft_mask.r_a[...] = -30.0  # w_a ~ 0: lambda = w_s / 2 everywhere.
  z = jnp.array([[V, 1, V, 3, V, 5, 6, V]])
  prev = jax.random.normal(jax.random.key(1), (1, 8, V)) * 5
  call = lambda m, z, p, u: m(z, None, prev_logits=p, use_prev=u)
  off = _run(call, model, z, prev, False)
  np.testing.assert_array_equal(off, _run(lambda m, z: m.net(z), model, z))
  on = _run(call, model, z, prev, True)
  lam = _run(lambda m, p: m.feedback_lambda(p), model, prev)
  np.testing.assert_allclose(lam, 0.45, rtol=1e-5)
  assert not np.allclose(on, off)


@pytest.mark.slow
def test_soft_masking_wraps_the_hybrid_ssm_backbone():
  from ddlm_jax.training import builders

  c = sm_continue.get_config('sm,smoke')
  c.model.backbone, c.model.pattern, c.model.state_size = 'hybrid', 'AS', 8
  c.model.depth = 2
  c.model.scan_impl = 'reference'  # Compiles faster; same numbers.
  process = builders.make_process(
    builders.process_settings(c.process), V, c.soft_mask
  )
  model = builders.model_builder(c.model, process, c.soft_mask)(nnx.Rngs(0))
  assert type(model.net).__name__ == 'HybridTransformer'
  z = jnp.array([[V, 1, V, 3, V, 5, 6, V]])
  prev = jax.random.normal(jax.random.key(1), (1, 8, V))
  out = _run(lambda m, z, p: m(z, None, prev_logits=p), model, z, prev)
  assert out.shape == (1, 8, V) and bool(jnp.all(jnp.isfinite(out)))


class _TwoNets:
  """apply whose pass 1 (no prev_logits) and pass 2 use separate nets."""

  def __init__(self, first, second):
    self.first, self.second = first, second
    self.soft_mask = second.soft_mask

  def __call__(self, z, t, prev_logits=None):
    if prev_logits is None:
      return self.first.net(z)
    return self.second(z, t, prev_logits=prev_logits)

  def feedback_lambda(self, prev):
    return self.second.feedback_lambda(prev)


def test_pass_one_receives_no_gradient():
  graph, params1 = nnx.split(_model(seed=0), nnx.Param)
  _, params2 = nnx.split(_model(seed=1), nnx.Param)
  x = jax.random.randint(jax.random.key(2), (4, 16), 0, V)

  def loss(p1, p2):
    apply = _TwoNets(nnx.merge(graph, p1), nnx.merge(graph, p2))
    return _process(1.0).loss(apply, jax.random.key(5), x)[0].sum()

  g1, g2 = jax.jit(jax.grad(loss, argnums=(0, 1)))(params1, params2)
  assert all(float(jnp.abs(v).max()) == 0 for v in jax.tree.leaves(g1))
  assert any(float(jnp.abs(v).max()) > 0 for v in jax.tree.leaves(g2))
  # The SM scalars learn through lambda.
  assert float(jnp.abs(g2['soft_mask']['r_s'][...])) > 0


def test_two_pass_evaluation_is_deterministic_and_always_two_pass():
  model = _model()
  process = _process(0.5).evaluation_process
  assert process.sm_prob == 1.0
  x = jax.random.randint(jax.random.key(2), (4, 16), 0, V)
  loss = lambda m, x: process.loss(m, jax.random.key(7), x)
  a, b = _run(loss, model, x), _run(loss, model, x)
  np.testing.assert_array_equal(a[1], b[1])
  assert float(a[2]['sm_two_pass']) == 1.0


def test_scalars_have_their_own_learning_rate():
  params = {'net': {'w': jnp.ones((3, 3))}, 'soft_mask': {'r_s': jnp.zeros(())}}
  tx, _ = make_optimizer(
    learning_rate=1e-4,
    warmup_steps=0,
    total_steps=10,
    grad_clip=0.0,
    group_learning_rates={'soft_mask': 1e-2},
  )
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  # Adam's first step moves each parameter by its learning rate.
  np.testing.assert_allclose(updates['net']['w'], -1e-4, rtol=1e-3)
  np.testing.assert_allclose(updates['soft_mask']['r_s'], -1e-2, rtol=1e-3)
  with pytest.raises(ValueError, match='name no parameters'):
    make_optimizer(
      learning_rate=1e-4,
      warmup_steps=0,
      total_steps=10,
      group_learning_rates={'nope': 1.0},
    )[0].init(params)


class _CountingNet:
  """A feedback net whose prediction is 'the number of calls so far'.

  It puts all mass on token c, where c = previous c + 1 (1 on the first
  call), read from the previous logits; so the tokens a sampler reveals
  show that each call received the previous call's logits.
  """

  uses_feedback = True

  def __call__(self, z, t, prev_logits=None, use_prev=True):
    if prev_logits is None:
      count = jnp.ones(z.shape, jnp.int32)
    else:
      prev_count = jnp.argmax(prev_logits, axis=-1)
      count = jnp.where(use_prev, prev_count + 1, 1)
    return 1e4 * jax.nn.one_hot(count, 64) - 5e3


@pytest.mark.parametrize(
  'spec',
  [
    ('confidence', {'tokens_per_step': 1}),
    ('ancestral', {'num_steps': 32}),
    ('remdm', {'num_steps': 8, 'eta': 0.0}),
  ],
)
def test_samplers_feed_each_step_logits_to_the_next(spec):
  name, params = spec
  process = MaskedDiffusion(get_schedule('loglinear'), 64)
  sampler = get_sampler(name, **params)
  tokens, nfe = jax.jit(
    lambda key: sampler(_CountingNet(), key, process, batch=3, length=8)
  )(jax.random.key(0))
  tokens, nfe = np.asarray(tokens), int(nfe)
  assert tokens.min() >= 1 and tokens.max() <= nfe
  assert tokens.max() == nfe  # The last call saw nfe - 1 earlier ones.
  if name == 'confidence':  # One reveal per call: tokens 1..8 per row.
    np.testing.assert_array_equal(np.sort(tokens, -1), [np.arange(1, 9)] * 3)


def _sm_config(base, **overrides):
  c = sm_continue.get_config('sm,smoke')
  c.train.init_from = base
  c.mesh.shape = (1, 1, 1)
  c.sample.num_samples = 0
  c.train.eval_every = 0  # The final evaluation is enough here.
  return override(c, overrides)


def _final_params(workdir):
  from ddlm_jax.tasks.language_model import load_run

  run = load_run(workdir)
  params = jax.device_get(run.params)
  run.checkpointer.close()
  return params


@pytest.mark.slow
def test_continued_pretraining_runs_logs_and_resumes(smoke_mdlm_run, tmp_path):
  base_run, _ = smoke_mdlm_run  # Read only: init_from loads its parameters.
  full = str(tmp_path / 'full')
  # w_b = -5 puts lambda in its sensitive range at the smoke model's high
  # entropies (with the paper's -0.75 its gradient is ~1e-10 there).
  sm = {'soft_mask.w_b_init': -5.0}
  summary = lm.train_and_evaluate(
    _sm_config(base_run, **sm, **{'sample.num_samples': 2}), full
  )
  assert np.isfinite(summary['validation']['bits_per_token'])
  assert summary['samples']['nfe'] >= 1  # Feedback sampling of a real net.
  with open(os.path.join(full, 'metrics.jsonl')) as f:
    train = [json.loads(r) for r in f if '"train"' in r]
  assert {'sm_w_s', 'sm_lambda', 'sm_two_pass'} <= set(train[-1])
  assert train[-1]['sm_w_s'] != pytest.approx(0.2, abs=1e-5)  # It trains.
  # The network starts from the base run's parameters.
  base, params = _final_params(base_run), _final_params(full)
  assert set(params) == {'net', 'soft_mask'}
  assert jax.tree.structure(params['net']) == jax.tree.structure(base)
  # Halted after 3 steps and resumed: the same parameters as uninterrupted.
  part = str(tmp_path / 'part')
  halted = lm.train_and_evaluate(
    _sm_config(base_run, **sm, **{'train.halt_after_steps': 3}), part
  )
  assert halted['steps'] == 3
  lm.train_and_evaluate(_sm_config(base_run, **sm), part)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    _final_params(part),
    params,
  )


def test_warm_start_grafts_plain_into_soft_masked_and_checks_shapes():
  plain = {'embedding': np.ones((4, 2)), 'head': {'kernel': np.ones((2, 3))}}
  target = {
    'net': jax.tree.map(np.zeros_like, plain),
    'soft_mask': {'r_s': np.float32(-1.0)},
  }
  out = warm_start.graft(plain, target)
  np.testing.assert_array_equal(out['net']['embedding'], plain['embedding'])
  assert out['soft_mask']['r_s'] == -1.0  # Keeps its initial value.
  np.testing.assert_array_equal(warm_start.graft(out, plain)['head']['kernel'],
                                plain['head']['kernel'])  # fmt: skip
  wide = {**plain, 'embedding': np.ones((4, 3))}
  with pytest.raises(ValueError, match='same model'):
    warm_start.graft(wide, target)
  with pytest.raises(ValueError, match='same model'):
    warm_start.graft({'embedding': plain['embedding']}, target)


def test_soft_masking_with_the_ar_twin_is_refused():
  from ddlm_jax.training import builders

  c = sm_continue.get_config('sm,smoke')
  settings = builders.process_settings({'kind': 'ar'})
  with pytest.raises(ValueError, match='masked-diffusion'):
    builders.make_process(settings, 10, c.soft_mask)
  with pytest.raises(ValueError, match='masked-diffusion'):
    builders.check_process(settings, c.model, c.data.seq_len, c.soft_mask)


def test_unknown_arm_is_a_clear_error():
  with pytest.raises(ValueError, match='unknown arm'):
    sm_continue.get_config('smx')
  assert sm_continue.equal_compute_steps(300, 0.8) == 380


def test_the_bpe_arms_continue_the_word_level_quickstart():
  from experiments.configs import quickstart_bpe

  base = quickstart_bpe.get_config('')
  for arm in sm_continue.ARMS:
    c = sm_continue.get_config(f'{arm},bpe')
    # Everything the warm start must share with the base run is the base's.
    for block, key in (
      ('data', 'tokenizer'),
      ('data', 'bpe_vocab_size'),
      ('data', 'seq_len'),
      ('model', 'width'),
      ('model', 'depth'),
      ('train', 'batch_size'),
    ):
      assert c[block][key] == base[block][key], (arm, key)
    assert c.train.init_from == 'runs/quickstart_bpe'
    assert c.soft_mask.enabled == (arm == 'sm')
    # The continued training is the character regime's.
    char = sm_continue.get_config(arm)
    assert c.train.num_steps == char.train.num_steps
    assert c.optim.learning_rate == char.optim.learning_rate
