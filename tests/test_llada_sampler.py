"""LLaDA's block decoding sampler against a step-by-step reference.

The reference below follows the published description of LLaDA's
`generate` (blocks after the prompt, steps split across blocks, tokens per
call from `get_num_transfer_tokens`, top-k by confidence, -inf after the
block) in plain numpy, one network call at a time; the sampler must commit
the same tokens at the same calls.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.sampling.registry import get_sampler, parse_spec, samplers_for

VOCAB, LENGTH, DIM = 11, 16, 8
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=VOCAB)
_RNG = np.random.default_rng(0)
EMB = jnp.asarray(_RNG.normal(size=(VOCAB + 1, DIM)), jnp.float32)
POS = jnp.asarray(_RNG.normal(size=(LENGTH, DIM)), jnp.float32)
OUT = jnp.asarray(_RNG.normal(size=(DIM, VOCAB)), jnp.float32)


def toy(z_BxL, t_B):
  """A time-free bidirectional toy network: every position reads the mean
  embedding of the whole row, so confidences change as tokens commit."""
  del t_B
  h = EMB[z_BxL] + POS[: z_BxL.shape[1]]
  h = h + jnp.mean(EMB[z_BxL], axis=1, keepdims=True)
  return 3.0 * jnp.tanh(h) @ OUT


def num_transfer(masked: int, steps: int) -> list[int]:
  """LLaDA's get_num_transfer_tokens for one row."""
  base, rem = divmod(masked, steps)
  return [base + (i < rem) for i in range(steps)]


def reference(prompt_L, block_length, steps):
  """Greedy LLaDA generate for one row: (tokens, calls, commits per call)."""
  x = np.array(prompt_L)
  start = int(np.argmax(x == VOCAB))
  gen = LENGTH - start
  blocks = gen // block_length
  assert gen % block_length == 0 and steps % blocks == 0
  calls, commits = 0, []
  for b in range(blocks):
    lo, hi = start + b * block_length, start + (b + 1) * block_length
    counts = num_transfer(int((x[lo:hi] == VOCAB).sum()), steps // blocks)
    for k in counts:
      logits = np.asarray(toy(jnp.asarray(x[None]), None))[0]
      calls += 1
      x0 = logits.argmax(-1)
      p = np.exp(logits - logits.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      conf = np.take_along_axis(p, x0[:, None], -1)[:, 0]
      conf[hi:] = -np.inf
      conf = np.where(x == VOCAB, conf, -np.inf)
      chosen = np.argsort(-conf, kind='stable')[:k]
      x[chosen] = x0[chosen]
      commits.append(sorted(chosen.tolist()))
  return x, calls, commits


def _prompts():
  prompts = np.full((2, LENGTH), VOCAB, np.int32)
  prompts[0, :4] = [1, 2, 3, 4]
  prompts[1, :8] = [5, 6, 7, 8, 9, 1, 2, 3]
  return prompts


@pytest.mark.parametrize('block_length,steps', [(4, 6), (4, 9), (12, 5)])
def test_greedy_commits_the_k_most_confident_per_call(block_length, steps):
  """Temperature 0: row 0 (12 to generate) against the reference, call by
  call (the states the network sees), and NFE equals steps."""
  sampler = get_sampler(
    'llada', block_length=block_length, num_steps=steps, temperature=0
  )
  seen = []
  record = lambda z: seen.append(np.asarray(z))

  def apply(z, t):
    jax.debug.callback(record, z)
    return toy(z, t)

  prompt = _prompts()[:1]
  out, nfe = jax.jit(
    lambda key: sampler(
      apply, key, PROCESS, batch=1, length=LENGTH, prompt_BxL=prompt
    )
  )(jax.random.key(0))
  jax.effects_barrier()
  want, calls, commits = reference(prompt[0], block_length, steps)
  np.testing.assert_array_equal(np.asarray(out)[0], want)
  assert int(nfe) == calls == steps == len(seen)
  states = [s[0] for s in seen] + [np.asarray(out)[0]]
  for before, after, chosen in zip(states, states[1:], commits):
    new = np.flatnonzero((before == VOCAB) & (after != VOCAB))
    assert new.tolist() == chosen


def test_rows_decode_their_own_blocks():
  """Rows with prompts of different lengths start their blocks at their own
  first masked position: a batch equals each row's own greedy reference."""
  sampler = get_sampler('llada', block_length=4, num_steps=6, temperature=0)
  prompts = _prompts()
  out, _ = sampler(
    toy, jax.random.key(0), PROCESS, batch=2, length=LENGTH,
    prompt_BxL=jnp.asarray(prompts),
  )  # fmt: skip
  for row in range(2):
    want = reference(prompts[row], 4, 6)[0]  # 3 and 2 blocks
    np.testing.assert_array_equal(np.asarray(out)[row], want)


def test_one_block_one_token_per_call_is_the_confidence_sampler():
  """block_length = L, steps = masked count, greedy: one commit per call by
  max probability, which is the confidence sampler with one token per step
  (greedy tokens' probability is the max probability)."""
  prompt = jnp.asarray(_prompts())
  masked = int((_prompts()[0] == VOCAB).sum())
  llada = get_sampler(
    'llada', block_length=LENGTH, num_steps=masked, temperature=0
  )
  conf = get_sampler(
    'confidence', tokens_per_step=1, score='max_prob', greedy=True
  )
  kw = dict(batch=1, length=LENGTH, prompt_BxL=prompt[:1])
  a, nfe_a = llada(toy, jax.random.key(1), PROCESS, **kw)
  b, nfe_b = conf(toy, jax.random.key(2), PROCESS, **kw)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(nfe_a) == int(nfe_b) == masked


def test_sampling_and_random_remasking_fill_every_mask():
  prompts = jnp.asarray(_prompts())
  for spec in (
    'llada:block_length=4,num_steps=8,temperature=1.0',
    'llada:block_length=8,num_steps=3,remasking="random",temperature=0.5',
  ):
    name, params = parse_spec(spec)
    sampler = get_sampler(name, **params)
    out, nfe = sampler(
      toy, jax.random.key(3), PROCESS, batch=2, length=LENGTH,
      prompt_BxL=prompts,
    )  # fmt: skip
    out = np.asarray(out)
    keep = _prompts() != VOCAB
    np.testing.assert_array_equal(out[keep], _prompts()[keep])
    assert (out < VOCAB).all()
    assert int(nfe) == params['num_steps']
    again, _ = sampler(
      toy, jax.random.key(3), PROCESS, batch=2, length=LENGTH,
      prompt_BxL=prompts,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(again), out)


def test_registered_for_masked_processes_and_bad_params_refused():
  assert 'llada' in samplers_for('masked')
  assert 'llada' not in samplers_for('uniform')
  with pytest.raises(ValueError, match='remasking'):
    get_sampler('llada', remasking='entropy')
  with pytest.raises(ValueError, match='block_length'):
    get_sampler('llada', block_length=0)
  with pytest.raises(ValueError, match='temperature'):
    get_sampler('llada', temperature=-1.0)
