"""The full masked-diffusion bound, by exact enumeration.

Toy data: a full-support distribution p over V^L (V = 2, 3; L = 1, 2). The
exact denoiser puts log p(x_l | visible tokens of z) at every masked
position (time-free, as the optimal masked denoiser is). For it:

* the library's expected NELBO, E_t E_z over t ~ U[t_min, 1] (Gauss-
  Legendre) and every mask pattern z, equals the closed form in alpha-space
  sum_S sum_{l not in S} -log p(x_l | x_S) int_{a_1}^{a_lo} a^|S| (1 - a)^
  (L - |S| - 1) da + L (1 - a_lo) log V + L a_1 log V;
* it is >= -log p_model(x), the exact likelihood of the generative model
  the bound belongs to (prior -> reverse chain -> uniform decoder), for
  every x, with equality for the tight schedule (a_1 = 0, t_min = 0);
* 'mdlm' is today's convention, number for number.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.diffusion.schedules import LogLinearSchedule

CASES = [(2, 1), (3, 1), (2, 2), (3, 2)]


class Toy:
  """p over V^L with every exact conditional, and the denoiser table."""

  def __init__(self, vocab, length, seed=0):
    rng = np.random.default_rng(seed)
    self.vocab, self.length = vocab, length
    self.seqs = np.array(list(itertools.product(range(vocab), repeat=length)))
    self.p = rng.dirichlet(np.ones(len(self.seqs)))
    self.states = np.array(
      list(itertools.product(range(vocab + 1), repeat=length))
    )
    table = np.zeros((len(self.states), length, vocab))
    for i, z in enumerate(self.states):
      for pos in range(length):
        if z[pos] == vocab:
          cond = self._conditional(z, pos)
          table[i, pos] = np.log(cond)
    self.table = jnp.asarray(table, jnp.float32)

  def marginal(self, x, visible):
    """p(x_S = x[S]) for the positions in `visible`."""
    idx = list(visible)
    keep = np.all(self.seqs[:, idx] == np.asarray(x)[idx], axis=1)
    return float(self.p[keep].sum())

  def _conditional(self, z, pos):
    visible = [i for i in range(self.length) if z[i] != self.vocab]
    out = np.zeros(self.vocab)
    for v in range(self.vocab):
      x = np.where(z == self.vocab, 0, z)
      x[pos] = v
      out[v] = self.marginal(x, visible + [pos])
    return out / out.sum()

  def apply(self, z_BxL, t_B):
    del t_B
    idx = jnp.zeros(z_BxL.shape[0], jnp.int32)
    for pos in range(self.length):
      idx = idx * (self.vocab + 1) + z_BxL[:, pos]
    return self.table[idx]


def _alpha(schedule, t):
  return float(np.asarray(schedule.alpha(jnp.float32(t)), np.float64))


def _library_expectation(process, toy, nodes=48, apply=None):
  """E_{t ~ U[t_min, 1]} E_{z ~ q(z_t | x)} nelbo for every x, exactly.

  One batch holds every (x, Gauss-Legendre node, mask pattern) row.
  """
  apply = apply or toy.apply
  length = toy.length
  masks = np.array(list(itertools.product([0, 1], repeat=length)), bool)
  u, w = np.polynomial.legendre.leggauss(nodes)
  t_Q = process.t_min + (1 - process.t_min) * (u + 1) / 2
  n_x, n_q, n_p = len(toy.seqs), nodes, len(masks)
  x_R = np.repeat(toy.seqs, n_q * n_p, 0)
  m_R = np.tile(masks, (n_x * n_q, 1))
  t_R = np.tile(np.repeat(t_Q, n_p), n_x)
  z_R = np.where(m_R, toy.vocab, x_R)
  t_B = jnp.asarray(t_R, jnp.float32)
  z_B = jnp.asarray(z_R)
  nelbo = process.bound(
    apply(z_B, t_B), jnp.asarray(x_R), z_B, t_B, process.time_weight(t_B),
    None,
  )[1]  # fmt: skip
  a_Q = np.asarray(process.schedule.alpha(jnp.asarray(t_Q, jnp.float32)))
  a_R = np.tile(np.repeat(a_Q.astype(np.float64), n_p), n_x)[:, None]
  prob_R = np.prod(np.where(m_R, 1 - a_R, a_R), -1)
  wt_R = np.tile(np.repeat(w / 2, n_p), n_x)
  terms = (wt_R * prob_R * np.asarray(nelbo, np.float64)).reshape(n_x, -1)
  return terms.sum(-1)


def _closed_form(process, toy, x, bound_kind):
  """The expected bound in alpha-space (exact polynomial integrals)."""
  length, vocab = toy.length, toy.vocab
  a_1 = _alpha(process.schedule, 1.0)
  a_lo = _alpha(process.schedule, process.t_min)
  diffusion = 0.0
  for k in range(length):
    poly = np.polynomial.Polynomial([0, 1]) ** k
    poly = poly * np.polynomial.Polynomial([1, -1]) ** (length - k - 1)
    anti = poly.integ()
    integral = anti(a_lo) - anti(a_1)
    for visible in itertools.combinations(range(length), k):
      for pos in set(range(length)) - set(visible):
        joint = toy.marginal(x, list(visible) + [pos])
        cond = joint / toy.marginal(x, list(visible))
        diffusion += -math.log(cond) * integral
  log_v = math.log(vocab)
  if bound_kind == 'mdlm':
    a_0 = _alpha(process.schedule, 0.0)
    return diffusion / (1 - process.t_min) + length * (1 - a_0) * log_v
  return diffusion + length * ((1 - a_lo) + a_1) * log_v


def _model_nll(process, toy, x):
  """-log p_model(x): z_1 from the factorised prior (a_1 / V per data token),
  each masked position revealed before t_lo w.p. r = (a_lo - a_1) / (1 -
  a_1), independently and in a uniformly random order, with the exact
  conditionals (so a set R given A has probability p(x_{A+R}) / p(x_A)),
  and the uniform decoder for the rest."""
  length, vocab = toy.length, toy.vocab
  a_1 = _alpha(process.schedule, 1.0)
  a_lo = _alpha(process.schedule, process.t_min)
  r = (a_lo - a_1) / (1 - a_1)
  total = 0.0
  for n_a in range(length + 1):
    for prior_vis in itertools.combinations(range(length), n_a):
      p_a = a_1**n_a * (1 - a_1) ** (length - n_a) * vocab**-n_a
      rest = sorted(set(range(length)) - set(prior_vis))
      base = toy.marginal(x, list(prior_vis))
      for n_r in range(len(rest) + 1):
        for rev in itertools.combinations(rest, n_r):
          p_r = r**n_r * (1 - r) ** (len(rest) - n_r)
          joint = toy.marginal(x, list(prior_vis) + list(rev))
          left = len(rest) - n_r
          total += p_a * p_r * joint / base * vocab**-left
  return -math.log(total)


@pytest.mark.parametrize('vocab,length', CASES)
def test_full_bound_equals_its_closed_form_and_bounds_the_model_nll(
  vocab, length
):
  toy = Toy(vocab, length, seed=vocab * 10 + length)
  gaps = []
  for schedule, t_min in (
    (LogLinearSchedule(eps=0.05), 0.0),
    (LogLinearSchedule(eps=0.05), 0.2),
    (get_schedule('cosine', eps=0.02), 0.1),
  ):
    full = MaskedDiffusion(schedule, vocab, t_min=t_min)
    mdlm = MaskedDiffusion(schedule, vocab, t_min=t_min, bound_kind='mdlm')
    got_X = _library_expectation(full, toy)
    got_m_X = _library_expectation(mdlm, toy)
    for x, got, got_m in zip(toy.seqs, got_X, got_m_X):
      want = _closed_form(full, toy, x, 'full')
      np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
      want_m = _closed_form(mdlm, toy, x, 'mdlm')
      np.testing.assert_allclose(got_m, want_m, rtol=2e-6, atol=1e-6)
      nll = _model_nll(full, toy, x)
      assert got >= nll - 1e-6, (schedule, t_min, x, got, nll)
      gaps.append((got - nll, want_m - nll))
  # The prior term matters: without it (and with the t_min convention) the
  # published number drops below the model's NLL for some x.
  assert min(g[1] for g in gaps) < 0 <= min(g[0] for g in gaps) + 1e-6


@pytest.mark.parametrize('vocab,length', CASES)
def test_tight_schedule_full_bound_is_the_exact_nll(vocab, length):
  """a_1 = 0 and t_min = 0: prior and reconstruction vanish and the bound of
  the exact denoiser is -log p(x) (the chain rule averaged over orders)."""
  toy = Toy(vocab, length, seed=7 + vocab + length)
  process = MaskedDiffusion(LogLinearSchedule(eps=0.0), vocab)
  got_X = _library_expectation(process, toy)
  for i, (x, got) in enumerate(zip(toy.seqs, got_X)):
    np.testing.assert_allclose(got, -math.log(toy.p[i]), rtol=2e-6)
    np.testing.assert_allclose(got, _model_nll(process, toy, x), rtol=2e-6)


@pytest.mark.parametrize('t_min', [0.0, 0.3])
@pytest.mark.parametrize('schedule', ['loglinear', 'cosine'])
def test_uniform_denoiser_full_bound_is_exactly_l_log_v(schedule, t_min):
  """The uniform model's likelihood is V^-L; the full bound is tight there
  (prior a_1 + diffusion (a_lo - a_1) + reconstruction (1 - a_lo) = 1)."""
  toy = Toy(3, 2)
  process = MaskedDiffusion(get_schedule(schedule), 3, t_min=t_min)
  uniform = lambda z, t: jnp.zeros(z.shape + (3,), jnp.float32)
  got_X = _library_expectation(process, toy, apply=uniform)
  np.testing.assert_allclose(got_X, 2 * math.log(3), rtol=2e-6)


def test_monte_carlo_loss_matches_the_quadrature_with_t_min():
  """process.loss (sample_times + draw + bound) with t_min = 0.3: its mean
  over rows is the closed form within 4 standard errors (the iid standard
  error; antithetic times only lower the true one). Without the (1 - t_min)
  factor the mean would move by 0.3/0.7 of the diffusion term, far outside
  the tolerance (checked)."""
  vocab, length, batch = 3, 2, 4096
  toy = Toy(vocab, length, seed=5)
  process = MaskedDiffusion(LogLinearSchedule(eps=0.05), vocab, t_min=0.3)
  rows = np.random.default_rng(1).choice(len(toy.seqs), batch, p=toy.p)
  x_BxL = jnp.asarray(toy.seqs[rows], jnp.int32)
  closed = np.array([_closed_form(process, toy, x, 'full') for x in toy.seqs])
  loss = jax.jit(lambda key: process.loss(toy.apply, key, x_BxL)[1])
  diffs = np.concatenate(
    [np.asarray(loss(jax.random.key(k))) - closed[rows] for k in range(4)]
  )
  stderr = diffs.std() / math.sqrt(diffs.size)
  assert abs(diffs.mean()) < 4 * stderr, (diffs.mean(), stderr)
  mdlm = MaskedDiffusion(process.schedule, vocab, t_min=0.3, bound_kind='mdlm')
  closed_m = np.array([_closed_form(mdlm, toy, x, 'mdlm') for x in toy.seqs])
  mdlm_shift = np.mean(closed_m[rows] - closed[rows])
  assert abs(mdlm_shift) > 20 * stderr


def test_prior_term_value():
  """KL(q(z_1 | x) || p(z_1)) = alpha(1) log V; 0.0044 nats at V = 81."""
  for vocab in (2, 27, 81):
    process = MaskedDiffusion(get_schedule('loglinear'), vocab)
    recon, prior = process.constant_nats()
    a_1 = 1e-3
    q = np.array([a_1, 1 - a_1])  # (x, mask); other tokens have q = 0.
    p = np.array([a_1 / vocab, 1 - a_1])
    np.testing.assert_allclose(prior, np.sum(q * np.log(q / p)), rtol=1e-4)
    np.testing.assert_allclose(prior, a_1 * math.log(vocab), rtol=1e-4)
    assert recon == 0.0  # log-linear alpha(0) = 1, t_min = 0.
  assert process.constant_nats()[1] == pytest.approx(0.0044, abs=1e-4)
  md4 = MaskedDiffusion(get_schedule('linear'), 81, t_min=1e-3)
  recon, prior = md4.constant_nats()
  np.testing.assert_allclose(prior, 1e-4 * math.log(81), rtol=1e-3)
  a_lo = 1 - 1e-4 - (1 - 2e-4) * 1e-3
  np.testing.assert_allclose(recon, (1 - a_lo) * math.log(81), rtol=1e-3)
  # T steps: the reconstruction is at t = 0 whatever t_min.
  disc = MaskedDiffusion(get_schedule('linear'), 81, num_steps=8, t_min=0.5)
  np.testing.assert_allclose(
    disc.constant_nats()[0], 1e-4 * math.log(81), rtol=1e-3
  )


# The 'mdlm' numbers printed by the code before the change (same inputs).
GOLDEN = {
  ('loglinear', 1e-3, 0): [9.3724946975708, 13.204766273498535, 0.0,
                           10.448782920837402],
  ('cosine', 0.1, 0): [5.294467926025391, 3.200700044631958,
                       8.842899322509766, 14.195199966430664],
  ('linear', 0.0, 8): [7.955665111541748, 12.56363296508789,
                       8.212844848632812, 9.802677154541016],
}  # fmt: skip


@pytest.mark.parametrize('case', sorted(GOLDEN))
def test_mdlm_option_reproduces_the_previous_numbers(case):
  name, t_min, steps = case
  V, B, L = 5, 4, 6
  x = jax.random.randint(jax.random.key(0), (B, L), 0, V)
  table = jax.random.normal(jax.random.key(1), (V + 1, V))
  pad = jnp.ones((B, L)).at[0, 4:].set(0)
  kw = dict(num_steps=steps, t_min=t_min)
  mdlm = MaskedDiffusion(get_schedule(name), V, bound_kind='mdlm', **kw)
  got = mdlm.loss(lambda z, t: table[z], jax.random.key(2), x, pad)[1]
  np.testing.assert_allclose(got, GOLDEN[case], rtol=1e-6, atol=1e-6)
  # Same key, same (t, z): full = (1 - t_min) (mdlm - its constant) + the
  # full constants (the discrete bound ignores t_min).
  full = MaskedDiffusion(get_schedule(name), V, **kw)
  got_f = full.loss(lambda z, t: table[z], jax.random.key(2), x, pad)[1]
  valid = np.asarray(pad.sum(-1))
  factor = 1.0 if steps else 1.0 - t_min
  recon_m, _ = mdlm.constant_nats()
  recon_f, prior_f = full.constant_nats()
  want = factor * (np.asarray(got) - recon_m * valid)
  want = want + (recon_f + prior_f) * valid
  np.testing.assert_allclose(got_f, want, rtol=1e-5, atol=1e-5)


def test_bad_bound_kind_and_t_min_are_refused():
  with pytest.raises(ValueError, match="bound_kind='fulll'.*'mdlm'"):
    MaskedDiffusion(get_schedule('loglinear'), 5, bound_kind='fulll')
  with pytest.raises(ValueError, match='t_min must lie in'):
    MaskedDiffusion(get_schedule('loglinear'), 5, t_min=1.0)


@pytest.mark.parametrize('num_steps,t_min', [(0, 0.0), (0, 0.1), (8, 0.0)])
def test_full_bound_agrees_with_the_interpolating_process_at_p_u_0(
  num_steps, t_min
):
  """An independent implementation of the same bound: the interpolating
  process at mixing 0 is masked diffusion, with its own (1 - t_min) weight,
  reconstruction at t_min and prior (uniform.mixture_constants)."""
  from ddlm_jax.diffusion.interpolating import InterpolatingDiffusion

  vocab, key = 6, jax.random.key(7)
  x = jax.random.randint(jax.random.key(8), (8, 12), 0, vocab)
  pad = jnp.ones((8, 12)).at[:, 10:].set(0)
  table = jax.random.normal(jax.random.key(1), (vocab + 1, vocab))
  apply = lambda z, t: table[z]
  kw = dict(num_steps=num_steps, t_min=t_min)
  masked = MaskedDiffusion(LogLinearSchedule(), vocab, **kw)
  at0 = InterpolatingDiffusion(LogLinearSchedule(), vocab, mixing=0.0, **kw)
  np.testing.assert_allclose(
    masked.loss(apply, key, x, pad)[1], at0.loss(apply, key, x, pad)[1],
    rtol=5e-5,
  )  # fmt: skip
