"""Tests for the DDLM planner -> ARM executor pipelines."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from ddlm_jax.data import planning_tasks as pt
from ddlm_jax.data import reasoning as rs
from ddlm_jax.evaluation.cost import transformer_flops
from ddlm_jax.planning import conditional, layout, pipelines
from ddlm_jax.planning import models as pm
from ddlm_jax.sampling.registry import get_sampler
from ddlm_jax.tasks import planner as planner_task
from experiments.configs import planner_executor as pe_config
from experiments.configs.common import override

P = 10  # fits level-5 plans
ARITH = pt.get_task('arithmetic')
TINY = ml_collections.ConfigDict(dict(width=16, depth=1, num_heads=2))


@pytest.fixture(scope='module')
def tiny():
  planner = pm.build(pm.backbone_config(TINY, causal=False), 0)
  executor = pm.build(pm.backbone_config(TINY, causal=True), 1)
  # The head starts at zero; a random one makes every logit depend on input.
  kernel = executor.head.kernel
  kernel.value = jax.random.normal(jax.random.key(2), kernel.value.shape)
  data = ARITH.make_split('test', rs.LEVELS, 2, seed=0, plan_len=P)
  return planner, executor, data


def test_conditional_loss_never_masks_the_question():
  x = jnp.asarray(
    layout.planner_sequence(
      *[
        ARITH.make_split('train', (3,), 8, seed=0, plan_len=P)[k]
        for k in ('question', 'plan')
      ]
    )
  )
  cond = jnp.asarray(layout.condition_mask(8, P))
  seen = []

  def apply(z, t):
    seen.append(z)
    return jnp.zeros(z.shape + (rs.VOCAB_SIZE,))

  process = pipelines.planner_process()
  obj, nelbo, aux = conditional.conditional_loss(
    process, apply, jax.random.key(0), x, cond
  )
  z = seen[0]
  np.testing.assert_array_equal(
    z[:, : rs.QUESTION_LEN], x[:, : rs.QUESTION_LEN]
  )
  masked = np.asarray(z == process.mask_id)
  assert masked[:, rs.QUESTION_LEN :].any()
  # Uniform logits: each masked plan token costs log V, times the weight.
  t_B, w_B = process.sample_times(jax.random.split(jax.random.key(0))[0], 8)
  expect = w_B * masked.sum(-1) * math.log(rs.VOCAB_SIZE)
  expect = expect + process.reconstruction_nats(P)
  np.testing.assert_allclose(obj, expect, rtol=1e-5)
  np.testing.assert_allclose(nelbo, obj, rtol=1e-6)
  np.testing.assert_allclose(aux['t'], t_B)
  # simple_ce: the same masks, unweighted cross-entropy; NELBO unchanged.
  seen.clear()
  obj_ce, nelbo_ce, _ = conditional.conditional_loss(
    pipelines.planner_process('simple_ce'), apply, jax.random.key(0), x, cond
  )
  np.testing.assert_array_equal(seen[0], z)
  np.testing.assert_allclose(
    obj_ce, masked.sum(-1) * math.log(rs.VOCAB_SIZE), rtol=1e-5
  )
  np.testing.assert_allclose(nelbo_ce, nelbo, rtol=1e-6)


def test_plan_sampling_fills_the_plan_and_keeps_the_question(tiny):
  planner, _, data = tiny
  q = jnp.asarray(data['question'])
  sampler = get_sampler('confidence', num_steps=4, greedy=True)
  plan, nfe, z = conditional.sample_plan(
    sampler,
    lambda z, t: planner(z),
    jax.random.key(0),
    pipelines.planner_process(),
    q,
    P,
  )
  assert plan.shape == (len(q), P) and int(nfe) == 4
  assert not np.any(np.asarray(plan) == rs.VOCAB_SIZE)
  np.testing.assert_array_equal(z[:, : rs.QUESTION_LEN], q)


def test_soft_tokens_have_executor_width_and_reach_its_first_layer(tiny):
  planner, executor, data = tiny
  q, plan = data['question'], data['plan']
  tokens = jnp.asarray(layout.executor_sequence(q, plan, data['answer']))
  blank = jnp.asarray(
    layout.executor_sequence(q, layout.pad_plan(len(q), P), data['answer'])
  )
  # Soft tokens equal to the plan's embeddings reproduce the text logits:
  # they enter exactly where token embeddings enter the first block.
  logits = jax.jit(pm.executor_logits)
  soft = executor.embed(jnp.asarray(plan))
  np.testing.assert_allclose(
    logits(executor, blank, soft), logits(executor, tokens), atol=1e-5
  )
  # The projector maps planner states to the executor's embedding width.
  proj = pm.Projector(16, 16, num_layers=2, rngs=pm.nnx.Rngs(0))
  h = pm.planner_hidden(planner, jnp.asarray(layout.planner_sequence(q, plan)))
  soft = proj(h[:, -P:])
  assert soft.shape == (len(q), P, executor.cfg.width)
  pos = layout.answer_position(P)
  grad = jax.jit(
    jax.grad(lambda s: pm.executor_logits(executor, blank, s)[:, pos].sum())
  )(soft)
  assert np.all(np.abs(np.asarray(grad)).sum(-1) > 0)  # every soft token
  with pytest.raises(ValueError, match='width'):
    pm.executor_logits(executor, blank, jnp.zeros((len(q), P, 8)))


def _graphs(tiny):
  planner, executor, _ = tiny
  proj = pm.Projector(16, 16, num_layers=2, rngs=pm.nnx.Rngs(3))
  gd, params = {}, {}
  for name, mod in (('planner', planner), ('executor', executor),
                    ('projector', proj)):  # fmt: skip
    gd[name], params[name] = pm.split(mod)
  return gd, params


def test_every_pipeline_is_deterministic_given_a_key(tiny):
  gd, params = _graphs(tiny)
  q = jnp.asarray(tiny[2]['question'])
  sampler = get_sampler('ancestral', num_steps=8, use_cache=False)
  differs = False
  for name in pipelines.PIPELINES:
    spec = pipelines.PipelineSpec(
      name, P, sampler=sampler, exec_temperature=1.0
    )
    run = pipelines.make_runner(spec, gd, fast_compile=True)
    a = run(params, jax.random.key(5), q)
    b = run(params, jax.random.key(5), q)
    c = run(params, jax.random.key(6), q)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
    differs |= not np.array_equal(a['answer_B'], c['answer_B'])
    assert a['answer_B'].shape == (len(q),)
  assert differs  # the key matters


def _smoke(pipeline: str, models_dir: str, **overrides):
  config = pe_config.get_config(f'{pipeline},smoke')
  config.models_dir = models_dir
  return override(config, overrides)


@pytest.fixture(scope='module')
def smoke_runs(tmp_path_factory):
  """Every pipeline's smoke preset, run once; the models are shared."""
  tmp = tmp_path_factory.mktemp('pe')
  models = str(tmp / 'models')
  outs = {}
  for name in pipelines.PIPELINES:
    config = _smoke(name, models)
    outs[name] = planner_task.run_planner_executor(config, str(tmp / name))
  return models, outs


@pytest.mark.slow
def test_projector_trains_with_planner_and_executor_frozen(
  tmp_path, smoke_runs
):
  config = _smoke('latent', smoke_runs[0])
  graphdefs, params = planner_task.load_models(config, config.models_dir)
  before = jax.tree.map(np.array, params)
  proj0 = pm.split(planner_task.build_projector(config, config.seed))[1]
  graphdefs, trained = planner_task.train_projector(
    config, str(tmp_path / 'latent'), graphdefs, params
  )
  for name in ('planner', 'executor'):
    jax.tree.map(np.testing.assert_array_equal, before[name], trained[name])
  moved = jax.tree.map(
    lambda a, b: not np.array_equal(a, b), proj0, trained['projector']
  )
  assert any(jax.tree.leaves(moved))
  # The option unfreezes the executor (the planner stays frozen).
  config.latent.unfreeze_executor = True
  _, unfrozen = planner_task.train_projector(
    config, str(tmp_path / 'latent_unfrozen'), graphdefs, params
  )
  jax.tree.map(np.testing.assert_array_equal, before['planner'],
               unfrozen['planner'])  # fmt: skip
  moved = jax.tree.map(
    lambda a, b: not np.array_equal(a, b),
    before['executor'],
    unfrozen['executor'],
  )
  assert any(jax.tree.leaves(moved))


@pytest.mark.slow
def test_smoke_presets_of_every_pipeline_run(smoke_runs):
  for name, out in smoke_runs[1].items():
    config = _smoke(name, smoke_runs[0])
    assert set(out['per_level']) == {'1', '2', '3', '4', '5'}
    assert 0.0 <= out['accuracy'] <= 1.0
    cfgs = planner_task.model_configs(config)
    exec_call = transformer_flops(
      cfgs['executor'], 1, layout.executor_length(config.reasoning.plan_len)
    )
    if name == 'text':
      plan_call = transformer_flops(
        cfgs['planner'], 1, layout.planner_length(config.reasoning.plan_len)
      )
      assert out['planning_nfe'] == config.plan.steps
      assert out['flops'] == pytest.approx(
        config.plan.steps * plan_call + exec_call
      )
    if name == 'cot':
      assert out['exec_nfe'] == config.reasoning.plan_len + 2
    if name == 'latent':
      assert out['planning_nfe'] == config.plan.steps + 1
      assert out['latent_tokens'] == config.reasoning.plan_len


def test_bad_configs_raise():
  with pytest.raises(ValueError, match='pipeline'):
    pe_config.get_config('planner,cpu')
  with pytest.raises(ValueError, match='preset'):
    pe_config.get_config('latent,gpu')
  config = pe_config.get_config('text,smoke')
  config.reasoning.plan_len = 8
  with pytest.raises(ValueError, match='plan_len'):
    planner_task.check_config(config)
  with pytest.raises(ValueError, match='latent_source'):
    pipelines.PipelineSpec('latent', P, latent_source='mean')
