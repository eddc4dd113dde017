"""The autoregressive LM as a 'process' on the same backbone and trainer.

Inputs are the sequence shifted right behind a BOS token (id V), so all L
tokens are predicted and per-token numbers compare directly with the masked
diffusion NELBO on the same windows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import ApplyFn, Process, ProcessConfig
from ddlm_jax.diffusion.masked import token_cross_entropy


@dataclasses.dataclass(frozen=True)
class Autoregressive(Process):
  """Next-token prediction with a causal network; exact NLL."""

  vocab_size: int

  causal = True
  loss_type = 'nll'
  family = 'autoregressive'
  requires_time_conditioning = False

  @property
  def bos_id(self) -> int:
    return self.vocab_size

  @property
  def input_vocab_size(self) -> int:
    return self.vocab_size + 1

  def shift_right(self, x_BxL: jax.Array) -> jax.Array:
    bos_Bx1 = jnp.full((x_BxL.shape[0], 1), self.bos_id, x_BxL.dtype)
    return jnp.concatenate([bos_Bx1, x_BxL[:, :-1]], axis=1)

  def loss(
    self,
    apply: ApplyFn,
    key: jax.Array,
    x_BxL: jax.Array,
    loss_mask_BxL: jax.Array | None = None,
    *,
    step=None,
  ):
    """Exact NLL; same signature and returns as every process's loss."""
    del key, step
    t_B = jnp.zeros((x_BxL.shape[0],), jnp.float32)
    logits_BxLxV = apply(self.shift_right(x_BxL), t_B)
    nll_BxL = token_cross_entropy(logits_BxLxV, x_BxL)
    if loss_mask_BxL is not None:
      nll_BxL = nll_BxL * loss_mask_BxL
    nll_B = nll_BxL.sum(-1)
    return nll_B, nll_B, {}


@ProcessConfig.register('ar')
@dataclasses.dataclass(frozen=True)
class AutoregressiveConfig(ProcessConfig):
  """config.process of the AR twin: nothing to set besides the kind."""

  family: ClassVar[str] = 'autoregressive'

  def build(self, vocab_size: int) -> Autoregressive:
    return Autoregressive(vocab_size=vocab_size)
