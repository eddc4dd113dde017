"""Duo: the Gaussian-to-discrete map, its schedule and the curriculum."""

from __future__ import annotations

import copy
import functools
import math
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import MaskedDiffusion, duo
from ddlm_jax.diffusion.duo import DuoDiffusion
from ddlm_jax.diffusion.schedules import LogLinearSchedule
from ddlm_jax.diffusion.uniform import UniformDiffusion, uniform_marginal
from ddlm_jax.models import Transformer, TransformerConfig

N_DRAWS = 200_000

# Jitted lookups: one compiled program per shape instead of op-by-op eager
# dispatch (which compiles every primitive separately on first use).
_alpha = jax.jit(duo.keep_probability, static_argnums=1)
_dalpha = jax.jit(duo.keep_probability_dgamma, static_argnums=1)


def _argmax_hit_rate(seed, gamma, vocab, n=N_DRAWS):
  """Monte-Carlo P[argmax(m e_0 + eps) = 0], m = exp(-gamma / 2) (numpy)."""
  w = np.random.default_rng(seed).standard_normal((n, vocab))
  w[:, 0] += math.exp(-gamma / 2)
  return np.mean(np.argmax(w, -1) == 0)


@pytest.mark.parametrize('vocab', [2, 5, 50])
def test_map_matches_monte_carlo_argmax(vocab):
  # P[argmax = x] against 200k draws: 5 binomial standard errors (a false
  # alarm has probability ~6e-7 per point) plus the lookup's own error.
  table = duo.argmax_table(vocab)
  for i, gamma in enumerate([-4.0, -1.0, 0.5, 2.5]):
    p_hat = _argmax_hit_rate(10 * vocab + i, gamma, vocab)
    p = np.interp(math.exp(-gamma / 2), table.mean_shift, table.prob)
    tol = 5 * math.sqrt(p * (1 - p) / N_DRAWS) + 1e-5
    assert abs(p_hat - p) < tol, (vocab, gamma, p_hat, p)
    alpha = float(_alpha(gamma, vocab))
    np.testing.assert_allclose(alpha, (vocab * p - 1) / (vocab - 1), atol=1e-6)


def test_latent_argmax_is_the_uniform_marginal():
  # z_t = argmax(w_t) from the JAX sampler, class by class, against
  # uniform_marginal(x, alpha(gamma)); 5 binomial standard errors each.
  vocab, n, gamma = 5, 200_000, 0.3
  x = jnp.arange(n, dtype=jnp.int32)[None] % vocab
  w_BxLxV = duo.gaussian_latent(jax.random.key(0), x, jnp.array([gamma]), vocab)
  assert w_BxLxV.shape == (1, n, vocab)
  offset = np.asarray((jnp.argmax(w_BxLxV, -1) - x) % vocab)[0]
  freq = np.bincount(offset, minlength=vocab) / n
  alpha = _alpha(gamma, vocab)
  # Shifting each class to x = 0 pools all positions into one histogram.
  x0 = jax.nn.one_hot(jnp.zeros(1, jnp.int32), vocab)
  q = np.asarray(uniform_marginal(x0, alpha))
  q = q.reshape(vocab)
  tol = 5 * np.sqrt(q * (1 - q) / n)
  assert np.all(np.abs(freq - q) < tol), (freq, q)
  assert 0.2 < float(alpha) < 0.8  # a point where the test has power


def test_map_two_classes_closed_form():
  # V = 2: argmax = x iff m + e1 - e2 > 0, so P = Phi(m / sqrt 2) and
  # alpha = 2 P - 1 = erf(m / 2): the quadrature is exact to float64.
  table = duo.argmax_table(2)
  m = table.mean_shift
  exact = np.array([math.erf(v / 2) for v in m])
  np.testing.assert_allclose(2 * table.prob - 1, exact, atol=1e-14)
  gamma = jnp.linspace(-8.0, 8.0, 257)
  lookup = np.asarray(_alpha(gamma, 2))
  exact = np.array([math.erf(math.exp(-g / 2) / 2) for g in np.asarray(gamma)])
  np.testing.assert_allclose(lookup, exact, atol=2e-6)


def test_lookups_are_linear_interpolation_of_the_table():
  vocab = 50
  table = duo.argmax_table(vocab)
  gamma = np.linspace(-12.0, 12.0, 2001)  # m from 2.5e-3 to 403 (> the end)
  m = np.exp(-gamma / 2)
  p = np.interp(m, table.mean_shift, table.prob)
  alpha = (vocab * p - 1) / (vocab - 1)
  got = _alpha(jnp.asarray(gamma, jnp.float32), vocab)
  np.testing.assert_allclose(got, alpha, atol=2e-6)
  dp = np.interp(m, table.mean_shift, table.dprob, right=0.0)
  got = _dalpha(jnp.asarray(gamma, jnp.float32), vocab)
  np.testing.assert_allclose(got, vocab / (vocab - 1) * dp * -m / 2, atol=2e-6)
  assert np.all(np.asarray(got)[m > table.mean_shift[-1]] == 0.0)


@pytest.mark.parametrize('vocab', [2, 5, 50, 50257])
def test_alpha_is_monotone_with_the_right_limits(vocab):
  gamma = jnp.linspace(-40.0, 40.0, 4001)
  alpha = np.asarray(_alpha(gamma, vocab))
  assert np.all(np.diff(alpha) <= 0)
  assert alpha[0] == pytest.approx(1.0, abs=1e-6)  # m = e^20: always x
  assert alpha[-1] < 1e-7  # m = e^-20: the argmax is uniform
  table = duo.argmax_table(vocab)
  assert table.prob[0] == 1.0 / vocab
  assert np.all(np.diff(table.prob) >= 0)
  assert table.prob[-1] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize('vocab', [2, 5, 50, 50257])
def test_derivative_table_matches_finite_differences(vocab):
  # The analytic P'(m) = int (z - m) phi(z - m) Phi(z)^(V-1) dz against
  # central differences of P on the grid (error ~ h^2 / 6 |P'''|).
  table = duo.argmax_table(vocab)
  fd = np.gradient(table.prob, table.mean_shift)
  np.testing.assert_allclose(table.dprob[1:-1], fd[1:-1], atol=5e-6)
  assert np.all(table.dprob >= 0)


def test_schedule_derivative_is_the_chain_rule():
  sched = duo.GaussianArgmaxSchedule(50, gamma_min=-3.0, gamma_max=1.0)
  t = jnp.linspace(0.02, 0.98, 49)
  d = 1e-2

  @jax.jit
  def run(t):
    fd = (sched.alpha(t + d) - sched.alpha(t - d)) / (2 * d)
    gamma = sched.gamma(t)
    a, s = duo.latent_coefficients(gamma)
    alpha = duo.keep_probability(gamma, 50)
    return fd, sched.dalpha(t), gamma, sched.alpha(t), alpha, a, s

  fd, dalpha, gamma, sched_alpha, alpha, a, s = run(t)
  # Central difference error ~ d^2 / 6 |alpha'''| and float32 rounding.
  np.testing.assert_allclose(dalpha, fd, atol=2e-3, rtol=2e-3)
  assert np.all(np.asarray(dalpha) < 0)
  np.testing.assert_allclose(gamma, -3.0 + 4.0 * t, atol=1e-6)
  np.testing.assert_allclose(sched_alpha, alpha, atol=0)
  np.testing.assert_allclose(a**2 + s**2, 1.0, atol=1e-6)
  np.testing.assert_allclose(a / s, np.exp(-np.asarray(gamma) / 2), rtol=1e-5)


def test_table_is_built_once_per_vocab_and_grid():
  vocab = 13  # used by no other test: the first call below is the miss
  misses = duo.argmax_table.cache_info().misses
  first = duo.argmax_table(vocab)
  assert duo.argmax_table.cache_info().misses == misses + 1
  sched = duo.GaussianArgmaxSchedule(vocab)
  jax.jit(sched.alpha)(jnp.linspace(0, 1, 5))
  jax.jit(sched.dalpha)(jnp.float32(0.5))
  jax.jit(duo.GaussianArgmaxSchedule(vocab).alpha)(jnp.float32(0.3))
  assert duo.argmax_table.cache_info().misses == misses + 1
  assert duo.argmax_table(vocab) is first
  assert not first.prob.flags.writeable
  duo.argmax_table(vocab, 0.01)  # another grid is another table
  assert duo.argmax_table.cache_info().misses == misses + 2


def test_schedule_rejects_bad_input():
  with pytest.raises(ValueError, match='must be < gamma_max'):
    duo.GaussianArgmaxSchedule(10, gamma_min=-1.0, gamma_max=-1.0)
  with pytest.raises(ValueError, match='vocab_size must be an integer >= 2'):
    duo.GaussianArgmaxSchedule(1)
  with pytest.raises(ValueError, match='finite'):
    duo.GaussianArgmaxSchedule(10, gamma_min=-math.inf)
  with pytest.raises(ValueError, match='grid_step'):
    duo.argmax_table(10, 0.5)


V = 6
L = 8


def _duo(curriculum_steps=10, **kwargs):
  base = UniformDiffusion(LogLinearSchedule(), V)
  return DuoDiffusion(
    base, curriculum_steps, gamma_min=-2.0, gamma_max=1.0, **kwargs
  )


def _linear_apply():
  """A differentiable stand-in network: token ids or soft rows [B, L, V]."""
  emb = jax.random.normal(jax.random.key(7), (V, V))

  def apply(params, inp, t_B):
    rows = inp if inp.ndim == 3 else jax.nn.one_hot(inp, V)
    return (rows @ (params * emb)) * (1.0 + t_B[:, None, None])

  return apply


def _data(seed=0, batch=4):
  return jax.random.randint(jax.random.key(seed), (batch, L), 0, V)


def test_equivalent_time_inverts_the_base_schedule():
  proc = _duo()
  t = jnp.linspace(0.0, 1.0, 11)

  @jax.jit
  def run(t):
    alpha = proc.window_schedule.alpha(t)
    t_net = duo.equivalent_time(proc.base.schedule, alpha)
    return alpha, t_net, proc.base.schedule.alpha(t_net)

  alpha, t_net, alpha_net = run(t)
  np.testing.assert_allclose(alpha_net, alpha, atol=1e-6)
  # Log-linear: alpha = 1 - (1 - eps) t has the closed-form inverse.
  np.testing.assert_allclose(t_net, (1 - alpha) / (1 - 1e-3), atol=1e-6)


def test_curriculum_step_is_the_window_bound_of_the_soft_input():
  proc = _duo(curriculum_nelbo='window')
  apply = _linear_apply()
  key, x = jax.random.key(3), _data()
  seen = []

  def net(inp, t_B):
    seen.append(inp.ndim)
    return apply(jnp.float32(1.0), inp, t_B)

  @jax.jit
  def run():
    got = proc.loss(net, key, x, step=0)
    t, w, z, soft, t_net = proc.curriculum_draw(jax.random.fold_in(key, 1), x)
    want = proc.window.bound(net(soft, t_net), x, z, t, w, None)
    return got, want, (z, soft, t_net)

  (obj, nelbo, aux), want, (z, soft, t_net) = run()
  assert 3 in seen  # the network was given the soft input
  np.testing.assert_allclose(soft.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_array_equal(jnp.argmax(soft, -1), z)
  np.testing.assert_allclose(obj, want[0], rtol=1e-6)
  np.testing.assert_allclose(nelbo, want[1], rtol=1e-6)
  np.testing.assert_allclose(aux['t'], t_net, rtol=1e-6)
  assert float(aux['duo_curriculum']) == 1.0
  # The window's bound includes its endpoint terms: alpha(0) < 1 costs a
  # reconstruction term and alpha(1) > 0 a prior KL.
  recon, prior = proc.window.constant_nats()
  assert recon > 0 and prior > 0
  assert np.all(np.asarray(nelbo) >= (recon + prior) * L - 1e-4)


def test_default_curriculum_nelbo_is_the_base_bound():
  proc = _duo()
  apply = _linear_apply()
  key, x = jax.random.key(4), _data()

  def duo_loss(p):
    return proc.loss(lambda i, t: apply(p, i, t), key, x, step=3)

  @jax.jit
  def run(p):
    net = lambda inp, t_B: apply(p, inp, t_B)
    # The reported bound carries no gradient; the objective does.
    grads = [jax.grad(lambda p, i=i: duo_loss(p)[i].sum())(p) for i in (0, 1)]
    return duo_loss(p), proc.base.loss(net, key, x), grads

  (obj, nelbo, _), (base_obj, base_nelbo, _), grads = run(jnp.float32(1.0))
  np.testing.assert_allclose(nelbo, base_nelbo, rtol=1e-6)
  assert not np.allclose(obj, base_obj)  # trained on the curriculum
  assert float(grads[0]) != 0.0 and float(grads[1]) == 0.0


def test_after_the_curriculum_the_loss_is_exactly_base_loss():
  proc = _duo(curriculum_steps=5)
  apply = _linear_apply()
  key, x = jax.random.key(5), _data()
  mask = jnp.ones((4, L)).at[0, -3:].set(0.0)

  def duo_loss(p, step):
    return proc.loss(lambda i, t: apply(p, i, t), key, x, mask, step=step)

  def base_loss(p):
    return proc.base.loss(lambda i, t: apply(p, i, t), key, x, mask)

  @jax.jit  # one program: the step is traced
  def run(p, step):
    # step None (evaluation) is the base, without a cond.
    return duo_loss(p, step), duo_loss(p, None), base_loss(p)

  for step in (5, 6, 10**6):
    got, evaluation, want = run(jnp.float32(1.0), jnp.int32(step))
    for g, e, b in zip(got[:2], evaluation[:2], want[:2]):
      np.testing.assert_allclose(g, b, rtol=1e-6, atol=0)
      np.testing.assert_allclose(e, b, rtol=1e-6, atol=0)
    np.testing.assert_allclose(got[2]['t'], want[2]['t'], rtol=1e-6)
    assert float(got[2]['duo_curriculum']) == 0.0
  got, _, want = run(jnp.float32(1.0), jnp.int32(4))
  assert float(got[2]['duo_curriculum']) == 1.0
  assert not np.allclose(got[0], want[0])
  assert proc.evaluation_process is proc.base


def test_soft_input_trains_a_tiny_transformer():
  proc = _duo(curriculum_nelbo='window')
  cfg = TransformerConfig(
    vocab_size=V,
    input_vocab_size=proc.input_vocab_size,
    width=16,
    depth=1,
    num_heads=2,
    time_conditioning=True,
    cond_dim=16,
  )

  def make():
    net = Transformer(cfg, rngs=nnx.Rngs(0))
    # The head starts at zero, which would stop every gradient below it.
    kernel = net.head.kernel
    kernel[...] = jax.random.normal(jax.random.key(2), kernel.shape)
    return net

  graph = nnx.graphdef(nnx.eval_shape(make))
  params = jax.jit(lambda: nnx.state(make()))()  # one program, not eager
  x = _data(batch=2)

  @functools.partial(jax.jit, static_argnums=1)
  def grads(params, step):
    def loss(params):
      obj, nelbo, aux = proc.loss(
        nnx.merge(graph, params), jax.random.key(1), x, step=step
      )
      return obj.sum(), (nelbo, aux)

    return jax.grad(loss, has_aux=True)(params)

  # A Python step compiles the curriculum branch alone (the traced-step
  # cond is covered with the stand-in network above).
  g, (nelbo, aux) = grads(params, 0)
  assert float(aux['duo_curriculum']) == 1.0
  assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(g))
  block = g['blocks'][0]
  for grad in (g['head']['kernel'], block['mlp']['up']['kernel']):
    assert np.abs(np.asarray(grad[...])).max() > 0
  # The time input reaches the (zero-initialised) adaLN modulation.
  assert np.abs(np.asarray(block['modulation']['kernel'][...])).max() > 0
  # The embedding, read through the soft rows, is trained.
  assert np.abs(np.asarray(g['embedding'][...])).max() > 0
  assert np.isfinite(np.asarray(nelbo)).all()


def test_forwards_the_base_interface():
  proc = _duo()
  assert proc.vocab_size == V and proc.input_vocab_size == V
  assert proc.schedule is proc.base.schedule
  assert proc.family == 'uniform' and proc.requires_time_conditioning
  assert proc.uses_step and not proc.causal
  logits = jax.random.normal(jax.random.key(0), (2, 3, V))
  z, t = jnp.zeros((2, 3), jnp.int32), jnp.full((2,), 0.4)
  np.testing.assert_array_equal(
    proc.denoiser_log_probs(logits, z, t),
    proc.base.denoiser_log_probs(logits, z, t),
  )
  assert proc.loo_log_probs == proc.base.loo_log_probs  # via __getattr__
  # The curriculum's process: the base with the window schedule on [0, 1].
  window = proc.window
  assert window.schedule == duo.GaussianArgmaxSchedule(V, -2.0, 1.0)
  assert (window.num_steps, window.t_min) == (0, 0.0)
  assert window.loss_type == proc.base.loss_type
  hash(proc)  # a static argument of jitted evaluators
  assert copy.deepcopy(proc) == proc == pickle.loads(pickle.dumps(proc))
  with pytest.raises(AttributeError):
    proc.no_such_attribute  # noqa: B018


def test_duo_rejects_bad_input():
  base = UniformDiffusion(LogLinearSchedule(), V)
  with pytest.raises(ValueError, match='must be < gamma_max'):
    DuoDiffusion(base, 10, gamma_min=-1.0, gamma_max=-2.0)
  with pytest.raises(ValueError, match='tau must be a finite number > 0'):
    DuoDiffusion(base, 10, tau=0.0)
  with pytest.raises(ValueError, match='curriculum_steps must be an int >= 0'):
    DuoDiffusion(base, -1)
  with pytest.raises(ValueError, match='curriculum_nelbo'):
    DuoDiffusion(base, 10, curriculum_nelbo='train')
  with pytest.raises(ValueError, match='wraps a UniformDiffusion'):
    DuoDiffusion(MaskedDiffusion(LogLinearSchedule(), V), 10)
