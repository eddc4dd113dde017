"""Ancestral sampling over sub-tokens for MDM-Prime processes.

Steps run from t = 1 down to 0 on a uniform grid of T steps. At step t ->
s every token with a masked digit draws x^i ~ p_theta(x^i | y_t) (the
carry-over distribution over the tokens consistent with its known
digits), and each of its masked digits is revealed independently with
probability (alpha(s) - alpha(t)) / (1 - alpha(t)) as the digit of x^i;
the last step reveals the rest. Drawing the whole token and then
revealing digits is the reverse kernel sum_x p_theta(x | y_t) q(y_s |
y_t, x) exactly, so digits of one token revealed at the same step are
drawn jointly.

Caching: the prediction depends only on y_t for a time-free network, so
the network is called only when some digit of the batch changed since
the last call and some digit is still masked (with T >> L l most steps
reveal nothing; one row makes at most L l calls). NFE counts the
calls made, as a traced int32; use_cache=False calls at every step and,
for a time-free network, returns the same tokens for the same key.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.prime import FAMILY, PrimeDiffusion
from ddlm_jax.sampling.base import Sampler, require_int
from ddlm_jax.sampling.noise import filter_logits, sample_categorical


def reveal_probabilities(process: PrimeDiffusion, num_steps: int):
  """(t_T, p_T): the time of each step's call and the probability that a
  masked digit is revealed at that step (1 at the last)."""
  times = jnp.linspace(1.0, 0.0, num_steps + 1, dtype=jnp.float32)
  alpha = jnp.asarray(process.schedule.alpha(times), jnp.float32)
  a_t, a_s = alpha[:-1], alpha[1:]
  p_T = (a_s - a_t) / jnp.maximum(1.0 - a_t, 1e-12)
  p_T = p_T.at[-1].set(1.0)
  return times[:-1], jnp.clip(p_T, 0.0, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrimeAncestralSampler(Sampler):
  """T-step ancestral sampling over sub-tokens, optionally cached.

  Attributes:
    num_steps: T; with T >= L l most steps change nothing and are free.
    use_cache: call the network only after a digit changed (needs a
      time-free network).
  """

  name: ClassVar[str] = 'prime_ancestral'
  families: ClassVar[tuple[str, ...]] = (FAMILY,)
  caches: ClassVar[bool] = True

  num_steps: int = 128
  use_cache: bool = True

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    self._set(use_cache=bool(self.use_cache))

  @property
  def needs_time_free(self) -> bool:
    return self.use_cache

  def check_applies(self, process) -> None:
    super().check_applies(process)
    if not isinstance(process, PrimeDiffusion):
      raise TypeError(
        f'{self.name} needs a ddlm_jax.diffusion.prime.PrimeDiffusion; got '
        f'{type(process).__name__}.'
      )

  def fill(self, apply, key, process: PrimeDiffusion, z_BxL, window_BxL):
    """Fills the generate-id positions inside the window: (z_BxL, nfe)."""
    (apply,) = self._applies(apply)
    batch = z_BxL.shape[0]
    todo_BxL = (z_BxL == process.generate_id) & window_BxL
    y_BxLxS = process.encode(z_BxL)
    mask = process.base
    t_T, p_T = reveal_probabilities(process, self.num_steps)

    def predict(y_BxLxS, t):
      logits_BxLxV = apply(process.network_input(y_BxLxS), jnp.full(batch, t))
      return process.denoiser_log_probs(logits_BxLxV, y_BxLxS, t)

    def step(carry, inputs):
      y_BxLxS, logp_BxLxV, stale, nfe = carry
      i, t, p = inputs
      call = stale if self.use_cache else jnp.bool_(True)
      logp_BxLxV = jax.lax.cond(
        call,
        lambda: predict(y_BxLxS, t).astype(logp_BxLxV.dtype),
        lambda: logp_BxLxV,
      )
      nfe = nfe + call.astype(jnp.int32)
      token_key, reveal_key = jax.random.split(jax.random.fold_in(key, i))
      filtered_BxLxV = filter_logits(logp_BxLxV, **self.filters)
      x_BxL = sample_categorical(token_key, filtered_BxLxV)
      digits_BxLxS = process.encode(x_BxL)
      open_BxLxS = (y_BxLxS == mask) & todo_BxL[..., None]
      hit_BxLxS = jax.random.uniform(reveal_key, y_BxLxS.shape) < p
      reveal_BxLxS = open_BxLxS & hit_BxLxS
      y_BxLxS = jnp.where(reveal_BxLxS, digits_BxLxS, y_BxLxS)
      # A new call is due once a digit changed, unless none is left open.
      left = jnp.any((y_BxLxS == mask) & todo_BxL[..., None])
      stale = jnp.any(reveal_BxLxS) & left
      return (y_BxLxS, logp_BxLxV, stale, nfe), None

    logp0 = jnp.zeros(z_BxL.shape + (process.vocab_size,), jnp.float32)
    init = (y_BxLxS, logp0, jnp.bool_(True), jnp.int32(0))
    steps = (jnp.arange(self.num_steps), t_T, p_T)
    (y_BxLxS, _, _, nfe), _ = jax.lax.scan(step, init, steps)
    out_BxL = jnp.where(todo_BxL, process.decode(y_BxLxS), z_BxL)
    return out_BxL.astype(z_BxL.dtype), nfe
