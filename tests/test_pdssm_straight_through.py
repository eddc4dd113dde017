"""PD-SSM training options behind the 'groups' preset (all default off).

- straight-through hardening (model.relax_hard_from): the forward is the
  hardmax layer that evaluation runs, the gradient the relaxation's (the
  cotangent of a dense P_t at the hard value, pulled back through
  sinkhorn(M_t, T));
- relax_normalize: the relaxation no longer depends on M_t's scale;
- relax_entropy_weight and phase_penalty_weight: the loss terms they add;
- phase_init and input_init_scale: the initial D_t phases and B;
- the 'groups' preset builds the paper's layer for evaluation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.models import ssm
from ddlm_jax.models.hardmax import column_argmax, sinkhorn
from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training.config import ConfigError
from experiments.configs import state_tracking as cfgs

TAU = 0.3


def _mixer(**kw):
  return ssm.SSMMixer(
    16, 6, num_dict=4, initial_state='onehot', rngs=nnx.Rngs(0), **kw
  )


def _inputs():
  u_BxLxD = jax.random.normal(jax.random.key(1), (2, 9, 16))
  mask_BxL = jnp.arange(9)[None] < jnp.array([[9], [5]])
  return u_BxLxD, mask_BxL


@pytest.mark.parametrize('harden', [None, 0.05])
def test_straight_through_forward_is_the_hardmax_layer(harden):
  mixer = _mixer(harden_temperature=harden)
  u_BxLxD, mask_BxL = _inputs()
  hard = mixer(u_BxLxD, mask_BxL)  # The evaluation layer.
  mixer.relax_temperature = TAU
  relaxed = mixer(u_BxLxD, mask_BxL)
  assert float(jnp.abs(relaxed - hard).max()) > 0.1  # Really different.
  mixer.relax_hard = True
  st = mixer(u_BxLxD, mask_BxL)
  np.testing.assert_allclose(st, hard, rtol=1e-5, atol=1e-5)
  # A traced flag (as the training step sets it) selects the forward.
  mixer.relax_hard = None
  graphdef, params = nnx.split(mixer)

  @jax.jit
  def run(flag):
    m = nnx.merge(graphdef, params)
    m.relax_hard = flag
    return m(u_BxLxD, mask_BxL)

  np.testing.assert_allclose(run(jnp.asarray(False)), relaxed, atol=1e-5)
  np.testing.assert_allclose(run(jnp.asarray(True)), hard, atol=1e-5)


def test_straight_through_gradient_is_the_relaxations():
  mixer = _mixer()
  u_BxLxD, _ = _inputs()
  weights_BxLxD = jax.random.normal(jax.random.key(2), u_BxLxD.shape)
  d = mixer.diagonal(u_BxLxD)
  b = mixer.inputs(u_BxLxD)
  h0_BxN = jnp.zeros((2, 6), b.dtype).at[:, 0].set(1)
  p_hard = jax.nn.one_hot(
    mixer.transition_indices(u_BxLxD), 6, axis=-2, dtype=jnp.float32
  )

  def loss_of_p(p_BxLxNxN):
    # The mixer's output as a function of a dense P_t, everything else
    # held at the mixer's values.
    h, _ = ssm.dense_scan(p_BxLxNxN * d[..., None, :], b, h0_BxN)
    return (mixer.readout(h, u_BxLxD) * weights_BxLxD).sum()

  g_p = jax.grad(loss_of_p)(p_hard)  # Cotangent at the hard P_t.

  graphdef, state = nnx.split(mixer)
  params = nnx.to_pure_dict(state)  # As the training step holds them.

  def soft_of_dict(dictionary):
    m = nnx.merge(graphdef, {**params, 'dictionary': dictionary})
    return sinkhorn(m.mixture(u_BxLxD), TAU, m.sinkhorn_iters)

  _, pull = jax.vjp(soft_of_dict, params['dictionary'])
  (want,) = pull(g_p)

  def loss(dictionary, hard):
    m = nnx.merge(graphdef, {**params, 'dictionary': dictionary})
    m.relax_temperature, m.relax_hard = TAU, hard
    return (m(u_BxLxD) * weights_BxLxD).sum()

  got = jax.grad(loss)(params['dictionary'], True)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert float(jnp.abs(want).max()) > 1e-3  # The test sees a gradient.
  # The fully relaxed forward has another gradient (its P is not hard).
  relaxed = jax.grad(loss)(params['dictionary'], False)
  assert float(jnp.abs(relaxed - want).max()) > 1e-3
  # The hard P is what evaluation hardens: the column argmax of M_t.
  np.testing.assert_array_equal(
    p_hard.argmax(-2), column_argmax(mixer.mixture(u_BxLxD))
  )


def test_relax_hard_schedule_and_checks():
  c = cfgs.get_config('pdssm,s3,smoke')
  assert c.model.relax_hard_from == 1.0  # Default: never.
  c.model.relax = 'sinkhorn'
  c.train.num_steps = 100
  assert not any(st_task.relax_hard(c, s) for s in range(100))
  assert next(st_task._train_batches(c, 0, 99))['relax_hard'].max() == 0
  c.model.relax_hard_from = 0.25
  assert not st_task.relax_hard(c, 24) and st_task.relax_hard(c, 25)
  np.testing.assert_array_equal(
    next(st_task._train_batches(c, 0, 30))['relax_hard'], 1
  )
  c.model.relax_hard_from = 0.0
  assert st_task.relax_hard(c, 0)
  c.model.relax_hard_from = 1.5
  with pytest.raises(ConfigError, match='relax_hard_from'):
    st_task.state_tracking_task(c)


def test_relax_normalize_makes_the_relaxation_scale_free():
  mixer = _mixer(relax_normalize=True, harden_temperature=0.05)
  plain = _mixer()
  u_BxLxD, mask_BxL = _inputs()
  m = mixer.mixture(u_BxLxD)
  # Standardised columns: the hardmax of M_t is unchanged ...
  z = mixer._sinkhorn_input(m)
  np.testing.assert_array_equal(column_argmax(z), column_argmax(m))
  np.testing.assert_allclose(z.std(axis=-2), 1.0, rtol=1e-4)
  # ... and shrinking M_t (what a model does to stay soft) changes nothing.
  np.testing.assert_allclose(
    mixer._sinkhorn_input(0.1 * m), z, rtol=1e-4, atol=1e-4
  )
  assert not np.allclose(plain._sinkhorn_input(0.1 * m), z, atol=1e-2)
  graphdef, state = nnx.split(mixer)
  params = nnx.to_pure_dict(state)
  small = nnx.merge(
    graphdef, {**params, 'dictionary': 0.1 * params['dictionary']}
  )
  for m_ in (mixer, small):
    m_.relax_temperature = TAU
  np.testing.assert_allclose(
    small(u_BxLxD, mask_BxL), mixer(u_BxLxD, mask_BxL), rtol=1e-4, atol=1e-4
  )
  # The config key reaches the mixer only with a relaxation.
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.relax_normalize = True
  assert 'relax_normalize' not in dict(
    st_task.classifier_config(c).mixer_kwargs
  )
  c.model.relax = 'sinkhorn'
  assert dict(st_task.classifier_config(c).mixer_kwargs)['relax_normalize']


def test_phase_init_starts_every_phase_at_the_given_turn():
  u_BxLxD, _ = _inputs()
  mixer = _mixer(phase_init=1e-3, magnitude_init=0.99)
  d = mixer.diagonal(u_BxLxD)
  np.testing.assert_allclose(jnp.angle(d), 2 * np.pi * 1e-3, rtol=1e-3)
  np.testing.assert_allclose(jnp.abs(d).mean(), 0.99, atol=0.02)
  # The default init draws phases that differ by token and state.
  assert float(jnp.angle(_mixer().diagonal(u_BxLxD)).std()) > 0.1
  with pytest.raises(ValueError, match='phase_init'):
    _mixer(phase_init=1.0)
  c = cfgs.get_config('pdssm,s3,smoke')
  assert c.model.phase_init == 0.0
  c.model.phase_init = 1e-3
  kwargs = dict(st_task.classifier_config(c).mixer_kwargs)
  assert kwargs['phase_init'] == 1e-3
  c.model.phase_init = 1.5
  with pytest.raises(ConfigError, match='phase_init'):
    st_task.classifier_config(c)
  c.model.phase_init = 1e-3
  c.model.mixer = 'lstm'
  with pytest.raises(ConfigError, match='phase_init'):
    st_task.classifier_config(c)


def test_relax_entropy_weight_adds_the_relaxed_p_entropy_to_the_loss():
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.relax = 'sinkhorn'
  c.model.relax_entropy_weight = 0.5
  assert st_task.relax_entropy_weight(c) == 0.5
  ccfg = st_task.classifier_config(c)
  graphdef, init, _ = st_task.programs(ccfg, True)
  params = init(jax.random.key(0))
  batch = next(st_task._train_batches(c, 0, 0))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  # Jitted, as the training step runs it (the temperature is traced).
  plain, _ = jax.jit(st_task._loss_fn(graphdef, 'last'))(params, None, batch)
  value, aux = jax.jit(st_task._loss_fn(graphdef, 'last', 0.5))(
    params, None, batch
  )
  # The entropy the mixers report, recomputed from their relaxed P_t.
  model = nnx.merge(graphdef, params)
  x = model.embed(batch['tokens'])
  mixer = model.blocks[0].mixer
  u = model.blocks[0].norm1(x) if hasattr(model.blocks[0], 'norm1') else x
  soft = sinkhorn(mixer.mixture(u), batch['relax_tau'][0], 20)
  ent0 = -(soft * jnp.log(soft)).sum(-2).mean()
  assert float(aux['p_entropy']) > float(ent0) > 0  # Every layer adds.
  np.testing.assert_allclose(value, plain + 0.5 * aux['p_entropy'], rtol=1e-5)
  # Zero weight or no relaxation: the loss is unchanged.
  c.model.relax = ''
  assert st_task.relax_entropy_weight(c) == 0.0
  c.model.relax_entropy_weight = -1.0
  with pytest.raises(ConfigError, match='relax_entropy_weight'):
    st_task.relax_entropy_weight(c)


def test_input_init_scale_scales_b():
  u_BxLxD, _ = _inputs()
  base, zero = _mixer(), _mixer(input_init_scale=0.0)
  half = _mixer(input_init_scale=0.5)
  np.testing.assert_array_equal(zero.inputs(u_BxLxD), 0)
  np.testing.assert_allclose(
    half.inputs(u_BxLxD), 0.5 * base.inputs(u_BxLxD), rtol=1e-6
  )
  with pytest.raises(ValueError, match='input_init_scale'):
    _mixer(input_init_scale=-1.0)
  c = cfgs.get_config('pdssm,s3,smoke')
  assert 'input_init_scale' not in dict(
    st_task.classifier_config(c).mixer_kwargs
  )
  c.model.input_init_scale = 0.0
  assert dict(st_task.classifier_config(c).mixer_kwargs)[
    'input_init_scale'
  ] == (0.0)
  c.model.mixer = 'transformer'
  with pytest.raises(ConfigError, match='input_init_scale'):
    st_task.classifier_config(c)


@pytest.mark.parametrize('task, order', [('s3', 6), ('a4', 12), ('a4_gen', 12)])
def test_groups_preset_builds_the_documented_layer(task, order):
  c = cfgs.get_config(f'pdssm,{task},groups')
  assert c.model.num_layers == 1 and c.model.state_size == order  # |G|
  assert c.task.loss_on == 'prefix' and c.task.curriculum_steps > 0
  kwargs = dict(st_task.classifier_config(c).mixer_kwargs)
  assert kwargs['dict_init'] == 'permutation'
  assert kwargs['relax_normalize'] and kwargs['phase_init'] > 0
  assert kwargs['harden_temperature'] == c.model.relax_temperature[1]
  st_task.state_tracking_task(c)  # Every option passes the task's checks.
  # The evaluation layer is the paper's: one-hot P, complex diagonal D.
  ccfg = st_task.classifier_config(c)
  graphdef, init, _ = st_task.programs(ccfg, True)
  model = nnx.merge(graphdef, init(jax.random.key(0)))
  mixer = model.blocks[0].mixer
  u = jax.random.normal(jax.random.key(1), (1, 4, c.model.d_model))
  assert mixer.relax_temperature is None
  assert mixer.transition_indices(u).shape == (1, 4, order)
  assert jnp.iscomplexobj(mixer.diagonal(u))


def test_phase_penalty_adds_the_mean_squared_wrapped_phase():
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.num_layers = 1
  c.model.phase_penalty_weight = 2.0
  with pytest.raises(ConfigError, match='phase_penalty_weight'):
    st_task.relax_phase_weight(c)  # Needs the relaxed forward.
  c.model.relax = 'sinkhorn'
  assert st_task.relax_phase_weight(c) == 2.0
  graphdef, init, _ = st_task.programs(st_task.classifier_config(c), True)
  params = init(jax.random.key(0))
  batch = {
    k: jnp.asarray(v) for k, v in next(st_task._train_batches(c, 0, 0)).items()
  }
  plain, _ = jax.jit(st_task._loss_fn(graphdef, 'last'))(params, None, batch)
  value, aux = jax.jit(st_task._loss_fn(graphdef, 'last', 0.0, 2.0))(
    params, None, batch
  )
  model = nnx.merge(graphdef, params)
  block = model.blocks[0]
  u = block.norm1(model.embed(batch['tokens']))
  phase = jnp.angle(block.mixer.diagonal(u))  # In [-pi, pi].
  np.testing.assert_allclose(aux['phase_sq'], (phase**2).mean(), rtol=1e-4)
  assert float(aux['phase_sq']) > 0.1  # Default init: phases around pi.
  np.testing.assert_allclose(value, plain + 2.0 * aux['phase_sq'], rtol=1e-5)


def test_gumbel_noise_perturbs_the_sinkhorn_input_of_the_relaxed_forward():
  mixer = _mixer(relax_normalize=True)
  u_BxLxD, _ = _inputs()
  graphdef, params = nnx.split(mixer)

  @jax.jit
  def forward(tau, noise, key):
    # Traced, as the training step sets them (nnx keeps no concrete key).
    m = nnx.merge(graphdef, params)
    m.relax_temperature, m.relax_noise, m.relax_key = tau, noise, key
    return m(u_BxLxD)

  key = jax.random.key(3)
  mixer.relax_temperature = TAU
  plain = mixer(u_BxLxD)
  # Zero scale: the plain relaxation.
  np.testing.assert_allclose(
    forward(TAU, 0.0, key), plain, rtol=1e-5, atol=1e-6
  )
  noisy = forward(TAU, 0.7, key)
  assert float(jnp.abs(noisy - plain).max()) > 1e-2
  # The same forward written out: sinkhorn((z(M_t) + 0.7 g) / T), then the
  # dense scan of A_t = P_t D_t and the readout.
  z = mixer._sinkhorn_input(mixer.mixture(u_BxLxD))
  soft = sinkhorn(z + 0.7 * jax.random.gumbel(key, z.shape), TAU, 20)
  d = mixer.diagonal(u_BxLxD)
  h0 = jnp.zeros((2, 6), jnp.complex64).at[:, 0].set(1)
  h, _ = ssm.dense_scan(soft * d[..., None, :], mixer.inputs(u_BxLxD), h0)
  np.testing.assert_allclose(
    noisy, mixer.readout(h, u_BxLxD), rtol=1e-4, atol=1e-5
  )
  # Evaluation (no temperature) never sees the noise.
  mixer.relax_temperature = None
  np.testing.assert_allclose(
    forward(None, 0.7, key), mixer(u_BxLxD), rtol=1e-5, atol=1e-6
  )


def test_relax_noise_schedule_batches_and_checks():
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.relax = 'sinkhorn'
  c.train.num_steps = 100
  c.model.relax_anneal_fraction = 0.5
  assert c.model.relax_noise == 0.0  # Default: off, no noise in the batch.
  assert 'relax_noise' not in next(st_task._train_batches(c, 0, 0))
  c.model.relax_noise = 2.0
  # Linear from 2 at step 0 to 0 at the end of the anneal (step 50).
  got = [st_task.relax_noise(c, s) for s in (0, 25, 50, 80)]
  np.testing.assert_allclose(got, [2.0, 1.0, 0.0, 0.0])
  np.testing.assert_allclose(
    next(st_task._train_batches(c, 0, 25))['relax_noise'], 1.0
  )
  # The training loss draws fresh noise from the step's key.
  graphdef, init, _ = st_task.programs(st_task.classifier_config(c), True)
  params = init(jax.random.key(0))
  batch = {
    k: jnp.asarray(v) for k, v in next(st_task._train_batches(c, 0, 0)).items()
  }
  loss = jax.jit(st_task._loss_fn(graphdef, 'last'))
  a, _ = loss(params, jax.random.key(1), batch)
  b, _ = loss(params, jax.random.key(2), batch)
  again, _ = loss(params, jax.random.key(1), batch)
  assert float(a) == float(again) and abs(float(a) - float(b)) > 1e-6
  c.model.relax_noise = -1.0
  with pytest.raises(ConfigError, match='relax_noise'):
    st_task.state_tracking_task(c)
  c.model.relax_noise, c.model.relax = 1.0, ''
  with pytest.raises(ConfigError, match='relax_noise'):
    st_task.state_tracking_task(c)


def test_dict_init_scale_shrinks_the_dictionary_not_the_layer():
  u_BxLxD, mask_BxL = _inputs()
  kw = dict(dict_init='permutation', relax_normalize=True)
  base = _mixer(**kw, harden_temperature=0.05)
  small = _mixer(**kw, harden_temperature=0.05, dict_init_scale=0.1)
  np.testing.assert_allclose(
    small.dictionary[...], 0.1 * base.dictionary[...], rtol=1e-6
  )
  # The same hardened maps and the same evaluation layer ...
  np.testing.assert_array_equal(
    small.transition_indices(u_BxLxD), base.transition_indices(u_BxLxD)
  )
  np.testing.assert_allclose(
    small(u_BxLxD, mask_BxL), base(u_BxLxD, mask_BxL), rtol=1e-5, atol=1e-6
  )
  # ... and the same normalised relaxation (up to the epsilon of the
  # standardisation, relatively 10x larger on the small dictionary).
  for m in (base, small):
    m.relax_temperature = TAU
  np.testing.assert_allclose(
    small(u_BxLxD, mask_BxL), base(u_BxLxD, mask_BxL), rtol=1e-3, atol=1e-4
  )
  with pytest.raises(ValueError, match='dict_init_scale'):
    _mixer(dict_init_scale=0.0)
  c = cfgs.get_config('pdssm,s3,smoke')
  assert 'dict_init_scale' not in dict(
    st_task.classifier_config(c).mixer_kwargs
  )
  c.model.dict_init_scale = 0.1
  kwargs = dict(st_task.classifier_config(c).mixer_kwargs)
  assert kwargs['dict_init_scale'] == 0.1
  c.model.dict_init_scale = -1.0
  with pytest.raises(ConfigError, match='dict_init_scale'):
    st_task.classifier_config(c)
  c.model.dict_init_scale, c.model.mixer = 0.1, 'complex_diag'
  with pytest.raises(ConfigError, match='dict_init_scale'):
    st_task.classifier_config(c)
