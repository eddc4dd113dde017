"""Samplers for uniform-state / interpolating diffusion, Psi and LOO Gibbs.

The networks are EXACT: for a tiny joint P over V^L sequences (V = 3, L <=
3) the denoiser p(x^i | z_t) and the LOO posterior p(x^i | z_t^{-i}) are
computed by enumeration of every x under q(z | x) = alpha [z = x] + (1 -
alpha) pi_z, independently of the process code. Distribution tests compare
an empirical histogram of n samples with a law computed in numpy: its total
variation from the true law has, for n draws over K states, expectation
about 0.5 sum_k sqrt(2 p_k (1 - p_k) / (pi n)) (the mean absolute deviation
of a binomial count), ~0.01 for n = 10000 and K = 9; the tests allow
`tv_tolerance`, a bound an exact sampler exceeds with probability <= 1e-4
(~0.034 here), plus the exactly computed bias of the chain where it has
one. Laws that the tests tell apart differ by more (e.g. 0.08).
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import (
  Autoregressive,
  InterpolatingDiffusion,
  MaskedDiffusion,
  UniformDiffusion,
  get_schedule,
)
from ddlm_jax.sampling.base import check_family
from ddlm_jax.sampling.common import initial_state, process_family
from ddlm_jax.sampling.psi import PsiSampler, psi_kappas, time_grid
from ddlm_jax.sampling.registry import (
  get_sampler,
  parse_spec,
  sampler_from_config,
  samplers_for,
)
from ddlm_jax.sampling.uniform import gibbs_probs, gibbs_step, log_margin

V = 3
EPS = 1e-3  # The log-linear schedule: alpha(t) = 1 - (1 - EPS) t.
SCHEDULE = get_schedule('loglinear')
MIXING = 0.5
N = 10000


def alpha(t):
  return 1.0 - (1.0 - EPS) * np.asarray(t, np.float64)


def make_joint(length: int, seed: int = 0):
  """(X_KxL, P_K): every sequence and a correlated, positive joint."""
  xs = np.array(list(itertools.product(range(V), repeat=length)), np.int32)
  logits = 1.5 * np.random.default_rng(seed).normal(size=len(xs))
  p = np.exp(logits)
  return xs, p / p.sum()


def noise_pi(family: str) -> np.ndarray:
  """pi over the V + 1 ids (mask last) of each family."""
  mixing = {'uniform': 1.0, 'interpolating': MIXING, 'masked': 0.0}[family]
  return np.r_[np.full(V, mixing / V), 1.0 - mixing]


def make_process(family: str, parameterization: str = 'denoiser'):
  if family == 'uniform':
    return UniformDiffusion(
      SCHEDULE, vocab_size=V, parameterization=parameterization
    )
  if family == 'interpolating':
    return InterpolatingDiffusion(
      SCHEDULE, vocab_size=V, mixing=MIXING, parameterization=parameterization
    )
  return MaskedDiffusion(SCHEDULE, vocab_size=V)


class ExactModel:
  """Exact denoiser (loo=False) or LOO posterior of the joint, as logits.

  With count=True it counts its executed calls and checks that it never
  sees an id it cannot embed (the generate id V of a uniform process).
  """

  def __init__(self, family, length, loo=False, count=False, seed=0):
    self.xs, self.p = make_joint(length, seed)
    self.pi = noise_pi(family)
    self.max_id = V - 1 if family == 'uniform' else V
    self.loo, self.count = loo, count
    self.calls = self.bad_inputs = 0

  def _count(self, z):
    self.calls += 1
    self.bad_inputs += int((np.asarray(z) > self.max_id).sum())

  def __call__(self, z_BxL, t_B):
    if self.count:
      jax.debug.callback(self._count, z_BxL)
    xs = jnp.asarray(self.xs)  # [K, L]
    length = xs.shape[1]
    a_B = SCHEDULE.alpha(t_B)[:, None, None]
    pi_z = jnp.asarray(self.pi, jnp.float32)[z_BxL][..., None]  # [B, L, 1]
    same = z_BxL[:, :, None] == xs.T[None]  # [B, L, K]
    lik_BxLxK = a_B * same + (1.0 - a_B) * pi_z
    ok = lik_BxLxK > 0
    loglik = jnp.where(ok, jnp.log(jnp.where(ok, lik_BxLxK, 1.0)), -jnp.inf)
    logp_K = jnp.log(jnp.asarray(self.p, jnp.float32))
    onehot_KxLV = jax.nn.one_hot(xs, V).reshape(len(self.p), length * V)
    if self.loo:  # Position i's own likelihood left out: sum over j != i.
      others = ~jnp.eye(length, dtype=bool)[None, :, :, None]  # [1, i, j, 1]
      rest = jnp.sum(jnp.where(others, loglik[:, None], 0.0), axis=2)
      post_BxLxK = jax.nn.softmax(logp_K + rest, axis=-1)
      probs = jnp.einsum('blk,klv->blv', post_BxLxK, onehot_KxLV.reshape(
        len(self.p), length, V))  # fmt: skip
    else:
      post_BxK = jax.nn.softmax(logp_K + loglik.sum(1), axis=-1)
      probs = (post_BxK @ onehot_KxLV).reshape(-1, length, V)
    return jnp.log(jnp.maximum(probs, 1e-30))


def exact_probs(family, length, z_BxL, t, loo=False) -> np.ndarray:
  """ExactModel's probabilities in float64 numpy (no compilation)."""
  xs, p = make_joint(length)
  pi = noise_pi(family)
  a = alpha(t)
  z_BxL = np.asarray(z_BxL)
  lik_BxLxK = a * (z_BxL[:, :, None] == xs.T[None]) + (1 - a) * pi[z_BxL][
    ..., None
  ]  # fmt: skip
  onehot_KxLxV = np.eye(V)[xs]
  if loo:
    out = np.zeros(z_BxL.shape + (V,))
    for i in range(length):
      w = p * np.prod(np.delete(lik_BxLxK, i, axis=1), axis=1)
      w /= w.sum(-1, keepdims=True)
      out[:, i] = w @ onehot_KxLxV[:, i]
    return out
  w = p * np.prod(lik_BxLxK, axis=1)
  w /= w.sum(-1, keepdims=True)
  return np.einsum('bk,klv->blv', w, onehot_KxLxV)


def histogram(tokens_BxL, num_ids=V) -> np.ndarray:
  tokens_BxL = np.asarray(tokens_BxL)
  length = tokens_BxL.shape[1]
  assert tokens_BxL.min() >= 0 and tokens_BxL.max() < num_ids
  index = tokens_BxL @ (num_ids ** np.arange(length - 1, -1, -1))
  counts = np.bincount(index, minlength=num_ids**length)
  return counts / counts.sum()


def tv(p, q) -> float:
  return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def tv_tolerance(p, n: int, delta: float = 1e-4) -> float:
  """A bound that an exact sampler's TV exceeds with probability <= delta.

  E[TV] <= 0.5 sum_k sqrt(p_k (1 - p_k) / n) (Jensen on each |count
  deviation|), and TV moves by at most 1/n when one sample changes, so
  McDiarmid gives P(TV >= E[TV] + e) <= exp(-2 n e^2). For n = 10000 and
  K = 9: 0.0123 + 0.0215 (the normal approximation of E[TV] is 0.0099).
  """
  p = np.asarray(p)
  mean = 0.5 * float(np.sum(np.sqrt(p * (1 - p) / n)))
  return mean + math.sqrt(math.log(1 / delta) / (2 * n))


def chain_law(family: str, length: int, num_steps: int) -> np.ndarray:
  """Exact law of the T-step factorised ancestral chain, over V^L.

  Built from Bayes' rule through the transition, q(z_s | z_t, x) = q(z_t |
  z_s) q(z_s | x) / q(z_t | x) with q(z_t | z_s) = a_ts [z_t = z_s] + (1 -
  a_ts) pi_{z_t}, mixed over the exact denoiser, the last step drawing from
  the denoiser itself; starts from the prior q(z_1 | uniform x).
  """
  xs, p = make_joint(length)
  pi = noise_pi(family)
  ids = V if family == 'uniform' else V + 1
  zs = np.array(list(itertools.product(range(ids), repeat=length)))

  def lik(z, x, a):  # [..., ] q(z | x) elementwise
    return a * (z == x) + (1 - a) * pi[z]

  prior = np.mean([lik(np.arange(ids), x, alpha(1.0)) for x in range(V)], 0)
  law = np.prod(prior[zs], axis=1)
  t = 1.0 - np.arange(num_steps + 1) / num_steps
  w_ids = np.arange(ids)
  for i in range(num_steps):
    a_t = alpha(t[i])
    a_s = 1.0 if i == num_steps - 1 else alpha(t[i + 1])
    a_ts = a_t / a_s
    # Denoiser of every state: [Z, L, V].
    lik_ZxKxL = lik(zs[:, None, :], xs[None], a_t)
    post_ZxK = p * np.prod(lik_ZxKxL, axis=2)
    post_ZxK /= post_ZxK.sum(1, keepdims=True)
    den = np.einsum('zk,klv->zlv', post_ZxK, np.eye(V)[xs])
    step = np.zeros((len(zs), length, ids))
    for x in range(V):
      # [Z, L, W]: q(z_s = w | z_t, x).
      trans = a_ts * (zs[..., None] == w_ids) + (1 - a_ts) * pi[zs][..., None]
      q = trans * lik(w_ids, x, a_s) / lik(zs, x, a_t)[..., None]
      step += den[..., x : x + 1] * q
    # move[z, z'] = prod_l step[z, l, z'_l].
    move = np.prod([step[:, j][:, zs[:, j]] for j in range(length)], 0)
    law = law @ move
  data = np.all(zs < V, axis=1)
  assert abs(law[data].sum() - 1.0) < 1e-9
  return law[data]


@functools.cache
def _sample_fn(spec, family, length, batch, loo=False, param='denoiser'):
  name, params = parse_spec(spec)
  sampler = get_sampler(name, **params)
  model = ExactModel(family, length, loo=loo, count=True)
  process = make_process(family, param)

  @jax.jit
  def run(key, prompt):
    return sampler(
      model, key, process, batch=batch, length=length, prompt_BxL=prompt
    )

  return run, model


def sample(spec, family, length, batch, seed=0, prompt=None, **kw):
  """(tokens, reported nfe, model) of one jitted run (compiled once)."""
  run, model = _sample_fn(spec, family, length, batch, **kw)
  model.calls = model.bad_inputs = 0
  tokens, nfe = run(jax.random.key(seed), prompt)
  jax.effects_barrier()
  assert model.bad_inputs == 0
  return np.asarray(tokens), int(nfe), model


# The interpolating variants repeat the uniform checks on V + 1 ids; they
# are marked slow to keep this file's default run short.
FAMILIES = ['uniform', pytest.param('interpolating', marks=pytest.mark.slow)]
ALL_FAMILIES = ['masked', *FAMILIES]


# Ancestral sampling matches the exact chain and, with many steps, the joint.


@pytest.mark.parametrize('family', FAMILIES)
def test_uniform_ancestral_matches_exact_chain_and_joint(family):
  _, joint = make_joint(2)
  # Four steps: far from the joint (TV ~0.07-0.08), so the histogram must
  # match the chain's own law, the last (noise-removal) step included.
  law4 = chain_law(family, 2, 4)
  assert tv(law4, joint) > 0.05
  tokens, nfe, model = sample('uniform_ancestral:num_steps=4', family, 2, N)
  assert nfe == model.calls == 4
  assert tv(histogram(tokens), law4) < tv_tolerance(law4, N)
  # 32 steps: the chain's bias (~0.3 / T) is about the sampling floor.
  law = chain_law(family, 2, 32)
  bias = tv(law, joint)
  assert bias < 0.011
  tokens, nfe, _ = sample('uniform_ancestral:num_steps=32', family, 2, N, 1)
  assert nfe == 32
  assert tv(histogram(tokens), joint) < bias + tv_tolerance(joint, N)


# Psi: kappa = 1 is ancestral; the corrector term; kappa schedules.


@pytest.mark.parametrize('family', FAMILIES)
def test_psi_with_kappa_one_equals_uniform_ancestral(family):
  """Same key, same tokens (the 4-step run of the test above)."""
  base, _, _ = sample('uniform_ancestral:num_steps=4', family, 2, N)
  tokens, nfe, _ = sample('psi:num_steps=4,kappa=ancestral', family, 2, N)
  np.testing.assert_array_equal(tokens, base)
  assert nfe == 4
  tokens, _, _ = sample('loo_gibbs:num_steps=4,corrector_steps=0', family, 2, N)
  np.testing.assert_array_equal(tokens, base)
  tokens, _, _ = sample('psi:num_steps=4,kappa=pc', family, 2, N)
  assert (tokens != base).mean() > 0.1  # The corrector term does act.
  eta0 = PsiSampler(num_steps=4, eta=0.0).kappa_schedule(make_process(family))
  np.testing.assert_array_equal(eta0[1], 1.0)  # max_capped_eta at eta = 0.


def _masked_prompt(batch, length):
  prompt = np.full((batch, length), V, np.int32)
  prompt[:, 0] = 1
  prompt[::2, 2] = 0
  return jnp.asarray(prompt)


MASKED_STEPS = 12


def test_psi_on_masked_with_kappa_one_equals_ancestral():
  prompt = _masked_prompt(64, 4)
  anc, _, _ = sample(
    f'ancestral:num_steps={MASKED_STEPS},use_cache=False',
    'masked',
    4,
    64,
    prompt=prompt,
  )
  psi, nfe, model = sample(
    f'psi:num_steps={MASKED_STEPS},kappa=ancestral',
    'masked',
    4,
    64,
    prompt=prompt,
  )
  np.testing.assert_array_equal(psi, anc)
  assert nfe == model.calls == MASKED_STEPS


@pytest.mark.slow
def test_psi_max_capped_on_masked_equals_remdm():
  """eta = 0.05 <= 1 - alpha_s at every step but the last (>= 1/12): kappa
  is not clipped, so psi max_capped_eta is ReMDM's cap schedule exactly."""
  prompt = _masked_prompt(64, 4)
  rem, _, _ = sample(
    f'remdm:num_steps={MASKED_STEPS},eta=0.05', 'masked', 4, 64, prompt=prompt
  )
  psi, _, _ = sample(
    f'psi:num_steps={MASKED_STEPS},eta=0.05', 'masked', 4, 64, prompt=prompt
  )
  np.testing.assert_array_equal(psi, rem)
  anc, _, _ = sample(
    f'ancestral:num_steps={MASKED_STEPS},use_cache=False',
    'masked',
    4,
    64,
    prompt=prompt,
  )
  assert (rem != anc).any()  # eta = 0.05 does remask.


@pytest.mark.parametrize('family', ALL_FAMILIES)
def test_psi_is_exact_for_one_position_at_any_kappa(family):
  """With L = 1 the denoiser is the exact posterior, so both mixture terms
  map p_t to p_s exactly: any kappa gives the data law, even with T = 4
  (the pure corrector at the first step, max_capped_eta with eta = 0.3 at
  the next two). A wrong alpha_s or pi in the corrector term would not."""
  _, p1 = make_joint(1)
  spec = 'psi:num_steps=4,high=pc,eta=0.3,phase_bounds=(0.8,0.4)'
  assert list(PsiSampler(**parse_spec(spec)[1]).kappa_schedule(
    make_process(family))[1][[0, 3]]) == [0, 1]  # fmt: skip
  tokens, _, _ = sample(spec, family, 1, N)
  assert tv(histogram(tokens), p1) < tv_tolerance(p1, N)


class LastInput(ExactModel):
  """The exact model, remembering the state and time of its last call."""

  def _keep(self, z, t):
    self.last = (np.asarray(z), np.asarray(t))

  def __call__(self, z_BxL, t_B):
    jax.debug.callback(self._keep, z_BxL, t_B)
    return super().__call__(z_BxL, t_B)


@pytest.mark.parametrize('family', ALL_FAMILIES)
def test_psi_invariants_prompt_loop_and_greedy_tail(family):
  """Valid ids, fixed prompt, NFE, the network never sees V (uniform), and
  the greedy tail returns argmax p(x | z) of the last state the network saw
  (the exact masked denoiser carries revealed tokens, so at every position)."""
  batch, length, steps = 64, 3, 9
  keep = np.zeros((batch, length), bool)
  keep[:, 1] = True
  keep[::3, 2] = True
  tokens0 = np.tile(np.array([[2, 0, 1]], np.int32), (batch, 1))
  prompt = (jnp.asarray(tokens0), jnp.asarray(keep))
  sampler = get_sampler(
    'psi',
    num_steps=steps,
    time_profile='loop',
    phase_bounds=(0.6, 0.2),
    high='ancestral',
    middle='constant_eta:0.3',
    low='max_rescale_eta:0.5',
    greedy_tail=True,
  )
  model = LastInput(family, length, count=True)
  process = make_process(family)
  tokens, nfe = jax.jit(
    lambda key: sampler(
      model, key, process, batch=batch, length=length, prompt_BxL=prompt
    )
  )(jax.random.key(5))
  jax.effects_barrier()
  tokens = np.asarray(tokens)
  assert tokens.min() >= 0 and tokens.max() < V  # No mask, no V left.
  np.testing.assert_array_equal(tokens[keep], tokens0[keep])
  assert int(nfe) == model.calls == steps and model.bad_inputs == 0
  z, t = model.last
  np.testing.assert_allclose(t, sampler.kappa_schedule(process)[0][-2])
  best = np.argmax(exact_probs(family, length, z, float(t[0])), -1)
  np.testing.assert_array_equal(tokens, best)


def test_plugin_tail_reads_the_loo_probabilities_as_the_denoiser():
  """tail='plugin' + greedy: the argmax of the LOO probabilities at the last
  state (what a sampler does with a plug-in-NELBO network's raw output);
  the default tail takes the denoiser's argmax. At the last, low-noise step
  the LOO ignores the current token, so the two differ."""
  batch, length = 256, 3
  process = make_process('uniform')
  outs = {}
  for tail in ('denoiser', 'plugin'):
    sampler = get_sampler(
      'uniform_ancestral', num_steps=6, greedy_tail=True, tail=tail
    )
    model = LastInput('uniform', length)
    tokens, _ = jax.jit(
      lambda key, sampler=sampler, model=model: sampler(
        model, key, process, batch=batch, length=length
      )
    )(jax.random.key(3))
    jax.effects_barrier()
    z, t = model.last
    logits = model(jnp.asarray(z), jnp.asarray(t))
    source = (
      process.loo_log_probs if tail == 'plugin' else process.denoiser_log_probs
    )
    expect = np.argmax(np.asarray(source(logits, jnp.asarray(z), t)), -1)
    np.testing.assert_array_equal(np.asarray(tokens), expect)
    outs[tail] = np.asarray(tokens)
  assert (outs['denoiser'] != outs['plugin']).any()
  with pytest.raises(ValueError, match='tail='):
    get_sampler('uniform_ancestral', tail='loo')


def test_kappa_rules_closed_forms():
  a_t = np.array([0.2, 0.5, 0.9])
  a_s = np.array([0.4, 0.6, 0.95])
  room = 1 - a_s
  np.testing.assert_array_equal(psi_kappas('ancestral', 0.1, a_s, a_t), 1)
  np.testing.assert_array_equal(psi_kappas('pc', 0.1, a_s, a_t), 0)
  np.testing.assert_allclose(psi_kappas('constant_kappa', 0.3, a_s, a_t), 0.3)
  eta = 0.04
  capped = np.minimum(eta, room / a_t)
  np.testing.assert_allclose(
    psi_kappas('max_capped_eta', eta, a_s, a_t), 1 - capped / room
  )
  rescale = 0.5 * np.minimum(1.0, room / a_t)
  np.testing.assert_allclose(
    psi_kappas('max_rescale_eta', 0.5, a_s, a_t),
    np.clip(1 - rescale / room, 0, 1),
  )
  np.testing.assert_allclose(
    psi_kappas('constant_eta', 0.1, a_s, a_t), np.clip(1 - 0.1 / room, 0, 1)
  )
  assert psi_kappas('constant_eta', 0.1, a_s, a_t)[2] == 0.0  # Clipped.
  np.testing.assert_array_equal(  # Nothing left to mix: alpha_s = 1.
    psi_kappas('constant_eta', 0.1, np.ones(1), np.full(1, 0.9)), 1
  )


def test_psi_time_profiles_and_phases():
  t, phase = time_grid(10, 'linear', 0.7, 0.2)
  np.testing.assert_allclose(t, 1 - np.arange(11) / 10)
  # Start times 1, .9, .8 > .7: high; .7 ... .3: middle; .2, .1: low.
  np.testing.assert_array_equal(phase, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
  t, phase = time_grid(20, 'loop', 0.55, 0.05)
  assert t[0] == 1 and t[-1] == 0 and len(t) == 21
  held = np.flatnonzero(phase == 1)
  np.testing.assert_allclose(t[held], 0.55)
  np.testing.assert_allclose(t[held + 1], 0.55)  # s = t in the loop.
  assert len(held) == 10 and (np.diff(t) <= 0).all()
  sampler = PsiSampler(
    num_steps=10, kappa='pc', high='ancestral', phase_bounds=(0.7, 0.2)
  )
  t, kappa = sampler.kappa_schedule(make_process('uniform'))
  np.testing.assert_array_equal(kappa, [1, 1, 1, 0, 0, 0, 0, 0, 0, 1])


# The LOO Gibbs corrector.


@functools.cache
def _gibbs_chain(length, k, select, batch):
  model = ExactModel('uniform', length, loo=True)
  process = make_process('uniform', 'loo')
  free = jnp.ones((batch, length), bool)

  @jax.jit
  def run(key, z, t, steps):
    def body(i, z):
      key_i = jax.random.fold_in(key, i)
      t_B = jnp.full((batch,), t)
      return gibbs_step(model, key_i, process, z, t_B, free, k=k, select=select)

    return jax.lax.fori_loop(0, steps, body, z)

  return run


def marginal_at(t, length=2):
  """p_t(z) = sum_x P(x) prod_l q(z_l | x_l) (uniform process)."""
  xs, p = make_joint(length)
  a = alpha(t)
  lik = a * (xs[:, None, :] == xs[None]) + (1 - a) / V  # [Z, K, L]
  return np.prod(lik, -1) @ p


def test_random_scan_gibbs_is_invariant_and_converges():
  """k = 1, random positions: exact Gibbs. It keeps the data law (t = 0)
  and, from the point mass on 00, reaches p_t: so its conditional is the
  marginal's (an identity map would pass the first check, not the second)."""
  xs, p = make_joint(2)
  run = _gibbs_chain(2, 1, 'random', N)
  idx = np.random.default_rng(1).choice(len(xs), size=N, p=p)
  out = run(jax.random.key(0), jnp.asarray(xs[idx]), 0.0, 5)
  assert tv(histogram(out), p) < tv_tolerance(p, N)
  target = marginal_at(0.4)
  start = jnp.zeros((N, 2), jnp.int32)
  assert tv(histogram(start), target) > 0.5
  out = run(jax.random.key(1), start, 0.4, 30)
  # The exact law after 30 random-scan steps, e_00 G^30, is within 1e-6 of
  # p_t; G[z, z'] = mean_i [z'^{-i} = z^{-i}] p_t(z'^i | z^{-i}).
  zs = np.array(list(itertools.product(range(V), repeat=2)))
  same_rest = [zs[:, None, 1 - i] == zs[None, :, 1 - i] for i in range(2)]
  cond = [target[None, :] * same_rest[i] for i in range(2)]
  kernel = sum(c / c.sum(1, keepdims=True) for c in cond) / 2
  law = np.linalg.matrix_power(kernel, 30)[0]
  assert tv(law, target) < 1e-6
  assert tv(histogram(out), law) < tv_tolerance(law, N)


def test_margin_selection_and_loo_temperature():
  length, batch, t = 3, 512, 0.4
  model = ExactModel('uniform', length, loo=True)
  process = make_process('uniform', 'loo')
  z = jax.random.randint(jax.random.key(0), (batch, length), 0, V)
  t_B = jnp.full((batch,), t)
  free = jnp.ones((batch, length), bool).at[:, 2].set(False)
  out = jax.jit(lambda key: gibbs_step(model, key, process, z, t_B, free, k=1))(
    jax.random.key(1)
  )
  # By hand: conditional = alpha LOO + (1 - alpha) / V; the lowest margin.
  loo = exact_probs('uniform', length, z, t, loo=True)
  cond = alpha(t) * loo + (1 - alpha(t)) / V
  zn = np.asarray(z)
  cur = np.take_along_axis(cond, zn[..., None], -1)[..., 0]
  other = np.where(np.eye(V, dtype=bool)[zn], 0, cond).max(-1)
  margin = np.log(cur) - np.log(other)
  changed = np.asarray(out) != zn
  assert changed.sum(-1).max() <= 1 and changed[:, 2].sum() == 0
  rows = changed.any(-1)
  assert rows.mean() > 0.2
  np.testing.assert_array_equal(
    np.argmax(changed[rows], -1), np.argmin(margin[rows, :2], -1)
  )
  np.testing.assert_allclose(  # The margin helper on the same numbers.
    log_margin(jnp.log(jnp.asarray(cond, jnp.float32)), z), margin, atol=1e-4
  )
  # LOO temperature: the tempered LOO, then the forward mixture.
  logp = jnp.log(jnp.asarray(loo, jnp.float32))
  got = gibbs_probs(process, logp, jnp.full((batch,), 0.7), 0.5)
  sharp = loo**2 / (loo**2).sum(-1, keepdims=True)
  np.testing.assert_allclose(got, 0.7 * sharp + 0.3 / V, rtol=1e-4)


@pytest.mark.slow
def test_loo_gibbs_with_an_exact_loo_network_matches_the_joint():
  """Predictor + random-scan corrector with a network that outputs the LOO
  posterior (parameterization='loo'): the corrector keeps each p_s, so the
  result is within the ancestral chain's bias of the joint. NFE counts the
  corrector calls (C after every step but the last)."""
  _, joint = make_joint(2)
  bias = tv(chain_law('uniform', 2, 32), joint)
  tokens, nfe, model = sample(
    'loo_gibbs:num_steps=32,corrector_steps=1,k=1,select=random',
    'uniform',
    2,
    N,
    loo=True,
    param='loo',
  )
  assert nfe == model.calls == 32 + 31
  assert tv(histogram(tokens), joint) < bias + tv_tolerance(joint, N)


@pytest.mark.parametrize('family', FAMILIES)
def test_loo_gibbs_counts_every_call_and_keeps_the_prompt(family):
  keep = jnp.zeros((32, 3), bool).at[:, 0].set(True)
  prompt = (jnp.full((32, 3), 2, jnp.int32), keep)
  tokens, nfe, model = sample(
    'loo_gibbs:num_steps=5,k=2', family, 3, 32, seed=4, prompt=prompt
  )
  assert nfe == model.calls == 5 + 4 * 2
  assert tokens.min() >= 0 and tokens.max() < V
  assert (tokens[:, 0] == 2).all()


# Families, errors, registry.


def test_process_family_and_prompts():
  assert process_family(make_process('uniform')) == 'uniform'
  assert process_family(make_process('interpolating')) == 'interpolating'
  assert process_family(make_process('masked')) == 'masked'

  class Undeclared:  # Duck-typed: not a ddlm_jax.diffusion.base.Process.
    schedule = SCHEDULE
    mask_id = V
    vocab_size = V

  with pytest.raises(TypeError, match='diffusion.base.Process'):
    process_family(Undeclared())
  uniform = make_process('uniform')
  tokens = jnp.array([[2, 1, 0]])
  keep = jnp.array([[True, False, True]])
  z = initial_state(uniform, 1, 3, (tokens, keep))
  np.testing.assert_array_equal(z, [[2, V, 0]])
  np.testing.assert_array_equal(initial_state(uniform, 1, 3, z), z)
  with pytest.raises(ValueError, match='prompt keep has shape'):
    initial_state(uniform, 1, 3, (tokens, keep[:, :2]))
  with pytest.raises(ValueError, match='prompt_BxL has shape'):
    initial_state(uniform, 2, 3, z)


def test_incompatible_samplers_raise_naming_alternatives():
  uniform, masked = make_process('uniform'), make_process('masked')
  model = ExactModel('uniform', 2)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match='first_hitting applies to masked') as e:
    get_sampler('first_hitting')(model, key, uniform, batch=1, length=2)
  assert "'uniform_ancestral'" in str(e.value) and "'psi'" in str(e.value)
  with pytest.raises(ValueError, match='for a masked process use one of'):
    get_sampler('loo_gibbs')(model, key, masked, batch=1, length=2)
  with pytest.raises(ValueError, match='semi_ar runs masked'):
    get_sampler('semi_ar', inner='uniform_ancestral')
  with pytest.raises(ValueError, match='semi_ar applies to masked'):
    get_sampler('semi_ar', inner='psi')(model, key, uniform, batch=1, length=2)
  with pytest.raises(TypeError, match='autoregressive_sample'):
    get_sampler('psi')(model, key, Autoregressive(V), batch=1, length=2)
  check_family(get_sampler('semi_ar', inner='psi'), masked)
  assert samplers_for('uniform') == ['loo_gibbs', 'psi', 'uniform_ancestral']
  assert 'psi' in samplers_for('masked')
  assert 'uniform_ancestral' not in samplers_for('masked')


def test_spec_strings_and_bad_parameters():
  name, params = parse_spec('psi:kappa=max_capped_eta,eta=0.01')
  sampler = get_sampler(name, **params)
  assert (sampler.kappa, sampler.eta) == ('max_capped_eta', 0.01)
  name, params = parse_spec(
    'psi:num_steps=16,middle=constant_eta:0.02,phase_bounds=(0.9,0.1),'
    'time_profile=loop,greedy_tail=True'
  )
  sampler = get_sampler(name, **params)
  assert sampler.phase_bounds == (0.9, 0.1) and sampler.greedy_tail
  assert sampler.middle == 'constant_eta:0.02'
  name, params = parse_spec('loo_gibbs:k=4,corrector_steps=1,select=random')
  sampler = get_sampler(name, **params)
  assert (sampler.k, sampler.corrector_steps) == (4, 1)
  cfg = {'sampler': 'uniform_ancestral:greedy_tail=True', 'steps': 7}
  sampler = sampler_from_config(cfg)
  assert sampler.num_steps == 7 and sampler.greedy_tail
  with pytest.raises(ValueError, match='kappa rule'):
    get_sampler('psi', kappa='nope')
  with pytest.raises(ValueError, match='kappa rule'):
    get_sampler('psi', low='max_capped:0.1')
  with pytest.raises(ValueError, match='eta must be in'):
    get_sampler('psi', middle='constant_eta:2')
  with pytest.raises(ValueError, match='loop needs 0 < t_lo < t_hi < 1'):
    get_sampler('psi', time_profile='loop')
  with pytest.raises(ValueError, match='t_lo must be in'):
    get_sampler('psi', phase_bounds=(0.3, 0.5))
  with pytest.raises(ValueError, match='select='):
    get_sampler('loo_gibbs', select='best')
  with pytest.raises(ValueError, match='loo_temperature must be > 0'):
    get_sampler('loo_gibbs', loo_temperature=0)
  with pytest.raises(ValueError, match='k must be an integer'):
    get_sampler('loo_gibbs', k=0)
