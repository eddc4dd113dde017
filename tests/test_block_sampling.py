"""Block-diffusion sampling (KV cache, stopping), DiD and mix-scale training.

Most tests use a fake block-diffusion network whose logits are a known
function of the clean prefix and the noisy block, with the three cache
methods and the 2L training pass, and which records what it is given: the
sampler's plumbing (starts, slices, cache order) is then checked exactly.
One test runs the real Transformer (TransformerConfig.block_size > 0).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import BlockDiffusion, get_schedule
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.mix_scale import MixScaleBlockDiffusion
from ddlm_jax.models.transformer import Transformer, TransformerConfig
from ddlm_jax.sampling.base import Sampler
from ddlm_jax.sampling.block import BlockSampler, unigram_entropy
from ddlm_jax.sampling.did import DiDSampler

V, BS = 7, 4
MASK = V
SCHEDULE = get_schedule('loglinear')
PROCESS = BlockDiffusion(SCHEDULE, vocab_size=V, block_size=BS)


class FakeBlockModel:
  """Logits = a known function of (clean prefix, position, noisy block).

  h = sum over clean positions j < start of 7 (x_j + 1)(j + 1), mod V;
  target = h + 3 * pos (+ the number of masks in the block) mod V. Each
  call records what it saw. `eos_at[b]` forces EOS at that position of row
  b (elsewhere EOS is impossible); `constant[b]` makes row b repeat token 1.
  """

  def __init__(self, state_dependent=True, eos_at=None, constant=None):
    self.state_dependent = state_dependent
    self.eos_at = None if eos_at is None else jnp.asarray(eos_at)
    self.constant = None if constant is None else jnp.asarray(constant)
    self.extended, self.prefixes, self.clean_halves = [], [], []

  def logits(self, h_BxN, pos_N, nmask_BxN):
    shift = nmask_BxN if self.state_dependent else 0
    target = (h_BxN + 3 * pos_N[None] + shift) % V
    vocab = jnp.arange(V)
    out = 2.0 * jax.nn.one_hot(target, V)
    out = out + 0.7 * jax.nn.one_hot((target + 1) % V, V)
    out = out + 0.15 * ((vocab[None, None] * (pos_N[None, :, None] + 2)) % 5)
    if self.eos_at is not None:
      out = out.at[..., 0].set(-1e9)  # EOS (id 0) only where rigged.
      here = self.eos_at[:, None] == pos_N[None]
      out = jnp.where(here[..., None], 50.0 * jax.nn.one_hot(0, V), out)
    if self.constant is not None:
      out = jnp.where(
        self.constant[:, None, None], 50.0 * jax.nn.one_hot(1, V), out
      )
    return out

  def init_cache(self, batch, max_len):
    return jnp.full((batch, max_len), -5, jnp.int32)  # garbage until written

  def extend_cache(self, x_BxN, cache, start):
    jax.debug.callback(
      lambda s, x: self.extended.append((int(s), np.asarray(x))), start, x_BxN
    )
    return jax.lax.dynamic_update_slice_in_dim(cache, x_BxN, start, axis=1)

  def block_logits(self, z_BxN, cache, start):
    jax.debug.callback(
      lambda s, c: self.prefixes.append((int(s), np.asarray(c))), start, cache
    )
    pos = jnp.arange(cache.shape[1])
    contrib = jnp.where(pos < start, 7 * (cache + 1) * (pos + 1), 0)
    h_B = jnp.sum(contrib, -1) % V
    n = z_BxN.shape[1]
    nmask = jnp.sum(z_BxN == MASK, -1, keepdims=True)
    return self.logits(
      jnp.broadcast_to(h_B[:, None], z_BxN.shape),
      start + jnp.arange(n),
      jnp.broadcast_to(nmask, z_BxN.shape),
    )

  def __call__(self, tokens_Bx2L, t_B, *, block_size):
    length = tokens_Bx2L.shape[1] // 2
    z, x = tokens_Bx2L[:, :length], tokens_Bx2L[:, length:]
    jax.debug.callback(lambda c: self.clean_halves.append(np.asarray(c)), x)
    pos = jnp.arange(length)
    contrib = 7 * (x + 1) * (pos + 1)
    before = jnp.cumsum(contrib, -1) - contrib  # sum over j < pos
    h = jnp.take(before, (pos // block_size) * block_size, axis=1) % V
    blocks = (z == MASK).reshape(z.shape[0], -1, block_size).sum(-1)
    nmask = jnp.repeat(blocks, block_size, axis=1)
    return self.logits(h, pos, nmask)


def _generate(sampler, model, seed=0, **kw):
  out = jax.jit(
    lambda k: sampler.generate(model, k, PROCESS, **kw)
  )(jax.random.key(seed))  # fmt: skip
  jax.effects_barrier()
  return jax.tree.map(np.asarray, out)


def test_finished_blocks_never_change_and_the_cache_changes_nothing():
  """Per-block traces, prompt caching, a cut last block, NFE; cache off."""
  batch, length = 3, 14  # 4 blocks, the last cut to 2 positions
  prompt = np.full((batch, length), MASK, np.int32)
  prompt[:, :5] = [[1, 2, 3, 4, 5]]  # block 0 fully, block 1 partly
  prompt[1, 9] = 6  # an infilling anchor
  outs = {}
  for kv in (True, False):
    model = FakeBlockModel()
    sampler = BlockSampler(
      inner='ancestral', inner_params={'num_steps': 8}, use_kv_cache=kv
    )
    out = _generate(
      sampler, model, batch=batch, length=length, prompt_BxL=prompt
    )
    outs[kv] = out
    tokens = out.tokens_BxL
    assert tokens.shape == (batch, length)
    assert tokens.min() >= 0 and tokens.max() < V  # nothing left masked
    fixed = prompt != MASK
    np.testing.assert_array_equal(tokens[fixed], prompt[fixed])
    np.testing.assert_array_equal(out.lengths_B, [length] * batch)
    if kv:
      # Each finished block is cached once, mask-free, and is final.
      starts = [s for s, _ in model.extended]
      assert starts == [0, 4, 8] and int(out.extensions) == 3
      for start, block in model.extended:
        np.testing.assert_array_equal(block, tokens[:, start : start + BS])
      # Every call sees exactly the final tokens before its block; the
      # prompt-only block 0 costs no call.
      assert len(model.prefixes) == int(out.nfe)
      assert min(s for s, _ in model.prefixes) == 4
      for start, cache in model.prefixes:
        np.testing.assert_array_equal(cache[:, :start], tokens[:, :start])
    else:
      assert int(out.extensions) == 0
      assert len(model.clean_halves) == int(out.nfe)
      for x in model.clean_halves:
        # Generated left to right: known positions are final, masks a
        # suffix (apart from what the prompt fixed).
        known = x[:, :length] != MASK
        np.testing.assert_array_equal(x[:, :length][known], tokens[known])
        done = known.all(0)
        assert not np.any(np.diff(done.astype(int)) > 0)
  np.testing.assert_array_equal(outs[True].tokens_BxL, outs[False].tokens_BxL)
  assert int(outs[True].nfe) == int(outs[False].nfe)
  # Cost: N queries per call against start + N keys; 2T and (2T)^2 without.
  cost_off = outs[False].cost
  assert float(cost_off.dense_tokens) == 32 * int(outs[False].nfe)
  assert float(cost_off.attention_pairs) == 32**2 * int(outs[False].nfe)


def _tiny_model(block_size=BS, seed=0):
  cfg = TransformerConfig(
    vocab_size=V,
    input_vocab_size=V + 1,
    width=16,
    depth=1,
    num_heads=2,
    block_size=block_size,
    tied_embeddings=True,  # the untied head starts at zero: flat logits
  )
  return Transformer(cfg, rngs=nnx.Rngs(seed))


def test_real_model_cache_on_off_at_twice_the_training_length():
  """TransformerConfig.block_size > 0: the KV cache path equals the 2L pass.

  Trained (here: built) for length 8, sampled at 16 with num_blocks=4.
  """
  model = _tiny_model()
  tokens = {}
  for kv in (True, False):
    sampler = BlockSampler(inner='first_hitting', num_blocks=4,
                           use_kv_cache=kv)  # fmt: skip
    fn = jax.jit(
      lambda k, s=sampler: s(model, k, PROCESS, batch=2, length=8)
    )  # fmt: skip
    tokens[kv], nfe = fn(jax.random.key(3))
    assert tokens[kv].shape == (2, 16) and int(nfe) == 16
  np.testing.assert_array_equal(tokens[True], tokens[False])
  assert np.asarray(tokens[True]).max() < V


def test_stopping_at_eos_and_low_entropy():
  """Row 0: EOS at 5; row 1: a repeated token (entropy 0 over 8 tokens);
  row 2: EOS at 9. All stop by block 2, so block 3 is never generated."""
  model = FakeBlockModel(eos_at=[5, -1, 9], constant=[False, True, False])
  sampler = BlockSampler(
    inner='first_hitting',
    stop='eos+entropy',
    eos_id=0,
    pad_id=6,
    entropy_window=8,
    entropy_threshold=0.5,
  )
  out = _generate(sampler, model, batch=3, length=16)
  tokens = out.tokens_BxL
  np.testing.assert_array_equal(out.lengths_B, [6, 8, 10])
  assert int(out.blocks) == 3 and int(out.nfe) == 12
  assert tokens[0, 5] == 0 and np.all(tokens[0, 6:] == 6)
  assert np.all(tokens[1, :8] == 1) and np.all(tokens[1, 8:] == 6)
  assert tokens[2, 9] == 0 and np.all(tokens[2, 10:] == 6)
  assert not np.any(tokens[0, :5] == 0) and not np.any(tokens[2, :9] == 0)
  assert model.extended and all(s < 12 for s, _ in model.extended)


def test_unigram_entropy_matches_numpy():
  rows = np.array([[1, 1, 1, 1], [0, 1, 2, 3], [5, 5, 2, 9]])
  want = []
  for r in rows:
    p = np.unique(r, return_counts=True)[1] / r.size
    want.append(-(p * np.log(p)).sum())
  np.testing.assert_allclose(unigram_entropy(jnp.asarray(rows)), want, 1e-6)


def test_bad_configurations_raise_before_compute():
  with pytest.raises(ValueError, match='needs eos_id'):
    BlockSampler(stop='eos')
  with pytest.raises(ValueError, match='pad_id'):
    BlockSampler(stop='entropy')
  with pytest.raises(ValueError, match='stop='):
    BlockSampler(stop='sometimes')
  with pytest.raises(ValueError, match='needs 2 networks'):
    BlockSampler(inner='scheduled')
  with pytest.raises(ValueError, match='cannot run'):
    BlockSampler(inner='semi_ar')
  with pytest.raises(ValueError, match='does not take'):
    BlockSampler(inner='eb', inner_params={'num_steps': 3})
  key = jax.random.key(0)
  masked = MaskedDiffusion(SCHEDULE, vocab_size=V)
  with pytest.raises(ValueError, match='applies to block processes'):
    BlockSampler()(FakeBlockModel(), key, masked, batch=1, length=8)
  with pytest.raises(ValueError, match='applies to block processes'):
    DiDSampler()(FakeBlockModel(), key, masked, batch=1, length=8)
  with pytest.raises(TypeError, match='block_size > 0'):
    BlockSampler()(lambda z, t: z, key, PROCESS, batch=1, length=8)
  with pytest.raises(ValueError, match='never stop'):
    BlockSampler(stop='entropy', eos_id=0).generate(
      FakeBlockModel(), key, PROCESS, batch=1, length=8
    )
  with pytest.raises(ValueError, match='not a token'):
    BlockSampler(stop='eos', eos_id=V)(
      FakeBlockModel(), key, PROCESS, batch=1, length=8
    )
  with pytest.raises(ValueError, match='records snapshot'):
    DiDSampler(draft='eb')


@dataclasses.dataclass(frozen=True, kw_only=True)
class _UniformStateSampler(Sampler):
  """Stands for a sampler of the uniform-state family."""

  name = 'psi_stub'
  families = ('uniform',)

  def fill(self, apply, key, process, z_BxL, window_BxL):
    return z_BxL, jnp.int32(0)


def test_inner_sampler_must_be_of_the_masked_family():
  with pytest.raises(ValueError, match='masked-family'):
    BlockSampler(inner='uniform_ancestral')  # a uniform-state sampler
  with pytest.raises(ValueError, match='masked-family'):
    BlockSampler(inner=_UniformStateSampler())
  with pytest.raises(ValueError, match='inner_params only apply'):
    BlockSampler(inner=_UniformStateSampler(), inner_params={'a': 1})


def _token_probs(model, h_BxL, tokens_BxL):
  """softmax(fake logits at prefix hash h and position)[token], [B, L]."""
  h_BxL = jnp.asarray(h_BxL)
  pos = jnp.arange(h_BxL.shape[1])
  logits = model.logits(h_BxL, pos, jnp.zeros_like(h_BxL))
  probs = jax.nn.softmax(logits, axis=-1)
  return np.take_along_axis(np.asarray(probs), tokens_BxL[..., None], -1)[
    ..., 0
  ]


def test_did_keeps_confident_tokens_and_resamples_the_least_confident():
  """A 3-token prompt; row 1 ends with EOS at 11 (length 12, then pad)."""
  model = FakeBlockModel(state_dependent=False, eos_at=[-1, 11, -1])
  batch, length, fraction, pad = 3, 16, 0.25, 2
  prompt = np.full((batch, length), MASK, np.int32)
  prompt[:, :3] = [5, 6, 1]
  sampler = DiDSampler(
    draft='ancestral',  # the two recording samplers: ancestral drafts,
    refine='first_hitting',  # first-hitting refines
    refine_steps=1,
    remask_fraction=fraction,
    stop='eos',
    eos_id=0,
    pad_id=pad,
  )
  out = _generate(
    sampler, model, seed=1, batch=batch, length=length, prompt_BxL=prompt
  )
  draft, tokens = out.draft_BxL, out.tokens_BxL
  np.testing.assert_array_equal(out.lengths_B, [16, 12, 16])
  for t in (draft, tokens):
    assert t[1, 11] == 0 and np.all(t[1, 12:] == pad)
    np.testing.assert_array_equal(t[:, :3], prompt[:, :3])
  # Snapshot confidence = the model's probability of the drafted token,
  # given the clean prefix at the time (the final draft, as blocks are
  # never changed); 1 for the prompt and the padding.
  pos = np.arange(length)
  contrib = 7 * (draft.astype(np.int64) + 1) * (pos + 1)
  before = np.cumsum(contrib, -1) - contrib
  h = before[:, pos - pos % BS] % V  # hash of the blocks before p's
  want = _token_probs(model, h, draft)
  inside = (pos >= 3) & (pos[None] < out.lengths_B[:, None])
  want = np.where(inside, want, 1.0)
  np.testing.assert_allclose(out.draft_confidence_BxL, want, rtol=1e-5)
  # The remasked set: the floor(fraction * n) least confident of the n
  # generated tokens before the EOS (stable ties).
  for b in range(batch):
    eligible = np.arange(3, out.lengths_B[b] - (b == 1))
    k = math.floor(fraction * eligible.size)
    conf = out.draft_confidence_BxL[b, eligible]
    chosen = eligible[np.argsort(conf, kind='stable')[:k]]
    np.testing.assert_array_equal(
      np.flatnonzero(out.remasked_BxL[b]), np.sort(chosen)
    )
  keep = ~out.remasked_BxL
  np.testing.assert_array_equal(tokens[keep], draft[keep])
  assert np.any(tokens[~keep] != draft[~keep])  # refinement did something
  assert not np.any(tokens[~keep] == 0)  # refinement draws no EOS
  np.testing.assert_array_equal(
    out.confidence_BxL[keep], out.draft_confidence_BxL[keep]
  )
  # New confidences come from the global pass (no prefix: h = 0).
  fresh = _token_probs(model, np.zeros_like(h), tokens)
  np.testing.assert_allclose(out.confidence_BxL[~keep], fresh[~keep], rtol=1e-5)
  # Ancestral drafting, T = 4 steps per block: a call only at a step where
  # some row reveals a token, so between 1 and T calls per block.
  assert 4 <= int(out.draft_nfe) <= 4 * 4
  # First-hitting refinement: one call per token of the fullest row (3).
  assert int(out.refine_nfe) == 3
  assert int(out.nfe) == int(out.draft_nfe) + 3 and int(out.extensions) == 3


def _fake_block_apply(tokens_Bx2L, t_B, *, block_size):
  """A fixed function of the tokens whose loss depends on block_size."""
  del t_B
  length = tokens_Bx2L.shape[1] // 2
  z = tokens_Bx2L[:, :length]
  feat = jax.nn.one_hot(z, V + 1)[..., :V] * 0.5
  pos = jnp.arange(length) % block_size
  return feat + 0.3 * jax.nn.one_hot(pos % V, V)[None] + 0.1 * block_size


def test_mix_scale_loss_is_the_block_loss_of_the_drawn_size():
  sizes, probs = (2, 4, 8), (0.5, 0.3, 0.2)
  mix = MixScaleBlockDiffusion(PROCESS, sizes, probs, eval_block_size=4)
  x = jax.random.randint(jax.random.key(0), (4, 8), 0, V)

  @jax.jit
  def run(key):
    """The mix loss, every size's BlockDiffusion loss, and the draw."""
    size_key, loss_key = jax.random.split(key)
    refs = [p.loss(_fake_block_apply, loss_key, x) for p in mix.processes]
    return mix.loss(_fake_block_apply, key, x), refs, mix.draw_index(size_key)

  seen = set()
  for i in range(5):
    (objective, nelbo, aux), refs, index = run(jax.random.key(i))
    size = sizes[int(index)]
    seen.add(size)
    np.testing.assert_allclose(objective, refs[int(index)][0], rtol=1e-6)
    np.testing.assert_allclose(nelbo, refs[int(index)][1], rtol=1e-6)
    np.testing.assert_array_equal(aux['block_size'], size)
    others = [r[1] for j, r in enumerate(refs) if j != int(index)]
    assert all(np.abs(np.asarray(o) - nelbo).max() > 1e-3 for o in others)
  assert len(seen) >= 2
  # The sizes are drawn with `probs`: 4000 draws, 5 standard errors.
  keys = jax.random.split(jax.random.key(9), 4000)
  draws = np.asarray(jax.jit(jax.vmap(mix.draw_index))(keys))
  freq = np.bincount(draws, minlength=3) / draws.size
  se = np.sqrt(np.asarray(probs) * (1 - np.asarray(probs)) / draws.size)
  assert np.all(np.abs(freq - probs) < 5 * se)
  assert mix.evaluation_process.block_size == 4 and mix.block_size == 4
  assert mix.masked_process == PROCESS.masked_process
  with pytest.raises(ValueError, match='do not divide'):
    mix.loss(_fake_block_apply, jax.random.key(0), x[:, :6])
  with pytest.raises(ValueError, match='sum to 1'):
    MixScaleBlockDiffusion(PROCESS, (2, 4), (0.5, 0.6))
  with pytest.raises(ValueError, match='one per size'):
    MixScaleBlockDiffusion(PROCESS, (2, 4), (1.0,))


def test_eos_stop_takes_the_tokenizer_end_of_text_id(tmp_path):
  """stop='eos' without eos_id: the run fills in its tokenizer's EOS id
  (OWT's byte BPE has <|endoftext|>); a character tokenizer has none, and
  the run refuses before training, naming the stops that work without."""
  from ddlm_jax.tasks.language_model import Run
  from ddlm_jax.training.config import ConfigError
  from experiments.configs import bd3_owt, bd3_quickstart

  c = bd3_owt.get_config('16,smoke')
  c.data.cache_dir = str(tmp_path / 'cache')
  c.mesh.shape = (1, 1, 1)
  c.sample.sampler = 'block:stop=eos'
  run = Run(c, str(tmp_path / 'owt'))
  assert run.eos_id is not None
  assert run.sampler.eos_id == run.eos_id == run.data.tokenizer.special_ids.eos
  assert run.sampler.pad_token == run.eos_id
  # A spec's own eos_id wins over the tokenizer's.
  c.sample.sampler = 'block:stop=eos,eos_id=3'
  assert Run(c, str(tmp_path / 'owt')).sampler.eos_id == 3

  q = bd3_quickstart.get_config('16,smoke')
  q.mesh.shape = (1, 1, 1)
  q.sample.sampler = 'block:stop=eos'
  with pytest.raises(ConfigError, match="needs eos_id.*stop='entropy'"):
    Run(q, str(tmp_path / 'chars'))
  assert not (tmp_path / 'chars' / 'checkpoints').exists()
