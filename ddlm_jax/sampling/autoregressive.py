"""Autoregressive sampling for the AR twin (full recompute per token).

No KV cache: the backbone is small and this keeps one model code path; NFE is
the sequence length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.autoregressive import Autoregressive
from ddlm_jax.sampling.noise import filter_logits, sample_categorical


def autoregressive_sample(
  apply,
  key: jax.Array,
  process: Autoregressive,
  *,
  batch: int,
  length: int,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
):
  """Left-to-right sampling; returns (tokens_BxL, nfe)."""
  x_BxL = jnp.zeros((batch, length), jnp.int32)
  t_B = jnp.zeros((batch,), jnp.float32)

  def step(i, carry):
    x, key = carry
    key, draw_key = jax.random.split(key)
    logits = apply(process.shift_right(x), t_B)[:, i]
    logits = filter_logits(
      logits, temperature=temperature, top_k=top_k, top_p=top_p
    )
    token = sample_categorical(draw_key, jax.nn.log_softmax(logits, -1))
    return x.at[:, i].set(token.astype(jnp.int32)), key

  x_BxL, _ = jax.lax.fori_loop(0, length, step, (x_BxL, key))
  return x_BxL, jnp.int32(length)
