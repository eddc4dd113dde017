"""Categorical sampling with a high-resolution Gumbel tail, and filtering.

Gumbel-max sampling from float32 uniforms truncates the Gumbel tail at about
16 (uniforms have 2^-23 spacing), so tokens far below the top logit are never
drawn; MDLM traced a loss of sample diversity to this and samples in float64.
JAX 0.10 cannot switch to float64 inside jit, so `gumbel` builds each uniform
from 64 random bits instead: near the tail the uniform is resolved to 2^-64,
the resolution float64 would give, and the Gumbel value is returned in
float32 (its range is ample).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_TWO_M32 = 2.0**-32
_TWO_M64 = 2.0**-64


def gumbel_from_bits(w1: jax.Array, w2: jax.Array) -> jax.Array:
  """Gumbel noise from two uint32 words per draw.

  v = 1 - u is uniform on (0, 1]: the first word gives v at 2^-32 spacing and
  the second refines v below 2^-32. g = -log(-log(1 - v)).
  """
  v_hi = w1.astype(jnp.float32) * _TWO_M32
  v_lo = (w2.astype(jnp.float32) + 1.0) * _TWO_M64
  v = jnp.where(w1 > 0, v_hi, v_lo)
  exponential = -jnp.log1p(-jnp.minimum(v, 1.0 - 2.0**-24))
  return -jnp.log(exponential)


def gumbel(key: jax.Array, shape) -> jax.Array:
  """Standard Gumbel noise with float64-grade tail resolution."""
  bits = jax.random.bits(key, (2, *shape), jnp.uint32)
  return gumbel_from_bits(bits[0], bits[1])


def filter_logits(
  logits_BxLxV: jax.Array,
  *,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
) -> jax.Array:
  """Temperature, then top-k, then nucleus (top-p) filtering."""
  if temperature <= 0:
    raise ValueError(
      f'temperature must be > 0, got {temperature}; for greedy decoding '
      'use a small temperature such as 1e-4.'
    )
  logits = logits_BxLxV.astype(jnp.float32) / temperature
  vocab = logits.shape[-1]
  if top_k and top_k < vocab:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    sorted_desc = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (always >= 1 token).
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff_idx = jnp.sum(before < top_p, axis=-1, keepdims=True) - 1
    cutoff = jnp.take_along_axis(sorted_desc, cutoff_idx, axis=-1)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return logits


def sample_categorical(key: jax.Array, log_probs: jax.Array) -> jax.Array:
  """Gumbel-max draw over the last axis (log_probs may hold -inf)."""
  return jnp.argmax(log_probs + gumbel(key, log_probs.shape), axis=-1)
