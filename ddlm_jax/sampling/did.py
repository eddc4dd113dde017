"""Diffusion in Diffusion (DiD): draft with small blocks, refine globally.

1. Draft: the block sampler (sampling.block, KV cache, stopping rules) with
   small blocks and an inner sampler that records each token's snapshot
   confidence: the model's probability of the drafted token at the moment it
   was revealed (the raw softmax, before temperature or nucleus filtering).
2. Refine, `refine_steps` rounds: a global bidirectional pass treats the
   whole sequence as one noisy block, `model.block_logits(z_BxL,
   empty_cache, 0)`. Each round remasks the floor(remask_fraction * n)
   generated tokens of lowest confidence (n: the row's generated tokens
   before its stop; prompt tokens, the EOS and the padding are never
   remasked) and resamples them with the same kind of recording sampler
   over the whole sequence; their confidences become the new snapshots.
   With an EOS stop, refinement cannot draw EOS (the draft fixed the
   length), so a row's length and padding never change.

One network drafts and refines when it is trained on several block sizes
(diffusion.mix_scale). The recording samplers are exact for time-free
networks (block_logits takes no time):

* first_hitting: one uniformly chosen masked position per call (NFE =
  number of masked tokens).
* ancestral: T steps t = 1 .. 0 of the masked ancestral rule; a step that
  reveals nothing, or follows a step that revealed nothing, reuses the
  previous prediction (the caching rule), so NFE <= min(T, tokens).

NFE = draft calls + refinement calls (cache extensions are counted apart);
`cost` and `block.estimate_flops` give the FLOPs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.base import Sampler, require_float, require_int
from ddlm_jax.sampling.block import (
  STOPS,
  BlockSampler,
  Cost,
  GeneratingSampler,
  check_block_model,
  check_block_process,
)
from ddlm_jax.sampling.common import alpha_inverse, select_top
from ddlm_jax.sampling.noise import filter_logits, gumbel

RECORDING = ('first_hitting', 'ancestral')


def _predict(apply, z_BxL, t_B, filters):
  """(filtered log-probs to draw from, raw log-probs for the confidence)."""
  raw = apply(z_BxL, t_B.astype(jnp.float32)).astype(jnp.float32)
  logp = jax.nn.log_softmax(filter_logits(raw, **filters), axis=-1)
  return logp, jax.nn.log_softmax(raw, axis=-1)


def _token_prob(logp_raw_BxLxV, tokens_BxL):
  picked = jnp.take_along_axis(logp_raw_BxLxV, tokens_BxL[..., None], -1)
  return jnp.exp(picked[..., 0])


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordingFirstHitting(Sampler):
  """First-hitting sampling that records each revealed token's probability.

  Not registered: DiD builds it; it also serves as an inner sampler of
  `block` (BlockSampler(inner=RecordingFirstHitting())) to get confidences.
  """

  name: ClassVar[str] = 'first_hitting_recorded'
  families: ClassVar[tuple[str, ...]] = ('masked',)

  def fill(self, apply, key, process, z_BxL, window_BxL):
    z, nfe, _ = self.fill_recorded(apply, key, process, z_BxL, window_BxL)
    return z, nfe

  def fill_recorded(self, apply, key, process, z_BxL, window_BxL):
    """(z_BxL, nfe, confidence_BxL); confidence is 0 where not revealed."""
    mask_id, schedule = process.mask_id, process.schedule
    batch = z_BxL.shape[0]
    filters = self.filters

    def cond(carry):
      return jnp.any((carry[0] == mask_id) & window_BxL)

    def body(carry):
      z, key, nfe, t_B, conf = carry
      key, tok_key, sel_key, t_key = jax.random.split(key, 4)
      masked = (z == mask_id) & window_BxL
      # The next of n masked tokens is hit at alpha(s) = 1 - (1 - alpha(t))
      # u^(1/n) (Zheng et al.); passed to the network for completeness.
      n_B = jnp.sum(masked, axis=-1).astype(jnp.float32)
      u_B = jax.random.uniform(t_key, (batch,), minval=1e-12)
      a_s = 1.0 - (1.0 - schedule.alpha(t_B)) * u_B ** (
        1.0 / jnp.maximum(n_B, 1.0)
      )
      s_B = jnp.minimum(alpha_inverse(schedule, a_s), t_B)
      t_B = jnp.where(n_B > 0, s_B, t_B)
      logp, logp_raw = _predict(apply, z, t_B, filters)
      tokens = jnp.argmax(logp + gumbel(tok_key, logp.shape), -1)
      tokens = tokens.astype(jnp.int32)
      score = jax.random.uniform(sel_key, z.shape)
      reveal = select_top(score, masked, jnp.ones((batch,), jnp.int32))
      z = jnp.where(reveal, tokens, z)
      conf = jnp.where(reveal, _token_prob(logp_raw, tokens), conf)
      return z, key, nfe + 1, t_B, conf

    init = (
      z_BxL.astype(jnp.int32),
      key,
      jnp.int32(0),
      jnp.ones((batch,), jnp.float32),
      jnp.zeros(z_BxL.shape, jnp.float32),
    )
    z, _, nfe, _, conf = jax.lax.while_loop(cond, body, init)
    return z, nfe, conf


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordingAncestral(Sampler):
  """T-step ancestral sampling (cached) that records token probabilities.

  Attributes:
    num_steps: T; 0 uses one step per position of the filled window.
  """

  name: ClassVar[str] = 'ancestral_recorded'
  families: ClassVar[tuple[str, ...]] = ('masked',)

  num_steps: int = 0

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 0)

  def fill(self, apply, key, process, z_BxL, window_BxL):
    z, nfe, _ = self.fill_recorded(apply, key, process, z_BxL, window_BxL)
    return z, nfe

  def fill_recorded(self, apply, key, process, z_BxL, window_BxL):
    """(z_BxL, nfe, confidence_BxL); confidence is 0 where not revealed."""
    mask_id = process.mask_id
    steps = self.num_steps or z_BxL.shape[1]
    grid = grid_lib.make_grid(process, grid_lib.uniform_times(steps))
    t_T, p_T = jnp.asarray(grid.t), jnp.asarray(grid.p_unmask)
    batch, vocab = z_BxL.shape[0], process.vocab_size
    filters = self.filters
    coin_key, tok_key = jax.random.split(key)

    def step(i, carry):
      z, conf, logp, logp_raw, fresh, nfe = carry
      masked = (z == mask_id) & window_BxL
      coin = jax.random.uniform(jax.random.fold_in(coin_key, i), z.shape)
      reveal = masked & ((coin < p_T[i]) | (i == steps - 1))
      # A time-free network's prediction only changes with z: call it only
      # when this step reveals something and z moved since the last call.
      need = jnp.any(reveal) & ~fresh
      t_B = jnp.full((batch,), t_T[i], jnp.float32)
      logp, logp_raw = jax.lax.cond(
        need,
        lambda: _predict(apply, z, t_B, filters),
        lambda: (logp, logp_raw),
      )
      noise = gumbel(jax.random.fold_in(tok_key, i), logp.shape)
      tokens = jnp.argmax(logp + noise, -1).astype(jnp.int32)
      z = jnp.where(reveal, tokens, z)
      conf = jnp.where(reveal, _token_prob(logp_raw, tokens), conf)
      fresh = (fresh | need) & ~jnp.any(reveal)
      return z, conf, logp, logp_raw, fresh, nfe + need.astype(jnp.int32)

    zeros = jnp.zeros(z_BxL.shape + (vocab,), jnp.float32)
    init = (
      z_BxL.astype(jnp.int32),
      jnp.zeros(z_BxL.shape, jnp.float32),
      zeros,
      zeros,
      jnp.bool_(False),
      jnp.int32(0),
    )
    z, conf, _, _, _, nfe = jax.lax.fori_loop(0, steps, step, init)
    return z, nfe, conf


class DiDSample(NamedTuple):
  """What `DiDSampler.generate` returns (per-row arrays, int32 counts).

  Attributes:
    tokens_BxL, lengths_B: the refined samples and their lengths.
    confidence_BxL: snapshot confidences after refinement.
    draft_BxL, draft_confidence_BxL: the draft and its confidences.
    remasked_BxL: positions remasked in any round.
    nfe: draft_nfe + refine_nfe (network calls); extensions apart.
    cost: per-row work of draft and refinement (block.Cost).
  """

  tokens_BxL: jax.Array  # noqa: N815
  lengths_B: jax.Array  # noqa: N815
  confidence_BxL: jax.Array  # noqa: N815
  draft_BxL: jax.Array  # noqa: N815
  draft_confidence_BxL: jax.Array  # noqa: N815
  remasked_BxL: jax.Array  # noqa: N815
  nfe: jax.Array
  draft_nfe: jax.Array
  refine_nfe: jax.Array
  extensions: jax.Array
  cost: Cost


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiDSampler(GeneratingSampler):
  """Draft block by block, then refine the least confident tokens globally.

  Attributes:
    draft: recording sampler inside each draft block ('first_hitting' or
      'ancestral').
    draft_num_steps: its steps per block (ancestral; 0: the block size).
    block_size: draft block size; 0 takes the process's block_size.
    num_blocks: > 0 generates num_blocks * block_size tokens (see block).
    refine_steps: rounds of remasking and resampling (0: the draft).
    remask_fraction: fraction of each row's generated tokens remasked per
      round, lowest snapshot confidence first.
    refine: recording sampler for the global pass ('first_hitting' or
      'ancestral').
    refine_num_steps: its steps per round (ancestral; 0: the largest
      number of tokens a round remasks).
    stop, eos_id, pad_id, entropy_window, entropy_threshold, use_kv_cache:
      the draft's block sampler settings (sampling.block).
  """

  name: ClassVar[str] = 'did'
  families: ClassVar[tuple[str, ...]] = ('block',)

  draft: str = 'first_hitting'
  draft_num_steps: int = 0
  block_size: int = 0
  num_blocks: int = 0
  refine_steps: int = 1
  remask_fraction: float = 0.25
  refine: str = 'first_hitting'
  refine_num_steps: int = 0
  stop: str = 'none'
  eos_id: int | None = None
  pad_id: int | None = None
  entropy_window: int = 256
  entropy_threshold: float = 4.0
  use_kv_cache: bool = True

  def __post_init__(self):
    super().__post_init__()
    for field in ('draft', 'refine'):
      if getattr(self, field) not in RECORDING:
        raise ValueError(
          f'{field}={getattr(self, field)!r}; DiD records snapshot '
          f'confidences with one of {RECORDING}.'
        )
    require_int('draft_num_steps', self.draft_num_steps, 0)
    require_int('refine_steps', self.refine_steps, 0)
    require_int('refine_num_steps', self.refine_num_steps, 0)
    require_float('remask_fraction', self.remask_fraction, 0.0, 1.0)
    if self.stop not in STOPS:
      raise ValueError(f'stop={self.stop!r}; choose one of {STOPS}.')
    self._set(use_kv_cache=bool(self.use_kv_cache))
    _ = self.drafter  # Validates the block settings now.

  def _recorder(self, kind: str, steps: int) -> Sampler:
    if kind == 'ancestral':
      return RecordingAncestral(num_steps=steps, **self.filters)
    return RecordingFirstHitting(**self.filters)

  @property
  def drafter(self) -> BlockSampler:
    """The block sampler that writes the draft."""
    return BlockSampler(
      inner=self._recorder(self.draft, self.draft_num_steps),
      num_blocks=self.num_blocks,
      block_size=self.block_size,
      stop=self.stop,
      eos_id=self.eos_id,
      pad_id=self.pad_id,
      entropy_window=self.entropy_window,
      entropy_threshold=self.entropy_threshold,
      use_kv_cache=self.use_kv_cache,
      **self.filters,
    )

  @property
  def needs_time_free(self) -> bool:
    return True

  def check_applies(self, process) -> None:
    """ValueError for another family (base), TypeError for a bad process."""
    super().check_applies(process)
    check_block_process(process, self.name)

  def generate(
    self,
    apply,
    key: jax.Array,
    process,
    *,
    batch: int,
    length: int,
    prompt_BxL: jax.Array | None = None,
  ) -> DiDSample:
    """Draft and refine `batch` sequences; returns a `DiDSample`."""
    self.check_applies(process)
    check_block_model(apply, use_kv_cache=self.use_kv_cache, name=self.name)
    model, drafter = apply, self.drafter
    draft_key, refine_key = jax.random.split(key)
    out = drafter.generate(
      model,
      draft_key,
      process,
      batch=batch,
      length=length,
      prompt_BxL=prompt_BxL,
    )
    masked_process = process.masked_process
    mask_id = masked_process.mask_id
    total = out.tokens_BxL.shape[1]
    if prompt_BxL is None:
      generated = jnp.ones((batch, total), bool)
    else:
      generated = jnp.asarray(prompt_BxL) == mask_id
    pos = jnp.arange(total)
    eligible = generated & (pos[None] < out.lengths_B[:, None])
    stop_eos = 'eos' in self.stop
    if stop_eos:
      eligible = eligible & (out.tokens_BxL != self.eos_id)
    count_B = jnp.floor(
      self.remask_fraction * jnp.sum(eligible, -1).astype(jnp.float32)
    ).astype(jnp.int32)
    steps = self.refine_num_steps or max(
      1, math.floor(self.remask_fraction * total)
    )
    refiner = self._recorder(self.refine, steps)
    empty = model.init_cache(batch, total)

    def global_logits(z_BxL, t_B):
      del t_B
      logits = model.block_logits(z_BxL, empty, 0)
      if stop_eos:  # The draft fixed the length: no new EOS.
        logits = logits.at[..., self.eos_id].set(-jnp.inf)
      return logits

    def round_(r, carry):
      z, conf, union, nfe, cost = carry
      remask = select_top(-conf, eligible, count_B)
      z = jnp.where(remask, mask_id, z)
      z, n, c = refiner.fill_recorded(
        global_logits,
        jax.random.fold_in(refine_key, r),
        masked_process,
        z,
        remask,
      )
      conf = jnp.where(remask, c, conf)
      cost = cost.add(n, total, total)
      return z, conf, union | remask, nfe + n, cost

    init = (
      out.tokens_BxL,
      out.confidence_BxL,
      jnp.zeros((batch, total), bool),
      jnp.int32(0),
      out.cost,
    )
    z, conf, union, refine_nfe, cost = jax.lax.fori_loop(
      0, self.refine_steps, round_, init
    )
    return DiDSample(
      tokens_BxL=z,
      lengths_B=out.lengths_B,
      confidence_BxL=conf,
      draft_BxL=out.tokens_BxL,
      draft_confidence_BxL=out.confidence_BxL,
      remasked_BxL=union,
      nfe=out.nfe + refine_nfe,
      draft_nfe=out.nfe,
      refine_nfe=refine_nfe,
      extensions=out.extensions,
      cost=cost,
    )

  def fill(self, apply, key, process, z_BxL, window_BxL):
    """Not supported: DiD refines whole sequences, so it cannot nest."""
    del apply, key, process, z_BxL, window_BxL
    raise NotImplementedError(
      'did draws whole sequences: call it (or generate) with prompt_BxL; it '
      'cannot run inside another sampler.'
    )
