"""The bound estimators: unbiased against exact enumeration, lower variance.

A tiny case (3 data tokens, 4 positions, a fixed random denoiser) where the
masked-diffusion bound's expectation over t and masks is computed exactly:
Gauss-Legendre quadrature over t (with the log-linear schedule the
integrand is a polynomial in t per mask pattern) and enumeration of every
mask pattern.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.schedules import get_schedule
from ddlm_jax.evaluation import estimators as est
from ddlm_jax.training.config import ConfigError

V, L, D = 3, 4, 8


def toy_apply():
  """A fixed random denoiser: logits_BxLxV from the whole of z."""
  rng = np.random.default_rng(0)
  emb_LxMxD = jnp.asarray(rng.normal(size=(L, V + 1, D)), jnp.float32)
  out_LxDxV = jnp.asarray(2 * rng.normal(size=(L, D, V)), jnp.float32)

  def apply(z_BxL, t_B):
    del t_B
    onehot_BxLxM = jax.nn.one_hot(z_BxL, V + 1)
    h_BxD = jnp.tanh(jnp.einsum('blm,lmd->bd', onehot_BxLxM, emb_LxMxD))
    return jnp.einsum('bd,ldv->blv', h_BxD, out_LxDxV)

  return apply


PROCESS = MaskedDiffusion(
  schedule=get_schedule('loglinear'), vocab_size=V, t_min=1e-3
)
X = np.array([[0, 2, 1, 2]], np.int32)


def exact_bound(apply, x_L, loss_L, keep_L):
  """E_t E_mask of the estimator: quadrature over t, enumeration of masks."""
  free = [i for i in range(L) if loss_L[i] and not keep_L[i]]
  rest = [i for i in range(L) if not loss_L[i] and not keep_L[i]]
  nodes, weights = np.polynomial.legendre.leggauss(24)
  lo = PROCESS.t_min  # t ~ U[lo, 1]: density 1 / (1 - lo).
  t_Q = lo + (1.0 - lo) * 0.5 * (nodes + 1.0)
  w_Q = 0.5 * weights
  alpha_Q = np.asarray(PROCESS.schedule.alpha(t_Q), np.float64)
  tw_Q = np.asarray(PROCESS.time_weight(jnp.asarray(t_Q)), np.float64)
  total = 0.0
  for pattern in itertools.product([0, 1], repeat=len(free)):
    z = np.array(x_L)
    for i in rest:
      z[i] = V
    for i, m in zip(free, pattern):
      if m:
        z[i] = V
    logp = np.asarray(jax.nn.log_softmax(apply(z[None], None)[0]))
    ce = sum(-logp[i, x_L[i]] for i, m in zip(free, pattern) if m)
    k = sum(pattern)
    prob_Q = (1 - alpha_Q) ** k * alpha_Q ** (len(free) - k)
    total += ce * np.sum(w_Q * tw_Q * prob_Q)
  recon, prior = PROCESS.constant_nats()
  return total + (recon + prior) * sum(loss_L)


def draws(estimator, samples, repeats, loss_L, keep_L=None, share=False):
  """[repeats] estimates of `samples` draws each (one per seed)."""
  apply = toy_apply()
  keep = None if keep_L is None else jnp.asarray([keep_L], jnp.float32)

  @jax.jit
  def one(key):
    return est.masked_bound_draws(
      PROCESS,
      apply,
      key,
      jnp.asarray(X),
      jnp.asarray([loss_L], jnp.float32),
      keep,
      samples=samples,
      estimator=estimator,
      share_across_samples=share,
    )[:, 0]

  keys = jax.random.split(jax.random.key(1), repeats)
  return np.asarray(jax.vmap(one)(keys), np.float64)  # [repeats, S]


CASES = {
  'full': ([1, 1, 1, 1], None),
  'conditional': ([0, 0, 1, 1], [1, 1, 0, 0]),  # Context kept, loss on 2..3.
  'middle': ([0, 1, 1, 0], [1, 0, 0, 0]),  # Last position always masked.
}


@pytest.mark.parametrize('estimator', est.ESTIMATORS)
@pytest.mark.parametrize('case', sorted(CASES))
def test_unbiased_against_exact_enumeration(estimator, case):
  loss_L, keep_L = CASES[case]
  exact = exact_bound(toy_apply(), X[0], loss_L, keep_L if keep_L else [0] * L)
  y_RxS = draws(estimator, 8, 2000, loss_L, keep_L)
  means = y_RxS.mean(1)
  stderr = means.std(ddof=1) / np.sqrt(len(means))
  assert abs(means.mean() - exact) < 4 * stderr + 1e-4, (
    means.mean(),
    exact,
    stderr,
  )


def test_variance_reduction_over_iid():
  """Integrating t out ('counts') beats i.i.d. draws at equal draws by far;
  stratifying t alone does not (the 1/t weight puts the variance in the
  mask draw at small t), which is why 'counts' is the default."""
  loss_L = [1, 1, 1, 1]
  var = {e: draws(e, 8, 2000, loss_L).mean(1).var() for e in est.ESTIMATORS}
  assert var['counts'] < 0.25 * var['iid'], var
  assert var['counts'] < min(var['stratified'], var['antithetic']), var


@pytest.mark.parametrize('estimator', est.ESTIMATORS)
def test_standard_error_matches_spread(estimator):
  """The reported standard error tracks the spread over seeds (the
  collapsed-strata one may overstate it, never understate it much)."""
  y_RxS = draws(estimator, 8, 2000, [1, 1, 1, 1])
  means = y_RxS.mean(1)
  _, stderr_R = est.mean_and_stderr(y_RxS.T, estimator)
  reported = np.sqrt(np.mean(stderr_R**2))
  actual = means.std(ddof=1)
  assert 0.85 * actual < reported < 2.0 * actual, (reported, actual)


@pytest.mark.parametrize('estimator', est.ESTIMATORS)
def test_estimate_does_not_depend_on_the_batch(estimator):
  """A row scored alone or next to another gets the same draws (the
  randomness comes from the seed and positions, never the batch)."""
  apply = toy_apply()
  x_2xL = jnp.asarray([[0, 2, 1, 2], [1, 1, 0, 2]])
  loss = jnp.asarray([[0, 0, 1, 1], [0, 1, 1, 1]], jnp.float32)
  key = jax.random.key(3)
  kw = dict(samples=4, estimator=estimator)
  both = est.masked_bound_draws(
    PROCESS, apply, key, x_2xL, loss, 1.0 - loss, **kw
  )
  alone = est.masked_bound_draws(
    PROCESS, apply, key, x_2xL[:1], loss[:1], 1.0 - loss[:1], **kw
  )
  np.testing.assert_allclose(both[:, 0], alone[:, 0], rtol=1e-6)


def test_time_uniforms_cover_strata_and_pairs():
  u = np.asarray(est.time_uniforms('stratified', jax.random.key(0), 8))
  assert np.array_equal(np.floor(u * 8), np.arange(8))
  u = np.asarray(est.time_uniforms('antithetic', jax.random.key(0), 8))
  np.testing.assert_allclose(u[:4] + u[4:], 1.0, atol=1e-6)


def test_bad_settings_refused():
  with pytest.raises(ConfigError, match='choose one of'):
    est.check_estimator('sobol', 8)
  with pytest.raises(ConfigError, match='must be even'):
    est.check_estimator('antithetic', 3)
  est.check_estimator('iid', 3)


def test_evaluate_likelihood_with_an_estimator():
  """Through `evaluate_likelihood` on a network whose head starts at zero
  (a uniform denoiser, whose bound is exactly L log V): 'counts' draws are
  (nearly) constant and land on it; i.i.d. draws agree within errors."""
  from flax import nnx

  from ddlm_jax.evaluation.likelihood import evaluate_likelihood
  from ddlm_jax.training import builders
  from experiments.configs import quickstart

  c = quickstart.get_config('smoke')
  process = builders.make_process(builders.process_settings(c.process), 7)
  net = builders.model_builder(c.model, process)(rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(net, nnx.Param)
  x = np.random.default_rng(0).integers(0, 7, (4, 16)).astype(np.int32)
  run = lambda e, s: evaluate_likelihood(
    params,
    graphdef,
    process,
    [x],
    key=jax.random.key(0),
    time_samples=s,
    estimator=e,
  )['nats_per_token']
  head_zero = run('counts', 4)
  assert head_zero == pytest.approx(np.log(7), rel=5e-3)
  assert run('iid', 64) == pytest.approx(np.log(7), rel=0.1)


def test_eval_estimator_switch_in_the_zero_shot_suite():
  """`eval.estimator` picks the draws of the zero-shot suite (default 'iid',
  what every recorded number used) and is checked before any compute. On
  a uniform denoiser (head at zero) 'counts' lands on L log V per row,
  where 2 i.i.d. draws scatter around it."""
  import types

  from flax import nnx

  from ddlm_jax.data import sources
  from ddlm_jax.evaluation import zero_shot
  from ddlm_jax.evaluation.likelihood import config_estimator
  from ddlm_jax.training import builders
  from experiments.configs import quickstart

  c = quickstart.get_config('smoke')
  vocab = 7
  process = builders.make_process(builders.process_settings(c.process), vocab)
  assert config_estimator(c, process) == 'iid'  # Unset: the old draws.
  net = builders.model_builder(c.model, process)(rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(net, nnx.Param)
  length = c.data.seq_len
  tokens = np.random.default_rng(0).integers(0, vocab, 4 * length)
  run = types.SimpleNamespace(
    config=c,
    settings=builders.typed_blocks(c),
    process=process,
    graphdef=graphdef,
    eval_params=lambda: params,
  )
  rows = sources.PackedSplit(tokens.astype(np.int32), bos=None, eos=None)

  def score(estimator):
    c.eval.estimator = estimator
    return zero_shot.score_rows(
      run, rows, batch_size=2, max_batches=None, time_samples=2, seed=0
    )

  target = length * np.log(vocab)
  counts, iid = score('counts'), score('iid')
  assert counts.shape == iid.shape == (4,)
  np.testing.assert_allclose(counts, target, rtol=5e-3)
  assert np.abs(iid - target).max() > 10 * np.abs(counts - target).max()
  c.eval.estimator = 'sobol'
  with pytest.raises(ConfigError, match='eval.estimator='):
    config_estimator(c, process)
  c.eval.estimator = 'counts'
  c.model.time_conditioning = True
  with pytest.raises(ConfigError, match='time-conditioned'):
    config_estimator(c, process)


def test_run_reads_eval_estimator_and_refuses_a_bad_one_before_writing(
  tmp_path,
):
  from ddlm_jax.tasks.language_model import Run
  from ddlm_jax.training.config import ConfigError
  from experiments.configs import quickstart

  config = quickstart.get_config('smoke')
  config.mesh.shape = (1, 1, 1)
  config.eval.estimator = 'stratifed'
  with pytest.raises(ConfigError, match='eval.estimator'):
    Run(config, str(tmp_path / 'bad'))
  assert not (tmp_path / 'bad').exists()  # Refused before any file.
  config.eval.estimator = 'stratified'
  run = Run(config, str(tmp_path / 'good'))
  assert run.estimator == 'stratified'
