"""Time-grid samplers: ancestral, ReMDM remasking and model scheduling.

A `Grid` holds, for each of T steps t_i -> s_i, the time at which the network
is called, the probability p_i that a masked position is revealed, the
probability sigma_i that a revealed free position is remasked (ReMDM; zero
for ancestral sampling) and which network makes the prediction (model
scheduling). Every quantity is state-independent, so it is computed once in
float64 numpy and used as a float32 constant.

Randomness is keyed so that different executions of the same chain agree:
each position carries a residual uniform v; at step i a masked position is
revealed iff v < p_i, otherwise v <- (v - p_i) / (1 - p_i), which is again
uniform given that it was not revealed. Revealed tokens are drawn by
Gumbel-max with noise keyed by (row, step, position). Hence:

* `stepwise_fill` walks every step. With use_cache, a step whose batch did
  not change reuses the previous prediction (MDLM's ddpm_cache).
* `jump_fill` (ancestral only, time-free network) first works out at which
  step each position is revealed, then visits, row by row, only the steps
  where that row reveals something: a per-row cache. Each loop iteration
  calls the network once for the whole batch with every row at its own next
  busy step, so NFE = max over rows of the number of busy steps <= min(T, L).
  It returns exactly the tokens of `stepwise_fill` with the same key.
  Since the reveal steps are drawn first, a call also knows which positions
  it will read: a network with `logits_at` (models.Transformer) runs its
  last block's queries, MLP and head only there (`reveal_budget` positions
  per row; a step that reveals more takes the full pass), and the Gumbel
  noise is drawn there only: ~0.77x of a full 4-layer call. Its logits
  equal the full pass's up to float rounding (~1e-6 relative: shorter
  matmuls), so a token can differ only where two candidates tie to that
  precision.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.sampling.common import (
  alpha_inverse,
  filtered_log_probs,
  init_feedback,
  predict,
  row_gumbel,
)


@dataclasses.dataclass(frozen=True, eq=False)
class Grid:
  """Per-step constants of a T-step sampler (numpy arrays of length T).

  Attributes:
    t: time passed to the network at step i.
    p_unmask: probability that a masked position is revealed at step i
      (1 at the last step).
    sigma: probability that a revealed free position is remasked.
    model: index of the network that predicts at step i.
  """

  t: np.ndarray
  p_unmask: np.ndarray
  sigma: np.ndarray
  model: np.ndarray

  @property
  def num_steps(self) -> int:
    return int(self.t.shape[0])

  @property
  def remasks(self) -> bool:
    return bool(np.any(self.sigma > 0))

  def segments(self) -> list[tuple[int, int, int]]:
    """Maximal runs (start, stop, model) of steps that use one network."""
    out, start = [], 0
    for i in range(1, self.num_steps + 1):
      if i == self.num_steps or self.model[i] != self.model[start]:
        out.append((start, i, int(self.model[start])))
        start = i
    return out


def alphas(process, t: np.ndarray) -> np.ndarray:
  """process.schedule.alpha(t) as float64 numpy (computed in float32)."""
  with jax.ensure_compile_time_eval():
    out = process.schedule.alpha(jnp.asarray(t, jnp.float32))
    return np.asarray(out, np.float64)


def make_grid(
  process,
  t_grid: np.ndarray,
  *,
  sigma_cap: np.ndarray | None = None,
  model: np.ndarray | None = None,
) -> Grid:
  """A grid from T + 1 times (t_0 = 1 > ... > t_T = 0, repeats allowed).

  sigma_cap[i] caps ReMDM's remasking probability at step i:
  sigma_i = min(sigma_cap_i, clip((1 - alpha(s)) / alpha(t), 0, 1)) (REFERENCE
  section 3); None means no remasking. The last step reveals everything.
  """
  t_grid = np.asarray(t_grid, np.float64)
  if t_grid.shape[0] < 2:
    raise ValueError('a grid needs at least one step.')
  a_T1 = alphas(process, t_grid)
  return _grid_from_alphas(a_T1, t_grid[:-1], sigma_cap, model)


def make_alpha_grid(
  process,
  alpha_grid: np.ndarray,
  *,
  sigma_cap: np.ndarray | None = None,
  model: np.ndarray | None = None,
) -> Grid:
  """A grid from T + 1 keep-probabilities a_0 <= ... <= a_T (repeats allowed).

  The sampler's own alpha path, not the model's schedule: step i reveals and
  remasks with make_grid's formulas at (alpha_t, alpha_s) = (a_i, a_{i+1}),
  and the network is called at the model time with alpha(t) = a_i (the
  schedule's inverse, clamped to [0, 1]), so a time-conditioned network sees
  inputs at the noise level it was trained for. a_0 is the start (0: all
  masked; t = 1 then) and a_T = 1.
  """
  a_T1 = np.asarray(alpha_grid, np.float64)
  if a_T1.ndim != 1 or a_T1.shape[0] < 2:
    raise ValueError(
      f'alpha_grid needs T + 1 >= 2 values, got shape {a_T1.shape}.'
    )
  if np.any(np.diff(a_T1) < 0) or a_T1[0] < 0 or a_T1[-1] > 1:
    raise ValueError(
      'alpha_grid must be non-decreasing within [0, 1] (a sampler reveals '
      f'tokens as alpha rises); got {a_T1.tolist()}.'
    )
  t_net = network_times(process, a_T1[:-1])
  return _grid_from_alphas(a_T1, t_net, sigma_cap, model)


def network_times(process, alpha: np.ndarray) -> np.ndarray:
  """Model times t with process.schedule.alpha(t) = alpha (float64 numpy)."""
  with jax.ensure_compile_time_eval():
    t = alpha_inverse(process.schedule, jnp.asarray(alpha, jnp.float32))
    return np.asarray(t, np.float64)


def _grid_from_alphas(a_T1, t_net, sigma_cap, model) -> Grid:
  """Grid constants from T + 1 alphas and the T network times."""
  steps = a_T1.shape[0] - 1
  a_t, a_s = a_T1[:-1], a_T1[1:]
  if sigma_cap is None:
    sigma = np.zeros(steps)
  else:
    bound = np.clip((1.0 - a_s) / np.maximum(a_t, 1e-12), 0.0, 1.0)
    sigma = np.minimum(np.asarray(sigma_cap, np.float64), bound)
  sigma[-1] = 0.0
  p = (a_s - (1.0 - sigma) * a_t) / np.maximum(1.0 - a_t, 1e-12)
  p = np.clip(p, 0.0, 1.0)
  p[-1] = 1.0
  if model is None:
    model = np.zeros(steps, np.int32)
  return Grid(
    t=np.asarray(t_net, np.float32),
    p_unmask=p.astype(np.float32),
    sigma=sigma.astype(np.float32),
    model=np.asarray(model, np.int32),
  )


def uniform_times(num_steps: int) -> np.ndarray:
  """t_i = 1 - i / T for i = 0..T."""
  return 1.0 - np.arange(num_steps + 1, dtype=np.float64) / num_steps


def _keys(key: jax.Array, batch: int):
  """(row keys for token noise, reveal key, remask key) from one split."""
  keys = jax.random.split(key, batch + 2)
  return keys[:batch], keys[batch], keys[batch + 1]


def _residual_step(v, masked, p, is_last):
  """Reveal decisions at one step and the updated residual uniforms."""
  reveal = masked & ((v < p) | is_last)
  v_next = jnp.where(masked & ~reveal, (v - p) / (1.0 - p), v)
  return reveal, v_next


def _draw_tokens(logp_BxLxV, row_keys_B, step_B):
  noise = row_gumbel(row_keys_B, step_B, logp_BxLxV.shape[1:])
  return jnp.argmax(logp_BxLxV + noise, axis=-1).astype(jnp.int32)


def stepwise_fill(
  applies,
  key: jax.Array,
  process,
  z_BxL: jax.Array,
  window_BxL: jax.Array,
  grid: Grid,
  *,
  use_cache: bool,
  filters: dict,
):
  """Walks all T steps; returns (z_BxL, nfe_M) with one count per network.

  Only positions masked at the start and inside window_BxL ever change.
  """
  batch, _ = z_BxL.shape
  mask_id = process.mask_id
  row_keys, reveal_key, remask_key = _keys(key, batch)
  free = (z_BxL == mask_id) & window_BxL
  v = jax.random.uniform(reveal_key, z_BxL.shape)
  t_T, p_T = jnp.asarray(grid.t), jnp.asarray(grid.p_unmask)
  sigma_T, model_T = jnp.asarray(grid.sigma), jnp.asarray(grid.model)
  steps, num_models = grid.num_steps, len(applies)
  remasks = grid.remasks

  def call(z, i, memory):
    t_B = jnp.full((batch,), t_T[i], jnp.float32)
    branches = [
      functools.partial(predict, a, z, t_B, memory, **filters) for a in applies
    ]
    if num_models == 1:
      return branches[0]()
    return jax.lax.switch(model_T[i], branches)

  def step(i, carry):
    z, v, logp_cache, cache_ok, nfe, memory = carry
    masked = (z == mask_id) & free
    # With use_cache a call is skipped when the batch did not change (a
    # soft-masked network's feedback is cached with its prediction).
    need = ~cache_ok if use_cache else jnp.bool_(True)
    logp, memory = jax.lax.cond(
      need, lambda: call(z, i, memory), lambda: (logp_cache, memory)
    )
    nfe = nfe + need.astype(jnp.int32) * jax.nn.one_hot(
      model_T[i], num_models, dtype=jnp.int32
    )
    reveal, v = _residual_step(v, masked, p_T[i], i == steps - 1)
    tokens = _draw_tokens(logp, row_keys, jnp.full((batch,), i))
    z_new = jnp.where(reveal, tokens, z)
    if remasks:
      k1, k2 = jax.random.split(jax.random.fold_in(remask_key, i))
      coin = jax.random.uniform(k1, z.shape) < sigma_T[i]
      remask = free & (z != mask_id) & coin
      z_new = jnp.where(remask, mask_id, z_new)
      v = jnp.where(remask, jax.random.uniform(k2, z.shape), v)
    cache_ok = ~jnp.any(z_new != z)
    return z_new, v, logp, cache_ok, nfe, memory

  vocab = process.vocab_size
  logp0 = jnp.zeros(z_BxL.shape + (vocab,), jnp.float32)
  memory = init_feedback(applies, z_BxL, vocab)
  nfe0 = jnp.zeros(num_models, jnp.int32)
  init = (z_BxL, v, logp0, jnp.bool_(False), nfe0, memory)
  z_BxL, _, _, _, nfe, _ = jax.lax.fori_loop(0, steps, step, init)
  return z_BxL, nfe


def reveal_steps(v_BxL, free_BxL, grid: Grid) -> jax.Array:
  """Step at which each free position is revealed (T for fixed ones)."""
  steps = grid.num_steps
  p_T = jnp.asarray(grid.p_unmask)

  def body(i, carry):
    r, v = carry
    pending = free_BxL & (r == steps)
    reveal, v = _residual_step(v, pending, p_T[i], i == steps - 1)
    return jnp.where(reveal, i, r), v

  r0 = jnp.full(v_BxL.shape, steps, jnp.int32)
  r, _ = jax.lax.fori_loop(0, steps, body, (r0, v_BxL))
  return r


def reveal_budget(grid: Grid, length: int) -> int | None:
  """Positions per row that one step of the grid rarely exceeds (or None).

  A free position is revealed at step i with probability
  P_i = p_i * prod_{j<i} (1 - p_j); with mu = length * max_i P_i the budget
  is mu + 4 sqrt(mu) + 4, rounded up to a multiple of 8. A step that
  reveals more in some row takes the full pass, so the budget only decides
  speed. None when it would exceed half the length (little to save).
  """
  p_T = np.asarray(grid.p_unmask, np.float64)
  reach_T = np.concatenate([[1.0], np.cumprod(1.0 - p_T)[:-1]])
  mu = length * float(np.max(p_T * reach_T))
  budget = 8 * int(np.ceil((mu + 4.0 * np.sqrt(mu) + 4.0) / 8.0))
  return budget if 2 * budget <= length else None


def positional_logits(apply):
  """The network's `logits_at(z_BxL, t_B, idx_BxN)` if it offers one.

  Models that can give the logits of a plain pass at chosen positions only
  (`models.Transformer.logits_at`) say so with `supports_logits_at()`.
  """
  supports = getattr(apply, 'supports_logits_at', None)
  return apply.logits_at if supports is not None and supports() else None


def _fill_positions(
  at, z_BxL, cur_B, t_B, reveal_BxL, row_keys, *, budget: int, filters: dict
):
  """An ancestral reveal that runs the network only at the revealed positions.

  Same tokens as the full pass: the logits at a position do not depend on
  which other positions are read, and the Gumbel noise is keyed by row,
  step and position, so it is drawn at those positions only. At most
  `budget` positions per row (the caller checks), padded with index L,
  which the final scatter drops.
  """
  batch, length = z_BxL.shape
  idx_BxN = jax.vmap(
    lambda r: jnp.nonzero(r, size=budget, fill_value=length)[0]
  )(reveal_BxL)
  logits_BxNxV = at(z_BxL, t_B.astype(jnp.float32), idx_BxN)
  logp_BxNxV = filtered_log_probs(logits_BxNxV, **filters)
  noise_BxNxV = row_gumbel(
    row_keys, cur_B, (length, logits_BxNxV.shape[-1]), idx_BxN
  )
  tokens_BxN = jnp.argmax(logp_BxNxV + noise_BxNxV, axis=-1).astype(jnp.int32)
  rows_Bx1 = jnp.arange(batch)[:, None]
  return z_BxL.at[rows_Bx1, idx_BxN].set(tokens_BxN, mode='drop')


def jump_fill(
  applies,
  key: jax.Array,
  process,
  z_BxL: jax.Array,
  window_BxL: jax.Array,
  grid: Grid,
  *,
  filters: dict,
):
  """Per-row cached ancestral sampling; same tokens as `stepwise_fill`.

  Needs time-free networks and a grid without remasking.
  """
  if grid.remasks:
    raise ValueError('jump_fill cannot remask; use stepwise_fill.')
  batch, _ = z_BxL.shape
  mask_id, steps = process.mask_id, grid.num_steps
  row_keys, reveal_key, _ = _keys(key, batch)
  free = (z_BxL == mask_id) & window_BxL
  v = jax.random.uniform(reveal_key, z_BxL.shape)
  r_BxL = reveal_steps(v, free, grid)
  rows = jnp.arange(batch)[:, None]
  busy_BxT = (
    jnp.zeros((batch, steps + 1), bool).at[rows, r_BxL].set(True)[:, :steps]
  )
  t_T = jnp.asarray(grid.t)
  step_ids = jnp.arange(steps)
  nfe = jnp.zeros(len(applies), jnp.int32)
  # Soft-masked networks: each row reads its own previous call's logits.
  memory = init_feedback(applies, z_BxL, process.vocab_size)
  budget = reveal_budget(grid, z_BxL.shape[1])
  for start, stop, model in grid.segments():
    apply = applies[model]
    at = None if memory is not None else positional_logits(apply)
    in_seg = busy_BxT & (step_ids >= start) & (step_ids < stop)
    order_BxT = jnp.sort(jnp.where(in_seg, step_ids, steps), axis=-1)
    rounds = jnp.max(jnp.sum(in_seg, axis=-1))

    def full(z, cur_B, t_B, reveal, memory, apply=apply):
      logp, memory = predict(apply, z, t_B, memory, **filters)
      tokens = _draw_tokens(logp, row_keys, cur_B)
      return jnp.where(reveal, tokens, z), memory

    def body(carry, full=full, at=at, order_BxT=order_BxT):
      z, g, memory = carry
      cur_B = order_BxT[:, g]
      t_B = t_T[jnp.minimum(cur_B, steps - 1)]
      reveal = free & (r_BxL == cur_B[:, None])
      if at is None or budget is None:
        z, memory = full(z, cur_B, t_B, reveal, memory)
      else:
        z = jax.lax.cond(
          jnp.max(jnp.sum(reveal, axis=-1)) <= budget,
          lambda: _fill_positions(
            at,
            z,
            cur_B,
            t_B,
            reveal,
            row_keys,
            budget=budget,
            filters=filters,
          ),
          lambda: full(z, cur_B, t_B, reveal, None)[0],
        )
      return z, g + 1, memory

    z_BxL, done, memory = jax.lax.while_loop(
      lambda c, rounds=rounds: c[1] < rounds,
      body,
      (z_BxL, jnp.int32(0), memory),
    )
    nfe = nfe.at[model].add(done)
  return z_BxL, nfe
