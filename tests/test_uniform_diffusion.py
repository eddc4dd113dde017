"""Uniform-state and interpolating diffusion against exact enumeration.

UDLM (arXiv 2412.10193) and Duo (arXiv 2506.10892). Toy problems are small
enough (V <= 4, L <= 2) to sum over every clean sequence and every noisy
one, so the posteriors, the leave-one-out claims and the bounds are checked
exactly, not by sampling.
"""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import (
  InterpolatingDiffusion,
  MaskedDiffusion,
  UniformDiffusion,
  get_schedule,
)
from ddlm_jax.diffusion import interpolating as itp
from ddlm_jax.diffusion import uniform as uni
from ddlm_jax.models import Transformer, TransformerConfig

LOGLINEAR = get_schedule('loglinear')


# ----------------------------------------------------------- enumeration


def _pi(vocab, mixing):
  """Noise distribution: uniform over V (mixing None) or the V + 1 mixture."""
  if mixing is None:
    return np.full(vocab, 1.0 / vocab)
  return np.r_[np.full(vocab, mixing / vocab), 1.0 - mixing]


def _kernel(alpha, vocab, mixing):
  """q(z_t = k | x = v) as a [V, K] matrix."""
  pi = _pi(vocab, mixing)
  return alpha * np.eye(vocab, len(pi)) + (1.0 - alpha) * pi[None]


def _bayes(x, z, a_s, a_t, vocab, mixing):
  """q(z_s | z_t = z, x) by Bayes' rule through q(z_t | z_s)."""
  pi = _pi(vocab, mixing)
  states = np.arange(len(pi))
  a_ts = a_t / a_s
  trans = a_ts * (states == z) + (1.0 - a_ts) * pi[z]  # q(z_t = z | w)
  prior = a_s * (states == x) + (1.0 - a_s) * pi  # q(z_s = w | x)
  joint = trans * prior
  return joint / joint.sum()


@dataclasses.dataclass
class Toy:
  """A data distribution over V^L and everything enumerated from it."""

  vocab: int
  length: int
  probs: np.ndarray
  seqs: np.ndarray

  @property
  def entropy(self):
    return -float(np.sum(self.probs * np.log(self.probs)))

  def noisy(self, num_states):
    return np.array(
      list(itertools.product(range(num_states), repeat=self.length))
    )

  def exact(self, alpha, mixing):
    """(zs, weight_NxM, loo_MxLxV, den_MxLxV) at keep-probability alpha."""
    kern = _kernel(alpha, self.vocab, mixing)
    zs = self.noisy(kern.shape[1])
    lik_NxMxL = kern[self.seqs[:, None, :], zs[None, :, :]]
    weight_NxM = self.probs[:, None] * lik_NxMxL.prod(-1)
    onehot_NxLxV = np.eye(self.vocab)[self.seqs]
    den = np.einsum('nm,nlv->mlv', weight_NxM, onehot_NxLxV)
    loo = np.zeros_like(den)
    for i in range(self.length):
      rest_NxM = self.probs[:, None] * np.delete(lik_NxMxL, i, -1).prod(-1)
      loo[:, i] = np.einsum('nm,nv->mv', rest_NxM, onehot_NxLxV[:, i])
    with np.errstate(invalid='ignore'):
      den = den / den.sum(-1, keepdims=True)
      loo = loo / loo.sum(-1, keepdims=True)
    # z_t that no x can produce (masked end) get weight 0; any table works.
    den = np.where(np.isfinite(den), den, 1.0 / self.vocab)
    return zs, weight_NxM, loo, den


def _toy(vocab=3, length=2, seed=0):
  rng = np.random.default_rng(seed)
  seqs = np.array(list(itertools.product(range(vocab), repeat=length)))
  p = rng.dirichlet(np.ones(len(seqs)))
  return Toy(vocab, length, p, seqs)


def _expected(terms, toy, mixing, alphas_T, logits_TxMxLxV, *per_time):
  """E_{x, z_t}[sum_i terms] at each of T times, summed over every pair.

  terms(logits_BxLxV, x_BxL, z_BxL, *per_time_B) -> [B, L]; the rows are
  all (time, x, z_t) triples, weighted by p(x) q(z_t | x) at that time.
  The bookkeeping is numpy (jnp only for traced logits, to differentiate).
  """
  rows = [toy.exact(float(a), mixing) for a in alphas_T]
  zs = rows[0][0]
  n_P, m_P = (g.ravel() for g in np.indices((len(toy.seqs), len(zs))))
  w_TxP = np.stack([r[1][n_P, m_P] for r in rows])
  steps, pairs = w_TxP.shape
  x_BxL = np.tile(toy.seqs[n_P], (steps, 1))
  z_BxL = np.tile(zs[m_P], (steps, 1))
  xp = np if isinstance(logits_TxMxLxV, np.ndarray) else jnp
  logits = xp.broadcast_to(logits_TxMxLxV, (steps,) + logits_TxMxLxV.shape[-3:])
  logits_BxLxV = logits[:, m_P].reshape(steps * pairs, toy.length, -1)
  extra = [np.repeat(np.asarray(e), pairs) for e in per_time]
  out_BxL = terms(logits_BxLxV, x_BxL, z_BxL, *extra)
  if xp is np:
    out_BxL = np.asarray(out_BxL)
  return xp.sum(w_TxP * out_BxL.sum(-1).reshape(steps, pairs), -1)


def _tables(toy, alphas_T, mixing, which):
  """Exact LOO (which=2) or denoiser (which=3) log-probs at each time."""
  return np.log(
    np.stack([toy.exact(float(a), mixing)[which] for a in alphas_T])
  )


# ------------------------------------------------------------- posteriors

_upost = jax.jit(uni.uniform_posterior)
_ipost = jax.jit(itp.interpolating_posterior, static_argnames='mixing')


def _posterior(x_probs, z, a_s, a_t, mixing):
  if mixing is None:
    return np.asarray(_upost(x_probs, z, a_s, a_t))
  return np.asarray(_ipost(x_probs, z, a_s, a_t, mixing=mixing))


@pytest.mark.parametrize('mixing', [None, 0.0, 0.3, 1.0])
def test_posterior_is_bayes_and_linear(mixing):
  """One-hot x: Bayes' rule; a probability vector: the mixture over x."""
  vocab = 4
  num = len(_pi(vocab, mixing))
  pairs = [(0.9, 0.5), (0.3, 0.05), (1.0, 0.7)]  # (alpha_s, alpha_t)
  # Rows: every (alpha pair, x, z_t) one-hot, then the same (pair, z_t)
  # with a random probability vector; alphas are [B] arrays.
  a_i, xs, zs = (g.ravel() for g in np.indices((len(pairs), vocab, num)))
  rng = np.random.default_rng(1)
  p_BxV = rng.dirichlet(np.ones(vocab), len(xs))
  x_probs = np.concatenate([np.eye(vocab)[xs], p_BxV])[:, None]
  z = np.concatenate([zs, zs])[:, None]
  a_s, a_t = (np.tile(np.array(pairs)[a_i, k], 2) for k in (0, 1))
  with jax.enable_x64(True):
    got = _posterior(jnp.asarray(x_probs), z, a_s, a_t, mixing)
  onehot, mixed = got[: len(xs), 0], got[len(xs) :, 0]
  for b in range(len(xs)):
    s_b, t_b = pairs[a_i[b]]
    kern = _kernel(t_b, vocab, mixing)
    if kern[xs[b], zs[b]] > 0:  # a possible (x, z_t) pair
      want = _bayes(xs[b], zs[b], s_b, t_b, vocab, mixing)
      np.testing.assert_allclose(onehot[b], want, atol=1e-12)
    if mixing == 0.0 or kern[:, zs[b]].sum() == 0:
      continue  # p_u = 0 renormalises over consistent x; z_t impossible
    per_x = [_bayes(y, zs[b], s_b, t_b, vocab, mixing) for y in range(vocab)]
    np.testing.assert_allclose(mixed[b], p_BxV[b] @ np.stack(per_x), atol=1e-12)
    np.testing.assert_allclose(mixed[b].sum(), 1.0, atol=1e-12)


def test_interpolating_posterior_matches_masked_and_uniform_ends():
  vocab = 5
  p = jax.nn.softmax(jax.random.normal(jax.random.key(2), (2, 6, vocab)))
  z = jnp.array([[0, 5, 5, 2, 5, 4], [5, 1, 3, 5, 5, 0]])
  zu = jnp.minimum(z, vocab - 1)
  s, t = jnp.array([0.3, 0.5]), jnp.array([0.6, 0.9])

  @jax.jit
  def all_four():
    at0 = InterpolatingDiffusion(LOGLINEAR, vocab, mixing=0.0)
    masked = MaskedDiffusion(LOGLINEAR, vocab)
    at1 = InterpolatingDiffusion(LOGLINEAR, vocab, mixing=1.0)
    uniform = UniformDiffusion(LOGLINEAR, vocab)
    return (
      at0.posterior_probs(p, z, s, t),
      masked.reverse_probs(p, z, s[:, None, None], t[:, None, None]),
      at1.posterior_probs(p, zu, s, t),
      uniform.posterior_probs(p, zu, s, t),
    )

  got0, masked, got1, uniform = (np.asarray(a) for a in all_four())
  is_mask = np.asarray(z == vocab)
  np.testing.assert_allclose(got0[is_mask], masked[is_mask], atol=1e-6)
  onehot = np.eye(vocab + 1)[np.asarray(z)]  # unmasked tokens stay
  np.testing.assert_allclose(got0[~is_mask], onehot[~is_mask], atol=1e-6)
  np.testing.assert_allclose(got1[..., :vocab], uniform, atol=1e-6)
  np.testing.assert_allclose(got1[..., vocab], 0.0, atol=1e-7)


@pytest.mark.parametrize('mixing', [None, 0.5])
def test_denoiser_posterior_is_the_exact_reverse_marginal(mixing):
  """Mixing by the denoiser = REFERENCE's ratio at the LOO = the truth."""
  toy = _toy(seed=3)
  vocab = toy.vocab
  a_s, a_t = 0.7, 0.4
  kern = _kernel(a_t, vocab, mixing)
  with jax.enable_x64(True):
    zs, weight, loo, den = toy.exact(a_t, mixing)
    got_MxLxK = _posterior(jnp.asarray(den), jnp.asarray(zs), a_s, a_t, mixing)
    for m, z in enumerate(zs):
      post_x = weight[:, m] / weight[:, m].sum()  # p(x | z_t) by enumeration
      for i in range(toy.length):
        bayes_VxK = np.stack(
          [_bayes(y, z[i], a_s, a_t, vocab, mixing) for y in range(vocab)]
        )
        truth = post_x @ bayes_VxK[toy.seqs[:, i]]
        # The plug-in (ratio) posterior at r = LOO: sum_y r_y q(z|y) q(.|z,y).
        ratio = (loo[m, i] * kern[:, z[i]]) @ bayes_VxK
        np.testing.assert_allclose(ratio / ratio.sum(), truth, atol=1e-12)
        np.testing.assert_allclose(got_MxLxK[m, i], truth, atol=1e-12)
        if mixing is None:  # the closed form of the ratio
          r, e_z, a_ts = loo[m, i], np.eye(vocab)[z[i]], a_t / a_s
          ref = (
            a_t * vocab * r[z[i]] * e_z
            + (a_ts - a_t) * e_z
            + (a_s - a_t) * r
            + (1 - a_ts) * (1 - a_s) / vocab
          ) / (a_t * vocab * r[z[i]] + 1 - a_t)
          np.testing.assert_allclose(ref, truth, atol=1e-12)


# ------------------------------------------------------------ LOO claims


def test_loo_conversion_round_trips_and_is_bayes():
  vocab = 4

  @jax.jit
  def conversions(loo, z, a_t):
    den = uni.loo_to_denoiser_logits(loo, z, a_t)
    zm = jnp.where(z == 0, vocab, z)  # some masked tokens
    den4 = itp.interp_loo_to_denoiser_logits(loo, zm, a_t, 0.4)
    return (
      den,
      uni.denoiser_to_loo_logits(den, z, a_t),
      itp.interp_loo_to_denoiser_logits(loo, z, a_t, 1.0),
      itp.interp_denoiser_to_loo_logits(den4, zm, a_t, 0.4),
    )

  with jax.enable_x64(True):
    loo = jax.random.normal(jax.random.key(0), (3, 5, vocab), jnp.float64)
    z = jax.random.randint(jax.random.key(1), (3, 5), 0, vocab)
    a_t = jnp.array([0.2, 0.5, 0.9])
    den, back, den1, back4 = (np.asarray(a) for a in conversions(loo, z, a_t))
  np.testing.assert_allclose(back, loo, atol=1e-12)
  np.testing.assert_allclose(back4, loo, atol=1e-12)  # p_u = 0.4 inverts
  # p(v | z_t) ~ p(v | z^{-i}) q(z_t^i | v).
  loo, a = np.asarray(loo), np.asarray(a_t)[:, None, None]
  lik = a * np.eye(vocab)[np.asarray(z)] + (1 - a) / vocab
  want = np.exp(loo) * lik
  softmax = lambda v: np.exp(v) / np.exp(v).sum(-1, keepdims=True)
  np.testing.assert_allclose(softmax(den), want / want.sum(-1, keepdims=True))
  np.testing.assert_allclose(softmax(den1), softmax(den), atol=1e-12)  # p_u=1


def _make(mixing, **kw):
  if mixing is None:
    return UniformDiffusion(LOGLINEAR, 3, **kw)
  return InterpolatingDiffusion(LOGLINEAR, 3, mixing=mixing, **kw)


@pytest.mark.parametrize(
  'mixing,num_steps',
  [
    (None, 0),
    (None, 8),
    (0.5, 0),
    pytest.param(0.5, 8, marks=pytest.mark.slow),
  ],
)
def test_loo_minimises_the_plugin_nelbo_and_the_denoiser_does_not(
  mixing, num_steps
):
  """At one t, the expected bound term as a function of the plugged table."""
  toy = _toy()
  proc = _make(mixing, num_steps=num_steps, parameterization='loo')
  t = 0.5
  alpha = float(proc.schedule.alpha(t))

  def objective(proc, table_MxLxV):
    return _expected(
      proc.diffusion_terms, toy, mixing, [alpha], table_MxLxV[None], [t]
    )[0]

  with jax.enable_x64(True):
    value = jax.jit(objective, static_argnums=0)
    grad = jax.jit(jax.grad(objective, argnums=1), static_argnums=0)
    log_loo = _tables(toy, [alpha], mixing, 2)[0]
    log_den = _tables(toy, [alpha], mixing, 3)[0]
    best = float(value(proc, log_loo))
    assert best > 1e-3
    np.testing.assert_allclose(grad(proc, log_loo), 0.0, atol=1e-10)
    rng = np.random.default_rng(0)
    for _ in range(3):
      bumped = value(proc, log_loo + 0.3 * rng.normal(size=log_loo.shape))
      assert float(bumped) > best + 1e-6
    # The denoiser differs from the LOO, and plugged in as if it were the
    # LOO (Duo's plug-in) it is not the minimiser ...
    assert np.abs(np.exp(log_den) - np.exp(log_loo)).max() > 0.05
    assert float(value(proc, log_den)) > best + 1e-4
    assert np.abs(np.asarray(grad(proc, log_den))).max() > 1e-3
    # ... while declared a denoiser it is converted exactly to the LOO.
    as_den = dataclasses.replace(proc, parameterization='denoiser')
    np.testing.assert_allclose(value(as_den, log_den), best, rtol=1e-10)


# ---------------------------------------------------------------- bounds


@pytest.mark.parametrize('mixing', [None, 0.0, 0.5])
def test_continuous_nelbo_is_the_limit_of_the_discrete_one(mixing):
  """|D_T - C| shrinks monotonically, at the first-order rate 1/T.

  Fixed (time-independent) model probabilities, times in [0.2, 1] where the
  integrand is smooth (40-node Gauss-Legendre is exact to ~1e-12 there).
  With such a model the sign of the O(1/T) term depends on the model.
  """
  toy = _toy(seed=3)
  vocab, lo = toy.vocab, 0.2
  num = len(_pi(vocab, mixing))
  table = np.random.default_rng(2).normal(size=(num**toy.length, 2, vocab))
  alpha = lambda t: np.asarray(LOGLINEAR.alpha(t))

  @jax.jit
  def rate(logits, x, z, a_t):
    logr = jax.nn.log_softmax(logits)
    if mixing is None:
      return uni.uniform_nelbo_rate(logr, x, z, a_t)
    return itp.interpolating_nelbo_rate(logr, x, z, a_t, mixing)

  @jax.jit
  def step_kl(logits, x, z, a_s, a_t):
    logr = jax.nn.log_softmax(logits)
    if mixing is None:
      return uni.uniform_step_kl(logr, x, z, a_s, a_t)
    return itp.interpolating_step_kl(logr, x, z, a_s, a_t, mixing)

  with jax.enable_x64(True):
    nodes, wts = np.polynomial.legendre.leggauss(40)
    t_q = lo + (1 - lo) * (nodes + 1) / 2
    a_q = alpha(t_q)
    rate_q = np.asarray(_expected(rate, toy, mixing, a_q, table, a_q))
    dalpha = -np.asarray(LOGLINEAR.dalpha(t_q))
    cont = (1 - lo) / 2 * np.sum(wts * dalpha * rate_q)
    all_steps = (4, 16, 64, 256)
    grids = [lo + (1 - lo) * np.arange(n + 1) / n for n in all_steps]
    a_s = np.concatenate([alpha(g[:-1]) for g in grids])
    a_t = np.concatenate([alpha(g[1:]) for g in grids])
    kl = np.asarray(_expected(step_kl, toy, mixing, a_t, table, a_s, a_t))
    ends = np.cumsum((0,) + all_steps)
    gaps = np.array([kl[a:b].sum() - cont for a, b in zip(ends, ends[1:])])
  assert cont > 0.5
  assert np.all(np.diff(np.abs(gaps)) < 0), gaps
  assert 3.5 < gaps[-2] / gaps[-1] < 4.5, gaps  # first order in 1/T
  assert abs(gaps[-1]) < 1e-3 * cont, gaps


@functools.cache
def _jit_nelbo(proc):
  """Per-sequence NELBO of proc at the T-step weight, one program per proc."""

  def nelbo(logits, x, z, t):
    weight = jnp.full(t.shape, float(proc.num_steps))
    return proc.bound(logits, x, z, t, weight, None)[1][:, None]

  return jax.jit(nelbo)


def _t_step_nelbo(proc, toy, mixing, table=None):
  """Exact T-step NELBO through proc.bound: the mean over the T times."""
  steps = proc.num_steps
  t_T = np.arange(1, steps + 1) / steps
  alphas = np.asarray(proc.schedule.alpha(t_T))
  logits = _tables(toy, alphas, mixing, 2) if table is None else table
  per_t = _expected(_jit_nelbo(proc), toy, mixing, alphas, logits, t_T)
  return float(np.mean(per_t))


@pytest.mark.parametrize('mixing', [None, 0.5])
def test_nelbo_bounds_the_exact_entropy(mixing):
  """T-step and continuous bounds >= H(data), exactly (no sampling)."""
  toy = _toy(seed=2)
  num = len(_pi(toy.vocab, mixing))
  rng = np.random.default_rng(5)
  noise = 1.5 * rng.normal(size=(num**toy.length, toy.length, toy.vocab))
  h = toy.entropy
  with jax.enable_x64(True):
    best16 = _t_step_nelbo(
      _make(mixing, num_steps=16, parameterization='loo'), toy, mixing
    )
    best64 = _t_step_nelbo(
      _make(mixing, num_steps=64, parameterization='loo'), toy, mixing
    )
    rand = _t_step_nelbo(
      _make(mixing, num_steps=16, parameterization='loo'), toy, mixing, noise
    )
    _, prior = _make(mixing).constant_nats()
    assert h < best64 < best16 < rand
    # With the exact LOO the gaps are the prior term and the factorised
    # reverse step (O(1/T)): the bound closes in on the entropy.
    excess = lambda b: b - h - toy.length * prior
    assert 0 < excess(best64) < 0.5 * excess(best16)
    assert best64 - h < 0.05
    # Continuous time: quadrature over [t_min, 1] plus the closed-form ends.
    proc = _make(mixing, t_min=0.05, parameterization='loo')
    nodes, wts = np.polynomial.legendre.leggauss(48)
    t_q = proc.t_min + (1 - proc.t_min) * (nodes + 1) / 2
    a_q = np.asarray(proc.schedule.alpha(t_q))
    dalpha = -np.asarray(proc.schedule.dalpha(t_q))
    terms = jax.jit(proc.diffusion_terms)
    recon, prior = proc.constant_nats()
    bounds = []
    for table in (_tables(toy, a_q, mixing, 2), noise):
      rate = np.asarray(_expected(terms, toy, mixing, a_q, table, t_q))
      integral = (1 - proc.t_min) / 2 * np.sum(wts * dalpha * rate)
      bounds.append(integral + toy.length * (recon + prior))
    assert h < bounds[0] < bounds[1]


@pytest.mark.parametrize('mixing', [0.0, 0.3, 1.0])
def test_reconstruction_and_prior_constants_by_enumeration(mixing):
  vocab, alpha, x = 4, 0.93, 0
  kern = _kernel(alpha, vocab, mixing)  # [V, K]
  recon, prior = uni.mixture_constants(alpha, vocab, mixing)
  q = kern[x]
  ok = q > 0
  decoder = kern[x, ok] / kern[:, ok].sum(0)  # p(x | z) ~ q(z | x)
  np.testing.assert_allclose(recon, -np.sum(q[ok] * np.log(decoder)), 1e-12)
  marginal = kern.mean(0)[ok]  # q(z_1 | uniform x)
  want = np.sum(q[ok] * np.log(q[ok] / marginal))
  np.testing.assert_allclose(prior, want, rtol=1e-12)
  if mixing == 0.0:  # MD4's constants
    np.testing.assert_allclose(recon, (1 - alpha) * math.log(vocab), 1e-12)
    np.testing.assert_allclose(prior, alpha * math.log(vocab), rtol=1e-12)


# --------------------------------------------------- ends of the mixture


def _table_apply(vocab, seed=0):
  rng = np.random.default_rng(seed)
  a, b = (jnp.asarray(rng.normal(size=(vocab + 1, vocab))) for _ in range(2))
  return lambda z, t: (a[z] + t[:, None, None] * b[z]).astype(t.dtype)


@pytest.mark.parametrize(
  'num_steps', [0, pytest.param(8, marks=pytest.mark.slow)]
)
def test_interpolating_at_p_u_0_is_masked_diffusion(num_steps):
  """Same keys, same network: same z_t, NELBO and CE (the masked process
  reports the full bound, prior term included, as the interpolating one)."""
  vocab, key = 6, jax.random.key(7)
  x = jax.random.randint(jax.random.key(8), (8, 12), 0, vocab)
  pad = jnp.ones((8, 12)).at[:, 10:].set(0)
  apply = _table_apply(vocab)
  kw = dict(num_steps=num_steps, t_min=0.0)
  masked = MaskedDiffusion(LOGLINEAR, vocab, loss_type='simple_ce', **kw)
  at0 = InterpolatingDiffusion(
    LOGLINEAR, vocab, mixing=0.0, loss_type='simple_ce', **kw
  )

  @jax.jit
  def both():
    return (
      masked.draw(key, x)[2],
      at0.draw(key, x)[2],
      masked.loss(apply, key, x, pad),
      at0.loss(apply, key, x, pad),
    )

  z_m, z_i, (ce_m, nelbo_m, _), (ce_i, nelbo_i, aux) = both()
  np.testing.assert_array_equal(z_m, z_i)
  np.testing.assert_allclose(nelbo_i, np.asarray(nelbo_m), rtol=1e-5)
  np.testing.assert_allclose(ce_i, ce_m, rtol=1e-5)
  assert 0 < float(aux['masked_fraction'].mean()) < 1


@pytest.mark.parametrize(
  'num_steps', [0, pytest.param(8, marks=pytest.mark.slow)]
)
def test_interpolating_at_p_u_1_is_uniform_diffusion(num_steps):
  """Same keys: same (t, z_t); in float64 the same bound and predictors."""
  vocab, key = 6, jax.random.key(9)
  x = jax.random.randint(jax.random.key(8), (8, 12), 0, vocab)
  pad = jnp.ones((8, 12)).at[:, 10:].set(0)
  apply = _table_apply(vocab, seed=1)
  procs = {}
  for param in ('denoiser', 'loo'):
    kw = dict(num_steps=num_steps, parameterization=param)
    procs['uniform', param] = UniformDiffusion(LOGLINEAR, vocab, **kw)
    procs['mixed', param] = InterpolatingDiffusion(
      LOGLINEAR, vocab, mixing=1.0, **kw
    )

  @jax.jit
  def everything():
    draws = [procs[name, 'loo'].draw(key, x) for name in ('uniform', 'mixed')]
    t, w, z = draws[0]
    t, w = t.astype(jnp.float64), w.astype(jnp.float64)
    logits = apply(z, t)
    out = [
      (
        proc.bound(logits, x, z, t, w, pad)[1],
        proc.denoiser_log_probs(logits, z, t),
        proc.loo_log_probs(logits, z, t),
      )
      for proc in procs.values()
    ]
    return draws, dict(zip(procs, out))

  with jax.enable_x64(True):
    (draw_u, draw_i), out = everything()
  for a, b in zip(draw_u, draw_i):
    np.testing.assert_array_equal(a, b)
  for param in ('denoiser', 'loo'):
    for a, b in zip(out['mixed', param], out['uniform', param]):
      np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_corrupt_and_prior_frequencies():
  vocab, n, mixing = 4, 20_000, 0.3
  x = jnp.zeros((3, n), jnp.int32)
  t = jnp.array([0.2, 0.5, 0.9])
  tol = 4 * 0.5 / math.sqrt(n)  # 4 sigma of a frequency over n tokens
  alpha = np.asarray(LOGLINEAR.alpha(t))
  proc = InterpolatingDiffusion(LOGLINEAR, vocab, mixing=mixing)
  uniform = UniformDiffusion(LOGLINEAR, vocab)

  @jax.jit
  def draws():
    return (
      uniform.corrupt(jax.random.key(0), x, t),
      proc.corrupt(jax.random.key(1), x, t),
      proc.prior_sample(jax.random.key(2), (n,)),
      uniform.prior_sample(jax.random.key(3), (n,)),
    )

  z, zi, z1, zu = (np.asarray(a) for a in draws())
  for v in range(vocab):
    want = alpha * (v == 0) + (1 - alpha) / vocab
    np.testing.assert_allclose(np.asarray((z == v).mean(-1)), want, atol=tol)
  for v in range(vocab + 1):
    want = alpha * (v == 0) + (1 - alpha) * _pi(vocab, mixing)[v]
    np.testing.assert_allclose((zi == v).mean(-1), want, atol=tol)
  a1 = float(LOGLINEAR.alpha(1.0))
  mask_prob = (1 - a1) * (1 - mixing)
  np.testing.assert_allclose((z1 == vocab).mean(), mask_prob, atol=tol)
  assert z1.min() >= 0 and z1.max() <= vocab
  freq = np.bincount(zu, minlength=vocab) / n
  np.testing.assert_allclose(freq, 1 / vocab, atol=tol)


def test_sample_times_and_weights():
  proc = UniformDiffusion(LOGLINEAR, 5, t_min=0.1)
  disc = UniformDiffusion(LOGLINEAR, 5, num_steps=4)
  both = jax.jit(
    lambda key: (proc.sample_times(key, 64), disc.sample_times(key, 16))
  )
  (t, w), (t4, w4) = both(jax.random.key(0))
  assert float(t.min()) >= 0.1 and float(t.max()) <= 1.0
  want = 0.9 * -np.asarray(LOGLINEAR.dalpha(t))  # (1 - t_min) (-alpha')
  np.testing.assert_allclose(w, want, rtol=1e-6)
  counts = np.bincount(np.round(np.asarray(t4) * 4).astype(int), minlength=5)
  assert counts.tolist() == [0, 4, 4, 4, 4]  # antithetic: each step equally
  np.testing.assert_allclose(w4, 4.0)


@pytest.mark.parametrize(
  'mixing,kw',
  [
    (None, dict(num_steps=4)),
    (None, dict(num_steps=4, parameterization='loo')),
    (0.0, dict(num_steps=4, loss_type='simple_ce')),
    (0.0, dict(parameterization='loo', loss_type='simple_ce')),
    (1.0, dict(num_steps=4)),
  ],
)
def test_point_masses_leak_no_nan_into_gradients(mixing, kw):
  """s = 0 (alpha(0) = 1) and p_u = 0 hold point masses and -inf logits."""
  proc = _make(mixing, **kw)
  x = jax.random.randint(jax.random.key(0), (4, 8), 0, 3)
  t = jnp.full((4,), 0.25 if proc.num_steps else 0.01)  # s = 0 for T = 4

  @jax.jit
  def value_and_grad(logits):
    z = proc.corrupt(jax.random.key(1), x, jnp.full((4,), 0.6))

    def f(logits):
      obj, nelbo, _ = proc.bound(logits, x, z, t, jnp.ones((4,)), None)
      return obj.sum() + nelbo.sum()

    return jax.value_and_grad(f)(logits)

  val, grad = value_and_grad(jax.random.normal(jax.random.key(2), (4, 8, 3)))
  assert np.isfinite(float(val)) and np.all(np.isfinite(np.asarray(grad)))


@pytest.mark.parametrize(
  'mixing', [None, pytest.param(0.2, marks=pytest.mark.slow)]
)
def test_loss_on_a_tiny_transformer(mixing):
  vocab = 8
  if mixing is None:
    proc = UniformDiffusion(LOGLINEAR, vocab)
  else:
    proc = InterpolatingDiffusion(LOGLINEAR, vocab, mixing, num_steps=16)
  assert proc.requires_time_conditioning and not proc.causal
  cfg = TransformerConfig(
    vocab_size=vocab,
    input_vocab_size=proc.input_vocab_size,
    width=16,
    depth=1,
    num_heads=2,
    time_conditioning=True,
  )
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  x = jax.random.randint(jax.random.key(0), (4, 16), 0, vocab)

  @jax.jit
  def step(params):
    def f(params):
      model = nnx.merge(graphdef, params)
      obj, nelbo, aux = proc.loss(model, jax.random.key(1), x)
      return obj.mean(), (nelbo, aux)

    return jax.value_and_grad(f, has_aux=True)(params)

  (obj, (nelbo, aux)), grads = step(params)
  assert np.isfinite(float(obj)) and np.all(np.isfinite(np.asarray(nelbo)))
  np.testing.assert_allclose(float(obj), float(nelbo.mean()), rtol=1e-6)
  assert 0 < float(aux['changed_fraction'].mean()) < 1
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
  assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0


# -------------------------------------------------------------- bad input


@pytest.mark.parametrize(
  'kwargs,match',
  [
    (dict(loss_type='nll'), 'loss_type'),
    (dict(parameterization='x0'), 'parameterization'),
    (dict(num_steps=-1), 'num_steps'),
    (dict(num_steps=2.5), 'num_steps'),
    (dict(t_min=1.0), 't_min'),
    (dict(t_min=-0.1), 't_min'),
    (dict(vocab_size=1), 'vocab_size'),
  ],
)
@pytest.mark.parametrize('cls', [UniformDiffusion, InterpolatingDiffusion])
def test_bad_input_names_the_fix(cls, kwargs, match):
  args = dict(schedule=LOGLINEAR, vocab_size=5)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    cls(**args)


@pytest.mark.parametrize('mixing', [-0.1, 1.5])
def test_bad_mixing_names_the_range(mixing):
  with pytest.raises(ValueError, match=r'mixing .*\[0, 1\]'):
    InterpolatingDiffusion(LOGLINEAR, 5, mixing=mixing)
