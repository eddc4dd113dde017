"""Ancestral sampler for masked diffusion, with the caching rule.

Steps run from t = 1 down to 0 on a uniform grid of T steps. At each step a
masked token is revealed with probability (alpha(s) - alpha(t)) / (1 -
alpha(t)), drawn from p_theta; revealed tokens never change. With a time-free
network the prediction depends only on z_t, so when a step reveals nothing
the next step reuses the cached prediction without calling the network
(MDLM's ddpm_cache). The network is called at most once per distinct z_t, so
NFE <= min(T, number of steps that reveal something + 1).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.sampling.noise import filter_logits, sample_categorical

# apply(z_BxL, t_B) -> logits_BxLxV
ApplyFn = Callable[[jax.Array, jax.Array], jax.Array]


def ancestral_sample(
  apply: ApplyFn,
  key: jax.Array,
  process: MaskedDiffusion,
  *,
  batch: int,
  length: int,
  num_steps: int,
  prompt_BxL: jax.Array | None = None,
  use_cache: bool = True,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
):
  """Draws samples; returns (tokens_BxL, nfe).

  Args:
    apply: the denoiser. With use_cache=True it must ignore t_B (time-free),
      which the caller asserts by passing use_cache.
    prompt_BxL: optional conditioning: positions not equal to the mask id are
      fixed and never change (prefix prompts, infilling).
    num_steps: T; with T >= length most steps reveal nothing and are free.
  """
  if num_steps < 1:
    raise ValueError(f'num_steps must be >= 1, got {num_steps}.')
  mask_id = process.mask_id
  if prompt_BxL is None:
    z_BxL = jnp.full((batch, length), mask_id, jnp.int32)
  else:
    z_BxL = prompt_BxL.astype(jnp.int32)
  vocab = process.vocab_size

  def predict(z, t):
    logits = apply(z, jnp.full((z.shape[0],), t, jnp.float32))
    logits = filter_logits(
      logits, temperature=temperature, top_k=top_k, top_p=top_p
    )
    return jax.nn.log_softmax(logits, axis=-1)

  def step(i, carry):
    z, logp_cache, cache_ok, nfe, key = carry
    key, draw_key = jax.random.split(key)
    t = 1.0 - i / num_steps
    s = 1.0 - (i + 1) / num_steps
    need_call = jnp.logical_not(cache_ok) if use_cache else jnp.bool_(True)
    logp = jax.lax.cond(need_call, lambda: predict(z, t), lambda: logp_cache)
    nfe = nfe + need_call.astype(jnp.int32)
    q = process.reverse_probs(jnp.exp(logp), z, s, t)
    is_last = i == num_steps - 1
    # At the last step everything still masked is revealed (MD4's schedules
    # keep alpha(0) = 1 - eps < 1, which would otherwise leave masks).
    stay = jnp.where(is_last, 0.0, q[..., vocab:])
    q = jnp.concatenate([q[..., :vocab], stay], axis=-1)
    draw = sample_categorical(draw_key, jnp.log(q))
    is_masked = z == mask_id
    z_new = jnp.where(is_masked, draw, z).astype(jnp.int32)
    changed = jnp.any(z_new != z)
    return z_new, logp, jnp.logical_not(changed), nfe, key

  logp0 = jnp.zeros((batch, length, vocab), jnp.float32)
  init = (z_BxL, logp0, jnp.bool_(False), jnp.int32(0), key)
  z_BxL, _, _, nfe, _ = jax.lax.fori_loop(0, num_steps, step, init)
  return z_BxL, nfe
