"""Sampler library: invariants, NFE accounting, exactness relations.

Every registered sampler runs once under jit on a toy denoiser with a prompt
(prefix + infilling anchor) and a counting/recording wrapper; each compiled
sampler is reused for the invariants, the NFE check and determinism.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling import sweep as sampler_sweep
from ddlm_jax.sampling.common import alpha_inverse, select_top
from ddlm_jax.sampling.registry import (
  SAMPLERS,
  get_sampler,
  parse_spec,
  sampler_from_config,
)
from ddlm_jax.sampling.unmasking import eb_prefix_size

VOCAB, LENGTH, BATCH = 7, 10, 3
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=VOCAB)


class Recorder:
  """Time-free toy denoiser that counts executed calls and records inputs."""

  def __init__(self):
    self.states = []

  def _record(self, z):
    self.states.append(np.asarray(z))

  def __call__(self, z_BxL, t_B):
    del t_B
    jax.debug.callback(self._record, z_BxL)
    pos = jnp.arange(z_BxL.shape[1]) % VOCAB
    base = 1.5 * jax.nn.one_hot(pos, VOCAB)[None]
    # Depends on the state, so a wrongly reused prediction shows.
    shift = jax.nn.one_hot(jnp.sum(z_BxL == VOCAB, -1) % VOCAB, VOCAB)
    return jnp.broadcast_to(base + shift[:, None], z_BxL.shape + (VOCAB,))


def _prompt():
  prompt = np.full((BATCH, LENGTH), VOCAB, np.int32)
  prompt[:, :2] = [3, 4]  # prefix
  prompt[:, 6] = 1  # infilling anchor
  prompt[1, 8] = 2  # rows may differ
  return prompt


SPECS = {
  'ancestral': dict(num_steps=40),  # T >= length: the per-row cache.
  'first_hitting': {},
  'confidence_k': dict(tokens_per_step=3, score='max_prob'),
  'confidence_cos': dict(num_steps=3, schedule='cosine', score='margin'),
  'eb': dict(gamma=0.0),
  'remdm': dict(num_steps=40, eta=0.3),
  'remdm_loop': dict(num_steps=12, eta=0.3, strategy='loop'),
  'semi_ar': dict(
    block_length=4, inner='confidence', inner_params={'tokens_per_step': 2}
  ),  # fmt: skip
  'scheduled': dict(num_steps=40, pattern='light:0.25,heavy:0.5,light:0.25'),
}


def _build(case):
  name = case.split('_')[0] if case not in SAMPLERS else case
  return get_sampler(name, **SPECS[case])


@functools.cache
def _compiled(case):
  sampler = _build(case)
  heavy, light = Recorder(), Recorder()
  apply = (heavy, light) if sampler.num_models == 2 else heavy
  fn = jax.jit(
    lambda key, prompt: sampler(
      apply, key, PROCESS, batch=BATCH, length=LENGTH, prompt_BxL=prompt
    )
  )
  return sampler, fn, heavy, light


def _run(case, seed=0):
  sampler, fn, heavy, light = _compiled(case)
  heavy.states.clear()
  light.states.clear()
  tokens, nfe = fn(jax.random.key(seed), jnp.asarray(_prompt()))
  jax.effects_barrier()
  return sampler, np.asarray(tokens), np.asarray(nfe), heavy, light


@pytest.mark.parametrize('case', sorted(SPECS))
def test_sampler_invariants_nfe_and_determinism(case):
  sampler, tokens, nfe, heavy, light = _run(case)
  prompt = _prompt()
  fixed = prompt != VOCAB
  np.testing.assert_array_equal(tokens[fixed], prompt[fixed])
  assert tokens.min() >= 0 and tokens.max() < VOCAB  # No mask left.
  calls = [len(heavy.states), len(light.states)]
  if sampler.num_models == 2:
    assert list(nfe) == calls
  else:
    assert int(nfe) == calls[0] and calls[1] == 0
  assert nfe.sum() >= 1
  if not sampler.name == 'remdm':
    # Revealed tokens never change between network calls.
    states = heavy.states + light.states
    states = sorted(states, key=lambda s: -(s == VOCAB).sum())
    for before, after in zip(states, states[1:] + [tokens]):
      known = before != VOCAB
      np.testing.assert_array_equal(after[known], before[known])
  again = _run(case)
  np.testing.assert_array_equal(again[1], tokens)
  np.testing.assert_array_equal(again[2], nfe)


def test_eb_with_gamma_zero_reveals_one_token_per_call():
  _, tokens, nfe, rec, _ = _run('eb')
  states = rec.states + [tokens]
  for before, after in zip(states[:-1], states[1:]):
    new = (before == VOCAB) & (after != VOCAB)
    still = (before == VOCAB).any(-1)
    np.testing.assert_array_equal(new.sum(-1), still.astype(int))
  assert int(nfe) == (_prompt() == VOCAB).sum(-1).max()


def test_first_hitting_and_confidence_nfe_counts():
  masked = (_prompt() == VOCAB).sum(-1).max()
  assert int(_run('first_hitting')[2]) == masked
  assert int(_run('confidence_k')[2]) == -(-masked // 3)
  assert int(_run('confidence_cos')[2]) == 3


def test_remdm_with_eta_zero_equals_ancestral_and_eta_matters():
  SPECS['remdm_eta0'] = dict(num_steps=40, eta=0.0)
  base = _run('ancestral')[1]
  np.testing.assert_array_equal(_run('remdm_eta0')[1], base)
  assert (_run('remdm')[1] != base).any()  # eta = 0.3 does remask.


def test_scheduled_with_equal_networks_equals_ancestral():
  """Identical heavy and light nets: the schedule only splits the NFE."""
  _, tokens, nfe, _, _ = _run('scheduled')
  _, base, base_nfe, _, _ = _run('ancestral')
  np.testing.assert_array_equal(tokens, base)
  assert nfe.sum() >= base_nfe and nfe[0] >= 1 and nfe[1] >= 1


def test_cached_ancestral_nfe_is_bounded_by_length():
  _, tokens, nfe, rec, _ = _run('ancestral')
  masked = (_prompt() == VOCAB).sum(-1).max()
  assert 1 <= int(nfe) <= masked < SPECS['ancestral']['num_steps']


def test_eb_prefix_rule_on_hand_made_entropies():
  h = jnp.array([[0.3, 5.0, 0.1, 0.2], [0.3, 5.0, 0.1, 0.2]])
  eligible = jnp.array([[True] * 4, [True, True, False, True]])
  # Row 0 sorted: .1 .2 .3 5: sums without the max 0, .1, .3, .6 -> k = 3.
  # Row 1 sorted: .2 .3 5: 0, .2, .5 -> k = 2.
  np.testing.assert_array_equal(eb_prefix_size(h, eligible, 0.35), [3, 2])
  np.testing.assert_array_equal(eb_prefix_size(h, eligible, 0.0), [1, 1])
  np.testing.assert_array_equal(eb_prefix_size(h, eligible, 1e-3), [1, 1])
  sel = select_top(-h, eligible, jnp.array([3, 2]))
  np.testing.assert_array_equal(
    sel, [[True, False, True, True], [True, False, False, True]]
  )


def test_remdm_grid_matches_the_capped_formula():
  steps, eta = 8, 0.2
  grid = _build('remdm').__class__(num_steps=steps, eta=eta).grid(PROCESS)
  t = 1.0 - np.arange(steps + 1) / steps
  alpha = 1.0 - (1.0 - 1e-3) * t
  a_t, a_s = alpha[:-1], alpha[1:]
  sigma = np.minimum(eta, np.clip((1 - a_s) / a_t, 0, 1))
  sigma[-1] = 0
  p = (a_s - (1 - sigma) * a_t) / (1 - a_t)
  p[-1] = 1
  np.testing.assert_allclose(grid.sigma, sigma, rtol=1e-5)
  np.testing.assert_allclose(grid.p_unmask, p, rtol=1e-5, atol=1e-7)
  anc = grid_lib.make_grid(PROCESS, grid_lib.uniform_times(steps))
  assert not anc.remasks and (anc.sigma == 0).all()


@pytest.mark.parametrize('name', ['loglinear', 'cosine', 'linear'])
def test_alpha_inverse(name):
  schedule = get_schedule(name)
  t = jnp.linspace(0.05, 0.95, 7)
  np.testing.assert_allclose(
    alpha_inverse(schedule, schedule.alpha(t)), t, atol=1e-5
  )


def test_registry_errors_and_specs():
  with pytest.raises(ValueError, match='unknown sampler'):
    get_sampler('nope')
  with pytest.raises(ValueError, match='does not take'):
    get_sampler('eb', num_steps=3)
  with pytest.raises(ValueError, match='temperature'):
    get_sampler('ancestral', temperature=0.0)
  with pytest.raises(ValueError, match='fractions must sum'):
    get_sampler('scheduled', pattern='light:0.5,heavy:0.2')
  with pytest.raises(TypeError, match='tuple of 2'):
    get_sampler('scheduled')(Recorder(), jax.random.key(0), PROCESS,
                             batch=1, length=4)  # fmt: skip
  with pytest.raises(ValueError, match='prompt_BxL has shape'):
    get_sampler('eb')(Recorder(), jax.random.key(0), PROCESS, batch=2,
                      length=4, prompt_BxL=jnp.zeros((2, 5), int))  # fmt: skip
  name, params = parse_spec('semi_ar:block_length=8,inner=eb,inner.gamma=0.5')
  assert name == 'semi_ar' and params['inner_params'] == {'gamma': 0.5}
  cfg = {'sampler': 'confidence:score=margin', 'steps': 9, 'top_k': 0,
         'use_cache': True, 'temperature': 0.8, 'params': {}}  # fmt: skip
  sampler = sampler_from_config(cfg)
  assert (sampler.num_steps, sampler.score, sampler.temperature) == (
    9,
    'margin',
    0.8,
  )


def test_semi_ar_inner_sampler_errors():
  """semi_ar builds its inner sampler without the registry, same errors."""
  with pytest.raises(ValueError, match='unknown sampler'):
    get_sampler('semi_ar', inner='nope')
  with pytest.raises(ValueError, match='does not take'):
    get_sampler('semi_ar', inner='eb', inner_params={'num_steps': 3})
  with pytest.raises(ValueError, match='cannot nest'):
    get_sampler('semi_ar', inner='semi_ar')
  with pytest.raises(ValueError, match='needs one network'):
    get_sampler('semi_ar', inner='scheduled')
  sampler = get_sampler('semi_ar', inner='eb', inner_params={'gamma': 0.5})
  assert sampler.inner_sampler == get_sampler('eb', gamma=0.5)


def test_sweep_expands_open_parameters():
  entries = sampler_sweep.expand_specs(
    ['ancestral', ' eb', 'eb:gamma=1', 'semi_ar:block_length=8', ''],
    steps=[16, 32],
    gammas=[0.0, 0.5],
    length=32,
  )
  sampler_sweep.label_entries(entries)
  assert [e['label'] for e in entries] == [
    'ancestral num_steps=16',
    'ancestral num_steps=32',
    'eb gamma=0.0',
    'eb gamma=0.5',
    'eb gamma=1',
    "semi_ar block_length=8 inner_params={'num_steps': 4}",
    "semi_ar block_length=8 inner_params={'num_steps': 8}",
  ]
  for e in entries:
    get_sampler(e['name'], **e['params'])
