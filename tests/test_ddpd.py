"""DDPD: the planner's target and loss, and the planned sampler.

The planner learns the latent "was replaced" indicator of uniform-noise
corruption (not "differs from the clean token"); with an oracle planner
that knows the reverse process's latent state and the exact denoiser of
a tiny enumerable source, the planned sampler draws from the data
distribution (checked by enumeration, in total variation); NFE counts
the calls both networks actually make.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import base
from ddlm_jax.diffusion.ddpd import (
  PlannerProcess,
  planner_bce,
  uniform_corrupt,
)
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.schedules import LogLinearSchedule
from ddlm_jax.models.transformer import Transformer
from ddlm_jax.sampling import get_sampler, samplers_for
from ddlm_jax.sampling.ddpd import (
  DDPDSampler,
  gumbel_top_k,
  planned_denoise,
)
from ddlm_jax.training.builders import check_process, transformer_config
from ddlm_jax.training.config import ConfigError
from experiments.configs import ddpd as ddpd_config

# ------------------------------------------------------------ the planner --


def test_target_is_the_replaced_indicator_not_a_difference():
  """With V = 2 half the uniform draws equal the clean token: those
  positions still count as noise, and no unreplaced position changed."""
  x = jnp.zeros((64, 128), jnp.int32)
  rate = jnp.linspace(0.0, 1.0, 64)
  z, replaced = uniform_corrupt(jax.random.key(0), x, rate, 2)
  z, replaced = np.asarray(z), np.asarray(replaced)
  assert not np.any(z[~replaced] != 0)  # Unreplaced positions are clean.
  same = replaced & (z == 0)  # Replaced by a draw equal to the clean token.
  assert 0.4 < same.sum() / replaced.sum() < 0.6
  # The replaced fraction follows the rate of each row.
  frac = replaced.mean(-1)
  assert np.all(np.abs(frac - np.asarray(rate)) < 0.15)


def test_loss_is_bce_against_the_corruption_mask():
  """The loss of a planner that reads the mask off z equals the BCE of
  those logits against the true replaced indicator, recomputed with the
  same keys; a planner that calls every position clean scores worse."""
  process = PlannerProcess(vocab_size=5, antithetic=False)
  x = jax.random.randint(jax.random.key(1), (8, 16), 0, 5)
  key = jax.random.key(2)
  rate_key, noise_key = jax.random.split(key)
  rate = process.sample_rates(rate_key, 8)
  z, replaced = process.corrupt(noise_key, x, rate)
  logits = jnp.where(replaced, 3.0, -3.0)  # Knows the mask.

  def oracle(z_in, t):
    assert np.array_equal(np.asarray(z_in), np.asarray(z))
    assert np.all(np.asarray(t) == 0)  # Time-free.
    return logits[..., None]

  objective, nelbo, aux = process.loss(oracle, key, x)
  expected = planner_bce(logits, replaced).sum(-1)
  np.testing.assert_allclose(objective, expected, rtol=1e-6)
  np.testing.assert_allclose(nelbo, objective)
  np.testing.assert_allclose(aux['planner_accuracy'], 1.0)
  clean = lambda z_in, t: jnp.full(z_in.shape + (1,), -3.0)
  worse, _, _ = process.loss(clean, key, x)
  assert float(worse.sum()) > float(objective.sum())
  # Padding leaves the loss.
  pad = jnp.ones((8, 16)).at[:, 8:].set(0.0)
  half, _, _ = process.loss(oracle, key, x, pad)
  np.testing.assert_allclose(
    half, planner_bce(logits, replaced)[:, :8].sum(-1), rtol=1e-6
  )


def test_process_declares_one_output_logit_and_the_network_follows():
  process = base.process_config({'kind': 'ddpd_planner'}).build(85)
  assert isinstance(process, PlannerProcess)
  assert process.output_size == 1 and process.input_vocab_size == 85
  model = dict(width=32, depth=1, num_heads=2)
  mcfg = transformer_config(model, process)
  assert (mcfg.vocab_size, mcfg.input_vocab_size) == (1, 85)
  # Every other family keeps its V-way head.
  masked = base.process_config({'kind': 'mdlm'}).build(85)
  assert transformer_config(model, masked).vocab_size == 85


def test_the_one_logit_transformer_learns_to_find_noise():
  """The real network with the head the process declares: a few SGD
  steps on a source of repeated tokens lower the planner's loss."""
  process = PlannerProcess(vocab_size=11)
  mcfg = transformer_config(dict(width=32, depth=1, num_heads=2), process)
  graphdef, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
  x = jnp.tile(jnp.arange(4, dtype=jnp.int32) % 2, (8, 4))  # 0101...

  @jax.jit
  def loss_and_grad(params, key):
    def loss(params):
      apply = nnx.merge(graphdef, params)
      return process.loss(apply, key, x)[0].mean()

    return jax.value_and_grad(loss)(params)

  keys = jax.random.split(jax.random.key(1), 48)
  held_out = keys[:8]
  start = np.mean([float(loss_and_grad(params, k)[0]) for k in held_out])
  for key in keys[8:]:
    _, grads = loss_and_grad(params, key)
    params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
  end = np.mean([float(loss_and_grad(params, k)[0]) for k in held_out])
  assert end < start - 0.5, (start, end)


def test_config_refuses_a_time_conditioned_planner():
  c = ddpd_config.get_config('smoke')
  settings = base.process_config(c.process.to_dict())
  model = ml_collections.ConfigDict(
    dict(c.model.to_dict(), time_conditioning=True)
  )
  with pytest.raises(ConfigError, match='time_conditioning=False'):
    check_process(settings, model, c.data.seq_len)
  with pytest.raises(ValueError, match='vocab_size must be >= 2'):
    PlannerProcess(vocab_size=1)


# ------------------------------------------------------------ the sampler --

V, L = 3, 3
SEQS = np.array(list(itertools.product(range(V), repeat=L)), np.int32)


def _source():
  """A correlated distribution over V^L sequences, with zeros."""
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.full(len(SEQS), 0.3))
  p[rng.random(len(SEQS)) < 0.4] = 0.0
  return p / p.sum()


def exact_denoiser(p_N):
  """log p(x^i | observed positions of z) by enumeration (mask id V)."""
  seqs_NxL = jnp.asarray(SEQS)
  log_p_N = jnp.log(jnp.asarray(p_N, jnp.float32))

  def denoise(z_BxL, t_B):
    del t_B
    ok_BxNxL = (z_BxL[:, None, :] == V) | (z_BxL[:, None, :] == seqs_NxL)
    logw_BxN = jnp.where(jnp.all(ok_BxNxL, -1), log_p_N, -jnp.inf)
    onehot_NxLxV = jax.nn.one_hot(seqs_NxL, V) > 0
    terms = jnp.where(onehot_NxLxV[None], logw_BxN[:, :, None, None], -jnp.inf)
    logits_BxLxV = jax.nn.logsumexp(terms, axis=1)
    return jax.nn.log_softmax(logits_BxLxV, -1)

  return denoise


def _distribution(tokens_BxL):
  index_B = np.asarray(tokens_BxL) @ (V ** np.arange(L - 1, -1, -1))
  return np.bincount(index_B, minlength=len(SEQS)) / len(index_B)


def _run(plan, p_N, steps, batch=20000, final_pass=True, parallel=False):
  x = jax.random.randint(jax.random.key(3), (batch, L), 0, V)
  todo = jnp.ones((batch, L), bool)
  fn = jax.jit(
    lambda key: planned_denoise(
      plan, exact_denoiser(p_N), key, x, todo, num_steps=steps, mask_id=V,
      final_pass=final_pass, parallel=parallel,
    )
  )  # fmt: skip
  tokens, nfe = fn(jax.random.key(4))
  return _distribution(tokens), np.asarray(nfe)


@pytest.mark.parametrize('steps', [L, L + 3])
def test_oracle_planner_and_exact_denoiser_sample_the_data(steps):
  """Oracle: +10 where the loop has not denoised a position, -10 where it
  has. The loop is then random-order AR sampling (and Gibbs steps once
  all are clean), exact for any T >= L; 20000 draws over 27 sequences
  land within 0.03 in total variation."""
  p_N = _source()
  oracle = lambda x, clean: jnp.where(clean, -10.0, 10.0)
  q_N, nfe = _run(oracle, p_N, steps)
  tv = 0.5 * np.abs(q_N - p_N).sum()
  assert tv < 0.03, tv
  assert np.all(q_N[p_N == 0] == 0)  # Never off the support.
  np.testing.assert_array_equal(nfe, [steps + 1, steps + 1])


def test_parallel_steps_with_t_equal_l_take_one_position_each():
  """With T = L and the oracle, the parallel rule's count round(n_i / (T -
  i)) is 1 at every step (n_i a hair above its integer at the last step,
  from the clean positions' sigmoids): the exact one-position sampler."""
  p_N = _source()
  oracle = lambda x, clean: jnp.where(clean, -10.0, 10.0)
  q_N, nfe = _run(oracle, p_N, L, parallel=True)
  assert 0.5 * np.abs(q_N - p_N).sum() < 0.03
  assert np.all(q_N[p_N == 0] == 0)
  np.testing.assert_array_equal(nfe, [L + 1, L + 1])


@pytest.mark.parametrize('steps', [1, 3, 5])
def test_parallel_steps_reach_every_position_in_t_steps(steps):
  """A few-step loop (T < L) with the oracle planner and no final pass:
  every position is denoised within the T steps, each step taking
  round(n_i / (T - i)) of the n_i left (counted through the clean record
  the oracle reads); one position per step would leave L - T as noise."""
  length, vocab, batch = 12, 5, 4
  seen = []

  def oracle(x, clean):
    jax.debug.callback(lambda c: seen.append(np.asarray(c).sum(-1)), clean)
    return jnp.where(clean, -30.0, 30.0)

  # Every draw is token 1 (which the uniform start rarely holds everywhere).
  denoise = lambda z, t: (
    jnp.where(jnp.arange(vocab) == 1, 0.0, -1e9) * jnp.ones(z.shape + (vocab,))
  )
  x = jax.random.randint(jax.random.key(0), (batch, length), 0, vocab)
  todo = jnp.ones((batch, length), bool)
  out, _ = planned_denoise(
    oracle, denoise, jax.random.key(1), x, todo, num_steps=steps,
    mask_id=vocab, final_pass=False, parallel=True,
  )  # fmt: skip
  jax.effects_barrier()
  assert np.all(np.asarray(out) == 1)
  left = [length]
  for i in range(steps):
    left.append(left[-1] - int(np.floor(left[-1] / (steps - i) + 0.5)))
  assert left[-1] == 0
  done = [length - n for n in left[:-1]]
  np.testing.assert_array_equal(np.stack(seen)[:, 0], done)
  one, _ = planned_denoise(
    oracle, denoise, jax.random.key(1), x, todo, num_steps=steps,
    mask_id=vocab, final_pass=False,
  )  # fmt: skip
  assert (np.asarray(one) != 1).sum() > 0 or steps >= length


def test_gumbel_top_k_draws_without_replacement_in_softmax_proportion():
  """k = 1 is a categorical draw; k = L - 1 never includes -inf
  positions and leaves out the least likely position most often."""
  logits = jnp.log(jnp.array([[0.1, 0.2, 0.7, 0.0]]))  # last: -inf
  keys = jax.random.split(jax.random.key(0), 20000)
  one = jax.vmap(lambda k: gumbel_top_k(k, logits, jnp.array([1]))[0])(keys)
  np.testing.assert_allclose(
    np.asarray(one).mean(0), [0.1, 0.2, 0.7, 0.0], atol=0.01
  )
  two = jax.vmap(lambda k: gumbel_top_k(k, logits, jnp.array([2]))[0])(keys)
  two = np.asarray(two)
  assert np.all(two.sum(-1) == 2) and not two[:, 3].any()
  # Position j is left out when the two draws (first a, then b in
  # proportion among the rest) are the other two: enumerated.
  p = np.array([0.1, 0.2, 0.7])
  out = [
    sum(p[a] * p[b] / (1 - p[a]) for a in range(3) for b in range(3)
        if a != b and j not in (a, b))
    for j in range(3)
  ]  # fmt: skip
  np.testing.assert_allclose(1 - two[:, :3].mean(0), out, atol=0.01)


def _final_pass_only(p_noise_L, greedy, batch=4000):
  """The final pass alone (T = 0) over a start of token 0 everywhere,
  with fixed noise probabilities and a denoiser that gives token 3
  probability 0.6 and the others 0.1 each."""
  p_noise_L = jnp.asarray(p_noise_L)
  length, vocab = p_noise_L.shape[0], 5
  logit_L = jnp.log(p_noise_L) - jnp.log1p(-p_noise_L)
  plan = lambda x, clean: jnp.broadcast_to(logit_L, x.shape)
  probs_V = jnp.full((vocab,), 0.1).at[3].set(0.6)
  denoise = lambda z, t: jnp.broadcast_to(jnp.log(probs_V), z.shape + (vocab,))
  x = jnp.zeros((batch, length), jnp.int32)
  todo = jnp.ones((batch, length), bool).at[:, -1].set(False)
  out, nfe = planned_denoise(
    plan, denoise, jax.random.key(0), x, todo, num_steps=0, mask_id=vocab,
    final_greedy=greedy,
  )  # fmt: skip
  return np.asarray(out), np.asarray(nfe)


def test_final_pass_fills_every_position_above_the_threshold():
  """The paper's end of sampling: every generated position with noise
  probability above 0.05 is filled, every one below keeps its token, and
  the fill is the denoiser's argmax. Flags drawn as Bernoulli would fill
  the 0.3 position three times in ten."""
  p_noise = [0.01, 0.04, 0.06, 0.3, 0.9, 0.9]  # The last is a prompt.
  out, nfe = _final_pass_only(p_noise, greedy=True)
  np.testing.assert_array_equal(nfe, [1, 1])
  assert np.all(out[:, :2] == 0)
  assert np.all(out[:, 2:5] == 3)
  assert np.all(out[:, 5] == 0)
  drawn, _ = _final_pass_only(p_noise, greedy=False)
  assert np.all(drawn[:, :2] == 0) and np.all(drawn[:, 5] == 0)
  # Filled by draws: token 3 at 0.6, each other token at 0.1.
  share_V = np.bincount(drawn[:, 2:5].ravel(), minlength=5) / drawn[:, 2:5].size
  np.testing.assert_allclose(share_V, [0.1, 0.1, 0.1, 0.6, 0.1], atol=0.02)


def test_an_uninformed_planner_does_not_sample_the_data():
  """The check can fail: a planner that knows nothing (logit 0 at every
  position) leaves noise behind, far from the data in total variation."""
  p_N = _source()
  q_N, _ = _run(lambda x, clean: jnp.zeros(x.shape), p_N, L)
  assert 0.5 * np.abs(q_N - p_N).sum() > 0.1


def _counting(calls, name, out):
  def apply(z_BxL, t_B):
    jax.debug.callback(lambda: calls.__setitem__(name, calls[name] + 1))
    return out(z_BxL)

  return apply


@pytest.mark.parametrize('final_pass', [True, False])
def test_nfe_counts_the_calls_of_both_networks(final_pass):
  calls = {'planner': 0, 'denoiser': 0}
  planner = _counting(calls, 'planner', lambda z: jnp.zeros(z.shape + (1,)))
  denoiser = _counting(
    calls, 'denoiser', lambda z: jnp.zeros(z.shape + (7,)).at[..., 2].set(5)
  )
  sampler = get_sampler('ddpd', num_steps=5, final_pass=final_pass)
  process = PlannerProcess(vocab_size=7)
  tokens, nfe = sampler(
    (planner, denoiser), jax.random.key(0), process, batch=3, length=8
  )
  jax.effects_barrier()
  want = 5 + int(final_pass)
  assert calls == {'planner': want, 'denoiser': want}
  np.testing.assert_array_equal(nfe, [want, want])
  assert np.all((np.asarray(tokens) >= 0) & (np.asarray(tokens) < 7))


def test_prompt_positions_stay_fixed_and_picked_positions_are_filled():
  """A planner that calls every position noise and a denoiser that
  predicts token 2: every generated position ends at 2 (the final pass
  fills what the steps did not reach), the prompt stays."""
  process = PlannerProcess(vocab_size=7)
  planner = lambda z, t: jnp.full(z.shape + (1,), 20.0)
  denoiser = lambda z, t: (
    jnp.where(jnp.arange(7) == 2, 30.0, 0.0) * jnp.ones(z.shape + (7,))
  )
  prompt = jnp.full((2, 6), process.generate_id).at[:, :2].set(5)
  sampler = get_sampler('ddpd', num_steps=2)
  tokens, _ = sampler(
    (planner, denoiser), jax.random.key(1), process, batch=2, length=6,
    prompt_BxL=prompt,
  )  # fmt: skip
  tokens = np.asarray(tokens)
  assert np.all(tokens[:, :2] == 5) and np.all(tokens[:, 2:] == 2)


def test_sampler_is_declared_for_the_planner_family_only():
  assert samplers_for('ddpd_planner') == ['ddpd']
  masked = MaskedDiffusion(schedule=LogLinearSchedule(), vocab_size=7)
  with pytest.raises(ValueError, match='ddpd_planner'):
    get_sampler('ddpd')((None, None), jax.random.key(0), masked, batch=1,
                        length=4)  # fmt: skip
  with pytest.raises(ValueError, match='plan_temperature must be > 0'):
    DDPDSampler(plan_temperature=0.0)
  with pytest.raises(ValueError, match='final_fill_prob must be in'):
    DDPDSampler(final_fill_prob=1.0)
  process = PlannerProcess(vocab_size=7)
  planner = lambda z, t: jnp.zeros(z.shape + (1,))
  wrong = lambda z, t: jnp.zeros(z.shape + (9,))
  with pytest.raises(ValueError, match='same tokenizer'):
    get_sampler('ddpd', num_steps=2)(
      (planner, wrong), jax.random.key(0), process, batch=1, length=4
    )
