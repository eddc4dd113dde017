"""Options that help PD-SSM find permutation solutions (all default off).

- dictionary init 'permutation': every token's hardened P starts as a
  bijection, for any selector output;
- Sinkhorn relaxation: doubly stochastic, tends to the permutation as the
  temperature falls, and a relaxed training forward that the evaluation
  forward (hardmax) does not see;
- length curriculum: the longest training word grows with the step.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.models import ssm
from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training.config import ConfigError
from experiments.configs import state_tracking as cfgs


def _is_bijection(row) -> bool:
  return sorted(np.asarray(row).tolist()) == list(range(len(row)))


def test_permutation_dictionary_columns_never_share_a_row():
  m_KxNxN = np.asarray(ssm.permutation_dictionary(jax.random.key(0), 6, 8))
  assert m_KxNxN.shape == (6, 8, 8)
  # One-hot columns, each a permutation matrix.
  np.testing.assert_array_equal(m_KxNxN.sum(-2), 1)
  np.testing.assert_array_equal(m_KxNxN.sum(-1), 1)
  # In every column the K ones sit in K distinct rows.
  rows_KxN = m_KxNxN.argmax(-2)
  assert all(len(set(rows_KxN[:, j])) == 6 for j in range(8))
  with pytest.raises(ValueError, match='num_dict <= state_size'):
    ssm.permutation_dictionary(jax.random.key(0), 9, 8)


def test_permutation_init_makes_every_token_map_a_bijection():
  mixer = ssm.SSMMixer(
    16, 8, num_dict=8, dict_init='permutation', rngs=nnx.Rngs(0)
  )
  u_BxLxD = 3.0 * jax.random.normal(jax.random.key(1), (4, 32, 16))
  p_BxLxN = np.asarray(mixer.transition_indices(u_BxLxD)).reshape(-1, 8)
  assert all(_is_bijection(r) for r in p_BxLxN)
  # The maps are not all one permutation: the selector picks among K.
  assert len({tuple(r) for r in p_BxLxN.tolist()}) > 1
  # The default random dictionary does not give bijections.
  rand = ssm.SSMMixer(16, 8, num_dict=8, rngs=nnx.Rngs(0))
  p_rand = np.asarray(rand.transition_indices(u_BxLxD)).reshape(-1, 8)
  assert np.mean([_is_bijection(r) for r in p_rand]) < 0.5


def test_dict_init_reaches_the_classifier_and_bad_values_are_refused():
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.dict_init = 'permutation'
  ccfg = st_task.classifier_config(c)
  assert dict(ccfg.mixer_kwargs)['dict_init'] == 'permutation'
  diagnose = st_task.group_diagnostic(c)
  _, init, _ = st_task.programs(ccfg, True)
  res = diagnose(init(jax.random.key(0)))
  assert res['bijective_frac'] == 1.0
  c.model.dict_init = 'identity'
  with pytest.raises(ConfigError, match='dict_init'):
    st_task.classifier_config(c)
  c.model.dict_init = 'permutation'
  c.model.num_dict = c.model.state_size + 1
  with pytest.raises(ConfigError, match='num_dict <= model.state_size'):
    st_task.classifier_config(c)
  lstm = cfgs.get_config('lstm,s3,smoke')
  lstm.model.dict_init = 'permutation'
  with pytest.raises(ConfigError, match='PD-SSM mixers'):
    st_task.classifier_config(lstm)


def test_default_dictionary_is_unchanged():
  a = ssm.SSMMixer(16, 8, rngs=nnx.Rngs(0))
  b = ssm.SSMMixer(16, 8, dict_init='random', rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(a.dictionary[...], b.dictionary[...])
  assert jnp.abs(a.dictionary[...]).sum() > 0


def test_length_curriculum_grows_the_words_and_resumes_exactly():
  from ddlm_jax.data import state_tracking as st

  kw = dict(seed=3, ramp_steps=10, min_len=3, max_len=40)
  batches = list(itertools.islice(st.curriculum_batches('s3', 32, **kw), 12))
  longest = [int(b['lengths'].max()) for b in batches]
  assert longest[0] == 3 and max(longest[:5]) <= 3 + (37 * 4) // 10
  assert longest[-1] > 30  # Full range once the ramp is over.
  assert all(b['tokens'].shape == (32, 40) for b in batches)  # One shape.
  # Labels are the products of the words (checked by the group table).
  table = st.group_table('S3')
  for b in batches[:3]:
    for toks, n, label in zip(b['tokens'], b['lengths'], b['labels']):
      state = 0
      for t in toks[:n]:
        state = table[state, t - 1]
      assert state == label
  # A resumed stream starts at its step with the same batches.
  again = next(st.curriculum_batches('s3', 32, start=7, **kw))
  np.testing.assert_array_equal(again['tokens'], batches[7]['tokens'])
  assert st.curriculum_max_len(5, 3, 40, 0) == 40


def test_curriculum_reaches_the_task_stream_and_is_checked():
  c = cfgs.get_config('pdssm,s3,smoke')
  c.task.curriculum_steps = 100
  lo, hi = c.task.train_lengths
  first = next(st_task._train_batches(c, 0, 0))
  assert int(first['lengths'].max()) == lo
  late = next(st_task._train_batches(c, 0, 100))
  assert first['tokens'].shape == late['tokens'].shape == (16, hi)
  c.task.curriculum_steps = -1
  with pytest.raises(ConfigError, match='curriculum_steps'):
    st_task.state_tracking_task(c)


def test_sinkhorn_is_doubly_stochastic_and_tends_to_the_assignment():
  from ddlm_jax.models.hardmax import sinkhorn

  m_BxNxN = jax.random.normal(jax.random.key(0), (5, 6, 6))
  p = np.asarray(sinkhorn(m_BxNxN, 1.0, num_iters=50))
  np.testing.assert_allclose(p.sum(-2), 1, atol=1e-5)
  np.testing.assert_allclose(p.sum(-1), 1, atol=1e-4)
  assert (p > 0).all()
  # Cold: the permutation maximising sum_j m[p[j], j], by brute force,
  # on matrices whose best assignment is clear (a planted permutation
  # whose column argmax collides with noise elsewhere).
  planted = jax.nn.one_hot(jnp.array([3, 0, 5, 1, 2, 4]), 6, axis=-2)
  m_BxNxN = 0.5 * m_BxNxN + 2.0 * planted
  cold = np.asarray(sinkhorn(m_BxNxN, 0.05, num_iters=200))
  m = np.asarray(m_BxNxN)
  for b in range(5):
    best = max(
      itertools.permutations(range(6)),
      key=lambda q: sum(m[b, q[j], j] for j in range(6)),
    )
    np.testing.assert_array_equal(cold[b].argmax(-2), best)
    assert cold[b].max(-2).min() > 0.9


def test_relaxed_forward_is_dense_and_cold_limit_is_the_hardmax_layer():
  mixer = ssm.SSMMixer(
    16, 8, num_dict=4, dict_init='permutation', rngs=nnx.Rngs(0)
  )
  u_BxLxD = jax.random.normal(jax.random.key(1), (2, 12, 16))
  mask_BxL = jnp.arange(12)[None] < jnp.array([[12], [7]])
  hard = mixer(u_BxLxD, mask_BxL)
  mixer.relax_temperature = 1.0
  warm = mixer(u_BxLxD, mask_BxL)
  assert float(jnp.abs(warm - hard).max()) > 0.1  # Really relaxed.
  # Every mixture's argmax is a permutation here, so the cold Sinkhorn
  # is that permutation and the relaxed layer is the hardmax layer.
  mixer.relax_temperature = 1e-3
  cold = mixer(u_BxLxD, mask_BxL)
  np.testing.assert_allclose(cold, hard, atol=3e-2)

  mixer.relax_temperature = None
  graphdef, params = nnx.split(mixer)

  def loss(tau):
    m = nnx.merge(graphdef, params)  # As the training step does.
    m.relax_temperature = tau
    return m(u_BxLxD, mask_BxL).sum()

  # A traced temperature works (the training step passes one).
  assert np.isfinite(float(jax.jit(loss)(jnp.float32(0.5))))


def test_relax_schedule_and_checks():
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.relax = 'sinkhorn'
  c.train.num_steps = 100
  c.model.relax_anneal_fraction = 0.5
  assert st_task.relax_temperature(c, 0) == pytest.approx(1.0)
  assert st_task.relax_temperature(c, 25) == pytest.approx(0.05**0.5)
  assert st_task.relax_temperature(c, 90) == pytest.approx(0.05)
  b = next(st_task._train_batches(c, 0, 25))
  np.testing.assert_allclose(b['relax_tau'], 0.05**0.5, rtol=1e-6)
  c.model.relax = 'gumbel'
  with pytest.raises(ConfigError, match='model.relax'):
    st_task.state_tracking_task(c)
  c.model.relax = 'sinkhorn'
  c.model.relax_temperature = (0.1, 1.0)
  with pytest.raises(ConfigError, match='T1 <= T0'):
    st_task.state_tracking_task(c)


@pytest.mark.slow
def test_every_candidate_trains_through_the_loop(tmp_path):
  from ddlm_jax.training import metrics

  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.num_layers = 1
  c.model.d_model = c.model.state_size = 8
  c.model.scan_impl = 'reference'
  c.model.dict_init = 'permutation'
  c.model.magnitude_init = 0.95
  c.model.relax = 'sinkhorn'
  c.task.curriculum_steps = 3
  out = str(tmp_path / 'run')
  summary = st_task.train_state_tracking(c, out)
  assert summary['status'] == 'ok' and summary['steps'] == 4
  recs = metrics.read_metrics(out)
  assert all(np.isfinite(r['loss']) for r in recs if r['split'] == 'train')
  val = [r for r in recs if r['split'] == 'validation']
  assert val and all('homomorphism_frac' in r for r in val)


def test_relax_harden_reads_the_sinkhorn_matrix():
  from ddlm_jax.models.hardmax import column_argmax, sinkhorn

  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.relax = 'sinkhorn'
  c.model.relax_harden = True
  kwargs = dict(st_task.classifier_config(c).mixer_kwargs)
  assert kwargs['harden_temperature'] == c.model.relax_temperature[1]
  c.model.relax = ''
  assert 'harden_temperature' not in dict(
    st_task.classifier_config(c).mixer_kwargs
  )
  mixer = ssm.SSMMixer(16, 6, harden_temperature=0.05, rngs=nnx.Rngs(0))
  u_BxLxD = jax.random.normal(jax.random.key(1), (2, 5, 16))
  want = column_argmax(sinkhorn(mixer.mixture(u_BxLxD), 0.05, 20))
  np.testing.assert_array_equal(mixer.transition_indices(u_BxLxD), want)
  with pytest.raises(ValueError, match='harden_temperature'):
    ssm.SSMMixer(16, 6, harden_temperature=0.0, rngs=nnx.Rngs(0))
