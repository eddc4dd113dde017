"""Pieces every diffusion sampler shares.

The process family (which samplers apply), the initial state from an
optional prompt (conditioning: prefix prompts and infilling), the filtered
log-probabilities of one network call, Gumbel noise keyed by (row, step,
position) so that two samplers that visit the same states draw the same
tokens, the inverse of a schedule (a time for a masked fraction), and top-n
selection of positions by a score.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.diffusion.base import DiffusionProcess, Process
from ddlm_jax.sampling.noise import filter_logits, gumbel

# apply(z_BxL, t_B) -> logits_BxLxV
ApplyFn = Callable[[jax.Array, jax.Array], jax.Array]


def check_process(process: Process) -> None:
  """Samplers need a diffusion process (not the AR twin)."""
  if not isinstance(process, DiffusionProcess):
    raise TypeError(
      f'{type(process).__name__} is not a diffusion process; use '
      'ddlm_jax.sampling.autoregressive_sample for the AR twin.'
    )


def process_family(process: Process) -> str:
  """The diffusion family a process declares ('masked', 'uniform', ...)."""
  if not isinstance(process, Process) or not process.family:
    raise TypeError(
      f'{type(process).__name__} is not a ddlm_jax.diffusion.base.Process '
      "with a family; subclass it and set family = 'masked' | 'uniform' "
      "| 'interpolating' | ..."
    )
  return process.family


def generate_id(process: Process) -> int:
  """The id that marks a position to generate (`process.generate_id`).

  Masked and interpolating processes use their mask id (= V). Uniform-state
  processes have no mask; V is outside their data range, and their samplers
  replace it by prior noise before any network call.
  """
  return int(process.generate_id)


def initial_state(
  process, batch: int, length: int, prompt_BxL=None
) -> jax.Array:
  """z with the generate id (see generate_id) wherever a token is drawn.

  `prompt_BxL` is None (generate everything), an int array holding the
  generate id at the positions to generate (every other position is fixed),
  or a pair (tokens_BxL, keep_BxL): positions where keep is True are fixed
  to tokens, the rest generated. The pair is the natural form for
  uniform-state processes, whose prompts have no mask token; both forms
  work for every family.
  """
  if batch < 1 or length < 1:
    raise ValueError(f'batch and length must be >= 1, got {batch}, {length}.')
  fill_id = generate_id(process)
  if prompt_BxL is None:
    return jnp.full((batch, length), fill_id, jnp.int32)
  if isinstance(prompt_BxL, (tuple, list)):
    if len(prompt_BxL) != 2:
      raise ValueError(
        f'a prompt pair must be (tokens_BxL, keep_BxL), got '
        f'{len(prompt_BxL)} items.'
      )
    tokens, keep = (jnp.asarray(p) for p in prompt_BxL)
    for what, arr in (('tokens', tokens), ('keep', keep)):
      if tuple(arr.shape) != (batch, length):
        raise ValueError(
          f'prompt {what} has shape {tuple(arr.shape)}, expected (batch, '
          f'length) = {(batch, length)}.'
        )
    keep = keep.astype(bool)
    return jnp.where(keep, tokens.astype(jnp.int32), fill_id)
  if tuple(prompt_BxL.shape) != (batch, length):
    raise ValueError(
      f'prompt_BxL has shape {tuple(prompt_BxL.shape)}, expected '
      f'(batch, length) = {(batch, length)}; put the mask id '
      f'{fill_id} at the positions to generate.'
    )
  return jnp.asarray(prompt_BxL).astype(jnp.int32)


def prefix_prompt(prefix_BxP, length: int, mask_id: int) -> np.ndarray:
  """A prompt that fixes the first P tokens and masks the rest."""
  prefix_BxP = np.atleast_2d(np.asarray(prefix_BxP, np.int32))
  if prefix_BxP.shape[1] > length:
    raise ValueError(
      f'prefix of {prefix_BxP.shape[1]} tokens is longer than the '
      f'sequence length {length}.'
    )
  out = np.full((prefix_BxP.shape[0], length), mask_id, np.int32)
  out[:, : prefix_BxP.shape[1]] = prefix_BxP
  return out


def infill_prompt(tokens_BxL, keep_BxL, mask_id: int) -> np.ndarray:
  """A prompt that keeps tokens where keep_BxL is True, masks elsewhere."""
  tokens_BxL = np.asarray(tokens_BxL, np.int32)
  keep_BxL = np.broadcast_to(np.asarray(keep_BxL, bool), tokens_BxL.shape)
  return np.where(keep_BxL, tokens_BxL, mask_id).astype(np.int32)


def log_probs(
  apply: ApplyFn,
  z_BxL: jax.Array,
  t_B: jax.Array,
  *,
  temperature: float,
  top_k: int,
  top_p: float,
) -> jax.Array:
  """One network call: filtered log p_theta(x0 | z), [B, L, V] float32."""
  logits = apply(z_BxL, t_B.astype(jnp.float32))
  return filtered_log_probs(
    logits, temperature=temperature, top_k=top_k, top_p=top_p
  )


def filtered_log_probs(logits, *, temperature, top_k, top_p) -> jax.Array:
  """log_softmax of the filtered logits (any leading shape), float32."""
  logits = filter_logits(
    logits, temperature=temperature, top_k=top_k, top_p=top_p
  )
  return jax.nn.log_softmax(logits, axis=-1)


def uses_feedback(applies) -> bool:
  """Whether the networks read their previous prediction (soft-masking).

  All or none: model scheduling with a soft-masked and a plain network
  would need two kinds of loop state.
  """
  flags = [bool(getattr(a, 'uses_feedback', False)) for a in applies]
  if any(flags) and not all(flags):
    raise ValueError(
      'mixing soft-masked and plain networks in one sampler is not '
      'supported; use soft-masked runs for every network.'
    )
  return all(flags)


def init_feedback(applies, z_BxL: jax.Array, vocab: int):
  """Loop state for feedback networks: (previous logits, whether set).

  None for plain networks, so their loops carry nothing extra. The first
  call of a feedback network is a plain pass (no previous prediction).
  """
  if not uses_feedback(applies):
    return None
  return jnp.zeros(z_BxL.shape + (vocab,), jnp.float32), jnp.bool_(False)


def predict(apply, z_BxL, t_B, memory, *, temperature, top_k, top_p):
  """One network call with feedback: (filtered log-probs, new memory).

  Soft-masked networks read the previous call's raw logits (memory) and
  leave their own; plain networks ignore memory (None).
  """
  filters = dict(temperature=temperature, top_k=top_k, top_p=top_p)
  if memory is None:
    return log_probs(apply, z_BxL, t_B, **filters), None
  prev_BxLxV, has_prev = memory
  logits = apply(
    z_BxL, t_B.astype(jnp.float32), prev_logits=prev_BxLxV, use_prev=has_prev
  )
  logp = jax.nn.log_softmax(filter_logits(logits, **filters), axis=-1)
  return logp, (logits.astype(jnp.float32), jnp.bool_(True))


def row_gumbel(
  row_keys_B: jax.Array,
  step_B: jax.Array,
  shape: tuple[int, int],
  positions_BxN: jax.Array | None = None,
) -> jax.Array:
  """Gumbel noise [B, L, V] for row b at step step_B[b] (shape = (L, V)).

  Keyed by (row, step, position) only, so a sampler that skips a row's idle
  steps, or reads only some positions (`positions_BxN`: the noise there,
  [B, N, V]), draws exactly the tokens that the step-by-step sampler draws.
  """
  length, vocab = shape
  if positions_BxN is None:
    positions_BxN = jnp.broadcast_to(
      jnp.arange(length), (row_keys_B.shape[0], length)
    )

  def row(key, step, positions_N):
    key = jax.random.fold_in(key, step)
    draw = lambda p: gumbel(jax.random.fold_in(key, p), (vocab,))
    return jax.vmap(draw)(positions_N)

  return jax.vmap(row)(row_keys_B, step_B, positions_BxN)


def alpha_inverse(schedule, alpha: jax.Array, iters: int = 40) -> jax.Array:
  """t with schedule.alpha(t) = alpha (bisection; alpha decreases in t)."""
  alpha = jnp.asarray(alpha, jnp.float32)
  lo = jnp.zeros_like(alpha)
  hi = jnp.ones_like(alpha)

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    above = schedule.alpha(mid) > alpha  # alpha(mid) too high: t is later.
    return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

  lo, hi = jax.lax.fori_loop(0, iters, body, (lo, hi))
  return 0.5 * (lo + hi)


def time_for_masked_fraction(schedule, z_BxL: jax.Array, mask_id: int):
  """The time whose expected masked fraction 1 - alpha(t) matches z's."""
  frac_B = jnp.mean((z_BxL == mask_id).astype(jnp.float32), axis=-1)
  return alpha_inverse(schedule, 1.0 - frac_B)


def select_top(
  score_BxL: jax.Array, eligible_BxL: jax.Array, n_B: jax.Array
) -> jax.Array:
  """Marks the n_B[b] eligible positions with the highest score per row."""
  score = jnp.where(eligible_BxL, score_BxL, -jnp.inf)
  order_BxL = jnp.argsort(-score, axis=-1, stable=True)
  rank_BxL = jnp.argsort(order_BxL, axis=-1, stable=True)
  return eligible_BxL & (rank_BxL < n_B[:, None])


def entropy(logp_BxLxV: jax.Array) -> jax.Array:
  """Entropy in nats of each position's predicted distribution."""
  p = jnp.exp(logp_BxLxV)
  return -jnp.sum(jnp.where(p > 0, p * logp_BxLxV, 0.0), axis=-1)
