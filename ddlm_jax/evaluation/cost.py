"""Compute cost of sampling: FLOPs per network call and per sample.

`transformer_flops` counts the multiply-adds of one forward pass of the
suite's Transformer (2 FLOPs each): the Q/K/V/O projections, the attention
scores and the weighted sum over L keys, the MLP, the one-hot embedding
matmul (used for vocabularies up to 512) and the output head. Norms,
softmax and rotary embeddings are left out (a few percent at most).
`xla_flops` asks XLA's cost analysis instead, for any apply function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def transformer_flops(cfg, batch: int, length: int) -> float:
  """Forward FLOPs of one call on [batch, length] tokens.

  Args:
    cfg: a ddlm_jax.models.TransformerConfig.
  """
  from ddlm_jax.models.transformer import ONE_HOT_EMBED_MAX_VOCAB

  d, h = cfg.width, cfg.hidden_dim
  mlp = (3 if cfg.mlp_kind == 'swiglu' else 2) * d * h
  per_layer = 4 * d * d + mlp  # multiply-adds per token
  attention = 2 * length * d  # QK^T and AV per token
  per_token = cfg.depth * (per_layer + attention) + d * cfg.vocab_size
  if cfg.input_vocab_size <= ONE_HOT_EMBED_MAX_VOCAB:
    per_token += d * cfg.input_vocab_size
  return 2.0 * per_token * batch * length


def xla_flops(apply, batch: int, length: int) -> float:
  """FLOPs of one apply(z_BxL, t_B) call by XLA's cost analysis."""
  z = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  t = jax.ShapeDtypeStruct((batch,), jnp.float32)
  lowered = jax.jit(apply).lower(z, t)
  # The HLO's own estimate needs no backend compilation (seconds for an
  # SSM scan); fall back to the compiled program's where it is missing.
  for get in (lowered.cost_analysis, lambda: lowered.compile().cost_analysis()):
    analysis = get()
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else None
    if analysis and 'flops' in analysis:
      return float(analysis['flops'])
  return float('nan')


def sampling_flops(nfe, flops_per_call) -> float:
  """Total FLOPs: nfe . flops_per_call (an entry per network if scheduled)."""
  nfe = np.atleast_1d(np.asarray(nfe, np.float64))
  per_call = np.broadcast_to(
    np.atleast_1d(np.asarray(flops_per_call, np.float64)), nfe.shape
  )
  return float(np.sum(nfe * per_call))
