"""Autoregressive sampling for the AR twin (full recompute per token).

No KV cache: the backbone is small and this keeps one model code path; NFE is
the number of generated positions (the sequence length less the prompt).
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
  prefix_BxP=None,
):
  """Left-to-right sampling; returns (tokens_BxL, nfe).

  prefix_BxP: a prompt (token ids, P < length): every row starts with it
  and sampling continues from position P, as an AR model is prompted.
  """
  x_BxL = jnp.zeros((batch, length), jnp.int32)
  t_B = jnp.zeros((batch,), jnp.float32)
  start = 0
  if prefix_BxP is not None:
    prefix_BxP = jnp.asarray(prefix_BxP, jnp.int32)
    start = prefix_BxP.shape[-1]
    if start >= length:
      raise ValueError(
        f'prompt of {start} tokens leaves none of the {length} positions '
        'to generate.'
      )
    prefix_BxP = jnp.broadcast_to(prefix_BxP, (batch, start))
    x_BxL = x_BxL.at[:, :start].set(prefix_BxP)

  def step(i, carry):
    x, key = carry
    key, draw_key = jax.random.split(key)
    logits = apply(process.shift_right(x), t_B)[:, i]
    logits = filter_logits(
      logits, temperature=temperature, top_k=top_k, top_p=top_p
    )
    token = sample_categorical(draw_key, jax.nn.log_softmax(logits, -1))
    return x.at[:, i].set(token.astype(jnp.int32)), key

  x_BxL, _ = jax.lax.fori_loop(start, length, step, (x_BxL, key))
  return x_BxL, jnp.int32(length - start)
