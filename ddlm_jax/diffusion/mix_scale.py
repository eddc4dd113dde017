"""Mix-scale block diffusion: one network trained on several block sizes.

Diffusion in Diffusion drafts with small blocks and refines with a global
(one-block) pass, so one network must denoise at several block sizes. Each
training batch draws one block size L' from `block_sizes` with
probabilities `probs` and takes the BD3-LM loss at that size
(diffusion.block): a lax.switch with one branch per size, each branch
tracing the network with its own static mask (`apply(tokens_Bx2L, t_B,
block_size=L')`), so one compiled step serves every size.

The loss of a key is exactly the BlockDiffusion loss at the drawn size:
`size_key, loss_key = jax.random.split(key)`, the size index is
`draw_index(size_key)` and the branch runs BlockDiffusion.loss(apply,
loss_key, x). Its nelbo_B is a bound at the drawn size; likelihoods are
reported by `evaluation_process`, the unclipped BlockDiffusion at
`eval_block_size` (evaluation.likelihood picks it up), and samplers read
`block_size` (= eval_block_size) and `masked_process`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.diffusion.base import (
  Backbone,
  BlockProcess,
  ProcessConfig,
  ScheduledConfig,
)
from ddlm_jax.diffusion.block import BlockDiffusion


@dataclasses.dataclass(frozen=True)
class MixScaleBlockDiffusion(BlockProcess):
  """BlockDiffusion at a block size drawn per batch.

  Attributes:
    base: the BlockDiffusion whose schedule, clip, t_min, antithetic and
      loss_type every size shares (its own block_size is not used).
    block_sizes: the sizes to train on; each must divide the length.
    probs: their probabilities (empty: uniform); they must sum to 1.
    eval_block_size: the size for evaluation and sampling (0: the first of
      block_sizes). It need not be one of block_sizes.
  """

  base: BlockDiffusion
  block_sizes: tuple[int, ...]
  probs: tuple[float, ...] = ()
  eval_block_size: int = 0

  causal = False
  family = 'block'
  requires_time_conditioning = False

  def __post_init__(self):
    if not isinstance(self.base, BlockDiffusion):
      raise ValueError(
        f'base must be a BlockDiffusion, got {type(self.base).__name__}.'
      )
    sizes = tuple(self.block_sizes)
    if not sizes:
      raise ValueError('block_sizes is empty; give at least one block size.')
    for s in sizes:
      if isinstance(s, bool) or int(s) != s or s < 1:
        raise ValueError(f'block sizes must be ints >= 1, got {sizes}.')
    sizes = tuple(int(s) for s in sizes)
    if len(set(sizes)) != len(sizes):
      raise ValueError(f'block_sizes {sizes} repeats a size.')
    probs = tuple(float(p) for p in self.probs) or (1.0 / len(sizes),) * len(
      sizes
    )
    if len(probs) != len(sizes):
      raise ValueError(
        f'{len(probs)} probabilities for {len(sizes)} block sizes; give one '
        'per size (or none for uniform).'
      )
    if min(probs) < 0 or abs(sum(probs) - 1.0) > 1e-6:
      raise ValueError(
        f'probs {probs} must be >= 0 and sum to 1 (got {sum(probs)}).'
      )
    eval_size = self.eval_block_size or sizes[0]
    if isinstance(eval_size, bool) or int(eval_size) != eval_size:
      raise ValueError(f'eval_block_size must be an int, got {eval_size!r}.')
    if eval_size < 1:
      raise ValueError(f'eval_block_size must be >= 1, got {eval_size}.')
    object.__setattr__(self, 'block_sizes', sizes)
    object.__setattr__(self, 'probs', probs)
    object.__setattr__(self, 'eval_block_size', int(eval_size))

  # ------------------------------------------------------ shared attributes --

  @property
  def schedule(self):
    return self.base.schedule

  @property
  def vocab_size(self) -> int:
    return self.base.vocab_size

  @property
  def mask_id(self) -> int:
    return self.base.mask_id

  @property
  def input_vocab_size(self) -> int:
    return self.base.input_vocab_size

  @property
  def block_size(self) -> int:
    """The evaluation (and sampling) block size."""
    return self.eval_block_size

  @property
  def masked_process(self):
    return self.base.masked_process

  def process_at(self, block_size: int) -> BlockDiffusion:
    """The BlockDiffusion of this mix at one block size."""
    return dataclasses.replace(self.base, block_size=int(block_size))

  @property
  def processes(self) -> tuple[BlockDiffusion, ...]:
    return tuple(self.process_at(s) for s in self.block_sizes)

  @property
  def evaluation_process(self) -> BlockDiffusion:
    """The unclipped BlockDiffusion at eval_block_size: the reported bound."""
    return self.process_at(self.eval_block_size).evaluation_process

  # The contract's per-draw pieces are those of the evaluation block size;
  # training draws a size per batch in `loss`.
  def corrupt(self, key, x_BxL, t_BxNb):
    return self.process_at(self.eval_block_size).corrupt(key, x_BxL, t_BxNb)

  def draw(self, key, x_BxL):
    return self.process_at(self.eval_block_size).draw(key, x_BxL)

  def bound(self, logits_BxLxV, x_BxL, z_BxL, t, weight, loss_mask_BxL):
    return self.process_at(self.eval_block_size).bound(
      logits_BxLxV, x_BxL, z_BxL, t, weight, loss_mask_BxL
    )

  def check_length(self, seq_len: int) -> None:
    """Every training size and the evaluation size must divide seq_len."""
    bad = [
      s
      for s in (*self.block_sizes, self.eval_block_size)
      if s > seq_len or seq_len % s
    ]
    if bad:
      raise ValueError(
        f'block sizes {bad} do not divide the sequence length {seq_len}; '
        'choose block_sizes and eval_block_size that divide it.'
      )

  # ------------------------------------------------------------------ loss --

  def draw_index(self, key: jax.Array) -> jax.Array:
    """int32 index into block_sizes, drawn with `probs`."""
    with jax.ensure_compile_time_eval():
      logp = jnp.log(jnp.asarray(np.asarray(self.probs), jnp.float32))
    return jax.random.categorical(key, logp).astype(jnp.int32)

  def loss(
    self,
    apply,
    key: jax.Array,
    x_BxL: jax.Array,
    loss_mask_BxL=None,
    *,
    step=None,
  ):
    """(objective_B, nelbo_B, aux) of the BlockDiffusion loss at a drawn size.

    aux adds 'block_size' (per sequence, float) to BlockDiffusion's.
    """
    if x_BxL.ndim != 2:
      raise ValueError(f'x_BxL must be [B, L] tokens, got {x_BxL.shape}.')
    self.check_length(x_BxL.shape[1])
    size_key, loss_key = jax.random.split(key)
    index = self.draw_index(size_key)
    branches = [
      functools.partial(p.loss, apply, loss_key, x_BxL, loss_mask_BxL)
      for p in self.processes
    ]
    if len(branches) == 1:
      objective_B, nelbo_B, aux = branches[0]()
    else:
      objective_B, nelbo_B, aux = jax.lax.switch(index, branches)
    sizes = jnp.asarray(self.block_sizes, jnp.float32)
    aux = dict(aux, block_size=jnp.full(x_BxL.shape[:1], sizes[index]))
    return objective_B, nelbo_B, aux


def parse_block_sizes(text) -> tuple[int, ...]:
  """'4,16' -> (4, 16); '' -> () (one block size)."""
  text = str(text or '').strip()
  try:
    return tuple(int(p) for p in text.split(',') if p.strip())
  except ValueError:
    raise ValueError(
      f'config.process.block_sizes={text!r}; give comma-separated '
      "integers, e.g. '4,16' (or '' for one block size)."
    ) from None


@ProcessConfig.register('bd3')
@dataclasses.dataclass(frozen=True)
class BlockConfig(ScheduledConfig):
  """config.process of block diffusion (BD3-LM).

  block_size: L' (divides data.seq_len); clip_low, clip_high: the clipped
  training band t ~ U[clip_low, clip_high] per block (the reported bound is
  always unclipped); block_sizes: mix-scale sizes ('4,16'; '' = one size,
  the last listed size is the evaluation one's base); schedule, t_min,
  antithetic and loss_type as in ScheduledConfig.
  """

  block_size: int = 16
  clip_low: float = 0.0
  clip_high: float = 1.0
  block_sizes: str = ''

  family: ClassVar[str] = 'block'
  attention_masks: ClassVar[tuple[str, ...]] = ('block_diffusion',)

  def check(self, backbone: Backbone, seq_len: int) -> None:
    super().check(backbone, seq_len)
    if backbone.name != 'transformer':
      raise ValueError(
        f'process.kind={self.kind!r} runs on the transformer backbone; set '
        '--config.model.backbone=transformer.'
      )
    for size in parse_block_sizes(self.block_sizes) or (self.block_size,):
      if isinstance(size, bool) or int(size) != size or size < 1:
        raise ValueError(
          f'config.process.block_size={size!r} must be an integer >= 1.'
        )
      if size > seq_len or seq_len % size:
        raise ValueError(
          f'process.block_size={size} does not divide data.seq_len='
          f'{seq_len} into blocks; choose a block size that divides the '
          'length.'
        )

  def build(self, vocab_size: int) -> BlockProcess:
    sizes = parse_block_sizes(self.block_sizes)
    block = BlockDiffusion(
      **self.scheduled_kwargs(vocab_size),
      block_size=sizes[-1] if sizes else self.block_size,
      clip=(self.clip_low, self.clip_high),
    )
    if len(sizes) > 1:
      return MixScaleBlockDiffusion(base=block, block_sizes=sizes)
    return block
