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
