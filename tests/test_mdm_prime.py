"""MDM-Prime's math on a source with an exact likelihood.

The source is a fixed joint distribution over L = 2 tokens of V = 5 ids
(correlated, every pair possible), small enough to enumerate every
sequence and every mask of its L l sub-tokens. The 'oracle' denoiser
computes p(x^i | y_t) by enumeration: the source restricted to the
sequences consistent with the observed digits, marginalised to position i.

With the tight schedule (alpha(t) = 1 - t, t_min = 0) the expected bound
of a sequence is an exact finite sum: the set M of masked sub-tokens
(m = |M| of N = L l) has weight int_0^1 (1/t) t^m (1 - t)^(N - m) dt =
B(m, N - m + 1), so E[NELBO(x)] = sum_M B(m, N - m + 1) * (the process's
`bound` at y_M with unit weight). That sum must equal -log p(x) for the
oracle (the chain rule averaged over orders), and its source average must
stay >= the entropy for any other denoiser, for l in {1, 2, ceil(log2 V)}.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import prime
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.schedules import LinearSchedule, LogLinearSchedule
from ddlm_jax.sampling.prime import PrimeAncestralSampler
from ddlm_jax.sampling.registry import get_sampler, samplers_for

VOCAB, LENGTH = 5, 2
SUBTOKENS = (1, 2, prime.binary_subtokens(VOCAB))  # binary: 3 digits, b = 2
TIGHT = LinearSchedule(eps=0.0)  # alpha(0) = 1, alpha(1) = 0


def source_table() -> np.ndarray:
  """p(x1, x2) over 5 x 5, strongly correlated (diagonal-heavy)."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(VOCAB, VOCAB)) + 2.5 * np.eye(VOCAB)
  table = np.exp(logits)
  return table / table.sum()


SEQS_NxL = np.array(list(itertools.product(range(VOCAB), repeat=LENGTH)))
P_N = source_table()[SEQS_NxL[:, 0], SEQS_NxL[:, 1]]
ENTROPY = float(-(P_N * np.log(P_N)).sum())


def process_for(subtokens, schedule=TIGHT, t_min=0.0):
  return prime.PrimeDiffusion(
    schedule=schedule, vocab_size=VOCAB, subtokens=subtokens, t_min=t_min
  )


def slots_of(process, rows_BxLxR):
  """The digits the network input encodes (inverse of network_input)."""
  width = process.base + 1
  used = rows_BxLxR[..., : process.slot_rows]
  shape = rows_BxLxR.shape[:-1] + (process.subtokens, width)
  return jnp.argmax(used.reshape(shape), axis=-1)


def oracle(process):
  """apply(rows, t) -> log p_source(x^i | observed digits), by enumeration."""
  digits_VxS = process.digits
  seq_digits_NxLxS = digits_VxS[jnp.asarray(SEQS_NxL)]
  onehot_NxLxV = jax.nn.one_hot(jnp.asarray(SEQS_NxL), VOCAB)
  p_N = jnp.asarray(P_N, jnp.float32)

  def apply(rows_BxLxR, t_B):
    del t_B
    y_BxLxS = slots_of(process, rows_BxLxR)
    y_Bx1xLxS = y_BxLxS[:, None]
    agree = (y_Bx1xLxS == process.base) | (y_Bx1xLxS == seq_digits_NxLxS)
    weight_BxN = p_N * jnp.all(agree, axis=(2, 3))
    marg_BxLxV = jnp.einsum('bn,nlv->blv', weight_BxN, onehot_NxLxV)
    return jnp.log(marg_BxLxV)

  return apply


def random_denoiser(process, seed):
  """A fixed random function of the input rows (an untrained network)."""
  w_RxV = 2.0 * jax.random.normal(
    jax.random.key(seed), (process.input_vocab_size, VOCAB)
  )
  return lambda rows_BxLxR, t_B: rows_BxLxR @ w_RxV


def enumerate_masks(process):
  """Every (sequence, masked set) pair: x_RxL, y_RxLxS and the weights."""
  n_sub = LENGTH * process.subtokens
  masks_MxN = np.array(list(itertools.product((0, 1), repeat=n_sub)), bool)
  m_M = masks_MxN.sum(-1)
  beta_M = np.array(
    [
      0.0
      if m == 0
      else math.exp(
        math.lgamma(m) + math.lgamma(n_sub - m + 1) - math.lgamma(n_sub + 1)
      )
      for m in m_M
    ]
  )
  n_seq, n_mask = len(SEQS_NxL), len(masks_MxN)
  x_RxL = np.repeat(SEQS_NxL, n_mask, axis=0)
  mask_RxLxS = np.tile(masks_MxN, (n_seq, 1)).reshape(
    -1, LENGTH, process.subtokens
  )
  y0_RxLxS = process.encode(jnp.asarray(x_RxL))
  y_RxLxS = jnp.where(jnp.asarray(mask_RxLxS), process.base, y0_RxLxS)
  return jnp.asarray(x_RxL), y_RxLxS, np.tile(beta_M, n_seq), n_mask


def exact_bounds(process, apply):
  """E[NELBO(x)] for every sequence x (rows of SEQS_NxL), by enumeration."""
  x_RxL, y_RxLxS, beta_R, n_mask = enumerate_masks(process)
  logits = apply(process.network_input(y_RxLxS), None)
  ones = jnp.ones(x_RxL.shape[0])
  _, nelbo_R, _ = process.bound(logits, x_RxL, y_RxLxS, None, ones, None)
  per_row = beta_R * np.asarray(nelbo_R, np.float64)
  return per_row.reshape(-1, n_mask).sum(-1)


def token_form_bounds(process, apply):
  """The per-token form: sum_i 1[x^i partly masked] -log p(x^i | y_t)."""
  x_RxL, y_RxLxS, beta_R, n_mask = enumerate_masks(process)
  logits = apply(process.network_input(y_RxLxS), None)
  logp_RxLxV = process.denoiser_log_probs(logits, y_RxLxS, None)
  nll_RxL = -jnp.take_along_axis(logp_RxLxV, x_RxL[..., None], -1)[..., 0]
  partly_RxL = jnp.any(y_RxLxS == process.base, axis=-1)
  term_R = np.asarray(jnp.sum(jnp.where(partly_RxL, nll_RxL, 0.0), -1))
  return (beta_R * term_R).reshape(-1, n_mask).sum(-1)


# ---------------------------------------------------- sub-tokenisation --


@pytest.mark.parametrize('vocab', [2, 5, 7, 30, 2048, 50257])
def test_base_is_the_smallest_that_holds_the_vocabulary(vocab):
  for subtokens in (1, 2, 3, prime.binary_subtokens(vocab)):
    base = prime.subtoken_base(vocab, subtokens)
    assert base**subtokens >= vocab
    assert base == 2 or (base - 1) ** subtokens < vocab
  assert prime.subtoken_base(vocab, prime.binary_subtokens(vocab)) == 2
  assert (
    2 ** prime.binary_subtokens(vocab)
    >= vocab
    > 2 ** (prime.binary_subtokens(vocab) - 1)
    or vocab == 2
  )


@pytest.mark.parametrize('vocab,subtokens', [(5, 2), (5, 3), (2048, 2),
                                             (2048, 11), (300, 1)])  # fmt: skip
def test_subtokenisation_round_trips(vocab, subtokens):
  process = prime.PrimeDiffusion(
    schedule=TIGHT, vocab_size=vocab, subtokens=subtokens
  )
  ids = jnp.arange(vocab).reshape(1, -1)
  y = process.encode(ids)
  assert y.shape == (1, vocab, subtokens)
  assert int(y.min()) >= 0 and int(y.max()) < process.base
  np.testing.assert_array_equal(process.decode(y), ids)
  # Digits read like a base-b numeral, most significant first.
  expected = [(v // process.base ** (subtokens - 1 - j)) % process.base
              for v in (vocab - 1,) for j in range(subtokens)]  # fmt: skip
  np.testing.assert_array_equal(y[0, -1], expected)
  # The generate id V encodes to all-masked digits and decodes back.
  masked = process.encode(jnp.full((1, 3), vocab))
  assert bool(jnp.all(masked == process.base))
  np.testing.assert_array_equal(process.decode(masked), vocab)


def test_carry_over_puts_minus_inf_exactly_on_inconsistent_tokens():
  vocab, subtokens = 30, 3  # b = 4: ids 30..63 do not exist
  process = prime.PrimeDiffusion(
    schedule=TIGHT, vocab_size=vocab, subtokens=subtokens
  )
  base = process.base
  key = jax.random.key(0)
  y_BxLxS = jax.random.randint(key, (4, 16, subtokens), 0, base + 1)
  logits = jax.random.normal(jax.random.key(1), (4, 16, vocab))
  out = np.asarray(prime.carry_over(logits, y_BxLxS, process.digits, base))
  y = np.asarray(y_BxLxS)
  for b, i, v in itertools.product(range(4), range(16), range(vocab)):
    digits = [(v // base ** (subtokens - 1 - j)) % base for j in range(3)]
    ok = all(y[b, i, j] in (base, digits[j]) for j in range(subtokens))
    if ok:
      assert out[b, i, v] == float(logits[b, i, v])
    else:
      assert out[b, i, v] == -np.inf
  # A fully observed token keeps exactly one candidate: itself.
  full = process.encode(jnp.array([[7, 29]]))
  logp = process.denoiser_log_probs(jnp.zeros((1, 2, vocab)), full, None)
  np.testing.assert_allclose(jnp.exp(logp).max(-1), 1.0)
  np.testing.assert_array_equal(jnp.argmax(logp, -1), [[7, 29]])


def test_token_level_absorbing_marginal_is_refused():
  with pytest.raises(TypeError, match='partially masked tokens'):
    process_for(2).forward_marginal(jnp.ones((1, 2, VOCAB)) / VOCAB, 0.5)


def test_network_input_is_one_row_per_slot():
  process = process_for(2)  # b = 3: slot rows 0..3 and 4..7
  y = jnp.array([[[0, 3], [2, 1]]])
  rows = process.network_input(y)
  assert rows.shape == (1, 2, process.input_vocab_size)
  np.testing.assert_array_equal(np.nonzero(rows[0, 0])[0], [0, 7])
  np.testing.assert_array_equal(np.nonzero(rows[0, 1])[0], [2, 5])
  np.testing.assert_array_equal(slots_of(process, rows), y)


# --------------------------------------------------------------- bound --


@pytest.mark.parametrize('subtokens', SUBTOKENS)
def test_oracle_bound_is_the_exact_likelihood(subtokens):
  """Closed form: E[NELBO(x)] = -log p(x) for the exact posterior."""
  process = process_for(subtokens)
  bounds_N = exact_bounds(process, oracle(process))
  np.testing.assert_allclose(bounds_N, -np.log(P_N), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('subtokens', SUBTOKENS)
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_bound_stays_above_the_entropy_for_any_denoiser(subtokens, seed):
  process = process_for(subtokens)
  expected = float(P_N @ exact_bounds(process, random_denoiser(process, seed)))
  assert expected >= ENTROPY + 1e-3  # An untrained net is far from exact.
  # Mixing the oracle with noise moves the bound up, never below H.
  noisy = lambda r, t: (
    oracle(process)(r, t) + 0.5 * random_denoiser(process, seed)(r, t)
  )
  assert float(P_N @ exact_bounds(process, noisy)) >= ENTROPY - 1e-5


def test_the_per_token_form_falls_below_the_likelihood():
  """Why the bound uses sub-token marginals: with the exact posterior the
  per-token cross-entropy form undercuts the entropy once l > 1 (it is
  exact for l = 1, where it is the same sum)."""
  one = process_for(1)
  np.testing.assert_allclose(
    token_form_bounds(one, oracle(one)), -np.log(P_N), rtol=1e-4, atol=1e-4
  )
  for subtokens in SUBTOKENS[1:]:
    process = process_for(subtokens)
    expected = float(P_N @ token_form_bounds(process, oracle(process)))
    assert expected < ENTROPY - 0.02, (subtokens, expected, ENTROPY)


@pytest.mark.parametrize('subtokens', [2, 3])
def test_monte_carlo_loss_estimates_the_enumerated_bound(subtokens):
  """draw -> network -> bound: its mean is the bound (t_min > 0 keeps the
  1/t weight's variance finite and adds its own O(t_min) terms)."""
  process = process_for(subtokens, t_min=1e-3)
  apply = oracle(process)
  x_BxL = jnp.asarray(SEQS_NxL)

  @jax.jit
  def one(key):
    return process.loss(apply, key, x_BxL)[1]

  keys = jax.random.split(jax.random.key(3), 400)
  values = np.stack([np.asarray(one(k)) for k in keys])  # [draws, 25]
  weighted_D = values @ P_N  # Each draw's estimate of E_p[bound].
  mean = float(weighted_D.mean())
  se = float(weighted_D.std(ddof=1) / np.sqrt(len(keys)))
  assert abs(mean - ENTROPY) < 4 * se + 0.02, (mean, ENTROPY, se)


def test_one_subtoken_is_mdlm_exactly():
  vocab, batch, length = 11, 8, 12
  schedule = LogLinearSchedule()
  mdlm = MaskedDiffusion(schedule=schedule, vocab_size=vocab, t_min=1e-3)
  one = prime.PrimeDiffusion(
    schedule=schedule, vocab_size=vocab, subtokens=1, t_min=1e-3
  )
  assert one.base == vocab and one.input_vocab_size == vocab + 1
  w_RxV = jax.random.normal(jax.random.key(0), (vocab + 1, vocab))
  # The same network on both: l = 1 slot rows are the MDLM ids.
  apply_ids = lambda z, t: jax.nn.one_hot(z, vocab + 1) @ w_RxV
  apply_rows = lambda rows, t: rows @ w_RxV
  x = jax.random.randint(jax.random.key(1), (batch, length), 0, vocab)
  pad = (jnp.arange(length) < 10)[None].repeat(batch, 0)
  for key in jax.random.split(jax.random.key(2), 4):
    want = mdlm.loss(apply_ids, key, x, pad)
    got = one.loss(apply_rows, key, x, pad)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)


# ------------------------------------------------------------- sampler --


def sample_histogram(process, num_steps, batch, length, seed=0):
  sampler = PrimeAncestralSampler(num_steps=num_steps)
  tokens, nfe = jax.jit(
    lambda key: sampler(
      oracle(process), key, process, batch=batch, length=length
    )
  )(jax.random.key(seed))
  tokens = np.asarray(tokens)
  assert tokens.min() >= 0 and tokens.max() < VOCAB
  return tokens, int(nfe)


@pytest.mark.parametrize('subtokens', SUBTOKENS[1:])
def test_sampler_matches_the_source(subtokens):
  """L = 2 from the joint; the oracle is per position, so the match is
  exact only as T grows (two positions revealed in one step are drawn
  independently): at T = 256 that bias is below the sampling noise of
  4000 draws (TV ~ 0.02)."""
  process = process_for(subtokens)
  tokens, _ = sample_histogram(process, 256, 4000, LENGTH, seed=1)
  index = tokens[:, 0] * VOCAB + tokens[:, 1]
  freq = np.bincount(index, minlength=VOCAB**LENGTH) / len(index)
  tv = 0.5 * np.abs(freq - P_N).sum()
  assert tv < 0.045, tv


@pytest.mark.parametrize('subtokens', SUBTOKENS[1:])
def test_sampler_is_exact_for_one_token_at_any_step_count(subtokens):
  """One token: digits revealed together are drawn jointly, so even T = 2
  samples the marginal exactly."""
  process = process_for(subtokens)
  marginal = source_table().sum(1)

  def first_marginal(rows_BxLxR, t_B):
    y = slots_of(process, rows_BxLxR)
    ok = prime.consistent(y, process.digits, process.base)
    return jnp.where(ok, jnp.log(jnp.asarray(marginal, jnp.float32)), -jnp.inf)

  sampler = PrimeAncestralSampler(num_steps=2)
  tokens, _ = sampler(
    first_marginal, jax.random.key(0), process, batch=20000, length=1
  )
  freq = np.bincount(np.asarray(tokens[:, 0]), minlength=VOCAB) / 20000
  assert 0.5 * np.abs(freq - marginal).sum() < 0.02


def test_sampler_calls_the_network_only_when_a_digit_changed():
  process = process_for(3)
  sampler = PrimeAncestralSampler(num_steps=1000)
  walk = PrimeAncestralSampler(num_steps=1000, use_cache=False)
  apply = oracle(process)
  key = jax.random.key(5)
  cached, nfe = sampler(apply, key, process, batch=1, length=LENGTH)
  stepped, nfe_all = walk(apply, key, process, batch=1, length=LENGTH)
  np.testing.assert_array_equal(cached, stepped)  # Same chain, same key.
  assert int(nfe_all) == 1000
  # One call before the first change, then one after each change but the
  # last: at most L l calls, and at least one.
  assert 1 <= int(nfe) <= LENGTH * process.subtokens


def test_sampler_is_registered_for_the_family_only():
  assert samplers_for('mdm_prime') == ['prime_ancestral']
  assert isinstance(get_sampler('prime_ancestral'), PrimeAncestralSampler)
  masked = MaskedDiffusion(schedule=TIGHT, vocab_size=VOCAB)
  with pytest.raises(ValueError, match='prime_ancestral applies to mdm_prime'):
    PrimeAncestralSampler()(None, jax.random.key(0), masked, batch=1, length=2)
  with pytest.raises(ValueError, match='num_steps must be an integer >= 1'):
    PrimeAncestralSampler(num_steps=0)


def test_sampler_keeps_prompt_tokens():
  process = process_for(2)
  prompt = jnp.array([[3, VOCAB], [VOCAB, 1]])
  tokens, _ = PrimeAncestralSampler(num_steps=16)(
    oracle(process), jax.random.key(0), process, batch=2, length=2,
    prompt_BxL=prompt,
  )  # fmt: skip
  assert int(tokens[0, 0]) == 3 and int(tokens[1, 1]) == 1
  assert int(tokens.max()) < VOCAB
