"""Masked-diffusion math against closed forms (MDLM, arXiv 2406.07524; MD4,
arXiv 2406.04329)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import Autoregressive, MaskedDiffusion, get_schedule
from ddlm_jax.diffusion.masked import antithetic_uniform, subs_logits

SCHEDULES = [
  ('linear', {}),
  ('cosine', {}),
  ('poly', {'k': 3.0}),
  ('loglinear', {}),
]


@pytest.mark.parametrize('name,kwargs', SCHEDULES)
def test_schedule_endpoints_and_monotone(name, kwargs):
  s = get_schedule(name, **kwargs)
  eps = s.eps
  t = jnp.linspace(0.0, 1.0, 101)
  a = np.asarray(s.alpha(t))
  assert np.all(np.diff(a) < 0)
  if name == 'loglinear':
    np.testing.assert_allclose(a[0], 1.0, rtol=1e-6)
    np.testing.assert_allclose(a[-1], eps, rtol=1e-4)
  else:
    np.testing.assert_allclose(a[0], 1.0 - eps, rtol=1e-6)
    np.testing.assert_allclose(a[-1], eps, rtol=1e-3)


@pytest.mark.parametrize('name,kwargs', SCHEDULES)
def test_schedule_derivative_by_finite_differences(name, kwargs):
  s = get_schedule(name, **kwargs)
  t = np.linspace(0.05, 0.95, 19)
  h = 1e-5
  with jax.enable_x64(True):
    t64 = jnp.asarray(t, jnp.float64)
    fd = (s.alpha(t64 + h) - s.alpha(t64 - h)) / (2 * h)
    np.testing.assert_allclose(np.asarray(s.dalpha(t64)), fd, rtol=1e-6)


def test_loglinear_weight_is_one_over_t():
  s = get_schedule('loglinear')
  t = jnp.linspace(0.01, 1.0, 50)
  generic = -s.dalpha(t) / (1.0 - s.alpha(t))
  np.testing.assert_allclose(s.weight(t), 1.0 / t, rtol=1e-5)
  np.testing.assert_allclose(generic, 1.0 / t, rtol=1e-4)


def test_unknown_schedule_names_choices():
  with pytest.raises(ValueError, match='loglinear'):
    get_schedule('cosinee')


def test_antithetic_times_are_stratified():
  t = np.sort(np.asarray(antithetic_uniform(jax.random.key(3), 16)))
  np.testing.assert_allclose(np.diff(t), 1.0 / 16, atol=1e-6)
  assert 0.0 <= t.min() and t.max() < 1.0


def test_corrupt_masks_at_rate_one_minus_alpha():
  proc = MaskedDiffusion(get_schedule('cosine'), vocab_size=7)
  x = jnp.zeros((4, 20_000), jnp.int32)
  t = jnp.array([0.1, 0.4, 0.7, 0.95])
  z = proc.corrupt(jax.random.key(0), x, t)
  frac = np.asarray((z == proc.mask_id).mean(-1))
  expect = 1.0 - np.asarray(proc.schedule.alpha(t))
  np.testing.assert_allclose(frac, expect, atol=4 * 0.5 / math.sqrt(20_000))
  assert set(np.unique(z)) <= {0, proc.mask_id}


def _uniform_apply(vocab):
  return lambda z, t: jnp.zeros(z.shape + (vocab,), jnp.float32)


@pytest.mark.parametrize('name', ['loglinear', 'linear', 'cosine'])
@pytest.mark.parametrize('num_steps', [0, 8])
def test_uniform_denoiser_nelbo_is_log_v(name, num_steps):
  """Closed form: log V nats per token for the full bound (the prior's
  alpha(1) log V included); MDLM's convention, without the prior, gives
  (1 - eps) log V (tests/test_full_bound.py separates the two exactly)."""
  vocab, batch, length = 50, 512, 64
  proc = MaskedDiffusion(
    get_schedule(name), vocab_size=vocab, num_steps=num_steps
  )
  x = jax.random.randint(jax.random.key(1), (batch, length), 0, vocab)
  estimates = []
  for i in range(4):
    _, nelbo_B, _ = proc.loss(_uniform_apply(vocab), jax.random.key(i), x)
    estimates.append(np.asarray(nelbo_B) / length)
  est = np.concatenate(estimates)
  expect = math.log(vocab)
  stderr = est.std() / math.sqrt(est.size)
  assert abs(est.mean() - expect) < 4 * stderr + 1e-4, (est.mean(), expect)


def _expected_nelbo(proc, t, w, ce_of_t):
  """E over masking of the NELBO/token for a CE that depends only on t."""
  return np.mean(w * (1 - proc.schedule.alpha(t)) * ce_of_t(t))


def test_discrete_nelbo_converges_to_continuous_from_above():
  """T-step NELBO >= continuous NELBO and -> it as T grows."""
  ce_of_t = lambda t: 0.2 + 3.0 * t**2  # A denoiser better at low noise.
  batch = 200_000
  key = jax.random.key(0)
  cont = MaskedDiffusion(get_schedule('cosine'), vocab_size=10)
  t, w = cont.sample_times(key, batch)
  ref = _expected_nelbo(cont, t, w, ce_of_t)
  gaps = []
  for steps in [2, 8, 32, 128]:
    proc = MaskedDiffusion(get_schedule('cosine'), 10, num_steps=steps)
    t, w = proc.sample_times(key, batch)
    # The discrete step s -> t evaluates the denoiser at t.
    gaps.append(_expected_nelbo(proc, t, w, ce_of_t) - ref)
  gaps = np.array(gaps)
  assert np.all(gaps > -1e-4), gaps
  assert np.all(np.diff(gaps) < 0), gaps
  assert gaps[-1] < 0.02 * ref


def test_subs_carries_unmasked_tokens():
  mask_id = 5
  logits = jax.random.normal(jax.random.key(0), (2, 6, 5))
  z = jnp.array([[0, 5, 2, 5, 4, 1], [5, 5, 5, 5, 5, 3]])
  out = np.asarray(subs_logits(logits, z, mask_id))
  probs = jax.nn.softmax(out, -1)
  for b in range(2):
    for i in range(6):
      if z[b, i] == mask_id:
        np.testing.assert_allclose(out[b, i], logits[b, i])
      else:
        assert probs[b, i, z[b, i]] == pytest.approx(1.0)


def test_loss_only_counts_masked_positions():
  """A denoiser wrong everywhere but right on masked tokens has zero CE."""
  vocab = 6
  proc = MaskedDiffusion(get_schedule('loglinear'), vocab_size=vocab)
  x = jax.random.randint(jax.random.key(0), (8, 32), 0, vocab)

  def oracle(z, t):
    del t
    good = jax.nn.one_hot(x, vocab) * 1e4
    bad = jax.nn.one_hot((x + 1) % vocab, vocab) * 1e4
    return jnp.where((z == proc.mask_id)[..., None], good, bad)

  _, nelbo_B, _ = proc.loss(oracle, jax.random.key(1), x)
  # Only the prior term is left: alpha(1) ln V per token (the full bound).
  prior = proc.constant_nats()[1]
  np.testing.assert_allclose(nelbo_B, 32 * prior, rtol=1e-5)


def test_reverse_probs_normalised():
  proc = MaskedDiffusion(get_schedule('linear'), vocab_size=4)
  p = jax.nn.softmax(jax.random.normal(jax.random.key(0), (3, 5, 4)))
  q = proc.reverse_probs(p, None, jnp.float32(0.3), jnp.float32(0.6))
  np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)


def test_autoregressive_nll_exact_for_known_model():
  """A causal 'model' that predicts x_i from x_{i-1} perfectly: zero NLL."""
  vocab = 5
  proc = Autoregressive(vocab)
  x = jnp.array([[1, 2, 3, 4, 0, 1]])

  def bigram(inp, t):
    del t
    nxt = jnp.where(inp == proc.bos_id, 1, (inp + 1) % vocab)
    return jax.nn.one_hot(nxt, vocab) * 1e4

  nll_B = proc.loss(bigram, None, x)[1]
  np.testing.assert_allclose(nll_B, 0.0, atol=1e-3)
  uniform = proc.loss(lambda i, t: jnp.zeros(i.shape + (vocab,)), None, x)[1]
  np.testing.assert_allclose(uniform, 6 * math.log(vocab), rtol=1e-6)


def test_simple_ce_trains_on_unweighted_masked_ce_and_reports_the_nelbo():
  """loss_type='simple_ce' (arXiv 2602.15014): the objective is the masked
  tokens' cross-entropy without the ELBO weight; nelbo_B is unchanged."""
  from ddlm_jax.diffusion.masked import token_cross_entropy

  vocab, batch, length = 5, 4, 6
  x_BxL = jax.random.randint(jax.random.key(0), (batch, length), 0, vocab)
  table_VxV = jax.random.normal(jax.random.key(1), (vocab + 1, vocab))
  apply = lambda z_BxL, t_B: table_VxV[z_BxL]
  kwargs = dict(schedule=get_schedule('loglinear'), vocab_size=vocab)
  key = jax.random.key(2)
  elbo = MaskedDiffusion(**kwargs).loss(apply, key, x_BxL)
  ce = MaskedDiffusion(**kwargs, loss_type='simple_ce').loss(apply, key, x_BxL)
  np.testing.assert_allclose(ce[1], elbo[1], rtol=1e-6)  # same NELBO
  np.testing.assert_allclose(elbo[0], elbo[1], rtol=1e-6)
  t_B, weight_B, z_BxL = MaskedDiffusion(**kwargs).draw(key, x_BxL)
  masked_BxL = z_BxL == vocab
  ce_B = jnp.sum(
    jnp.where(masked_BxL, token_cross_entropy(apply(z_BxL, t_B), x_BxL), 0.0),
    -1,
  )
  np.testing.assert_allclose(ce[0], ce_B, rtol=1e-5)
  assert masked_BxL.any() and not np.allclose(ce[0], elbo[0])
  with pytest.raises(ValueError, match='loss_type'):
    MaskedDiffusion(**kwargs, loss_type='ce')
