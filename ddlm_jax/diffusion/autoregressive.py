"""The autoregressive LM as a 'process' on the same backbone and trainer.

Inputs are the sequence shifted right behind a BOS token (id V), so all L
tokens are predicted and per-token numbers compare directly with the masked
diffusion NELBO on the same windows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.masked import ApplyFn, token_cross_entropy


@dataclasses.dataclass(frozen=True)
class Autoregressive:
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
  ):
    """Exact NLL; same signature and returns as MaskedDiffusion.loss."""
    del key
    t_B = jnp.zeros((x_BxL.shape[0],), jnp.float32)
    logits_BxLxV = apply(self.shift_right(x_BxL), t_B)
    nll_BxL = token_cross_entropy(logits_BxLxV, x_BxL)
    if loss_mask_BxL is not None:
      nll_BxL = nll_BxL * loss_mask_BxL
    nll_B = nll_BxL.sum(-1)
    return nll_B, nll_B, {}
