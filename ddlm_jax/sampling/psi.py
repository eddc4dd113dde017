"""Psi-samplers: predictor-corrector mixtures (Duo chapter II, 2602.21185).

With p0 the filtered denoiser at (z_t, t), each step t -> s draws
  z_s ~ kappa_t q(z_s | z_t, p0) + (1 - kappa_t) (alpha_s p0 + (1 - alpha_s) pi)
(arXiv 2602.21185): the ancestral posterior mixed with the forward
process applied to p0 (pi uniform for uniform-state, (1 - p_u) e_m + p_u / V
for interpolating, e_m for masked processes). kappa = 1 is ancestral
sampling; kappa = 0 the pure corrector that re-noises p0 to time s.

kappa rules (one per phase; every rule but the first two goes through a
ReMDM-style remasking probability sigma_t, kappa_t = clip(1 - sigma_t / (1 -
alpha_s), 0, 1), so that on a masked process the rule IS ReMDM's):
  'ancestral'        kappa = 1 (Duo: pure-posterior)
  'pc'               kappa = 0 (pure-pc)
  'constant_kappa'   kappa = eta (Duo's 'constant-eta', which sets kappa)
  'max_capped_eta'   sigma = min(eta, (1 - alpha_s) / alpha_t)
  'max_rescale_eta'  sigma = eta min(1, (1 - alpha_s) / alpha_t) (ReMDM's
                     rescaled schedule; Duo's code multiplies eta by the
                     capped sigma instead, eta min(eta, ...), which we read
                     as a slip)
  'constant_eta'     sigma = eta (Duo: constant-remdm)
A phase rule is '' (use `kappa` at `eta`), a kind, or 'kind:eta'.

Time profile and phases. 'linear': T uniform steps from 1 to 0, a step is
in the high phase if its start time t > t_hi, low if t <= t_lo, middle
otherwise (phase_bounds = (t_hi, t_lo); the default (1, 0) makes every step
middle). 'loop' (Duo's linear-constant-linear, ReMDM's loop): steps from 1
to t_hi (high), then steps that hold t = t_hi (middle: s = t, so the
posterior is the identity and only the corrector moves tokens), then t_hi
to 0 (low), the step counts in proportion to 1 - t_hi, t_hi - t_lo and
t_lo as in remdm.py. The last step is always the noise removal (alpha_s =
1, kappa = 1): a draw from p0, or its argmax with greedy_tail.

Masked processes. q(z_s | z_t, p0) is the masked ancestral posterior over V
+ 1 ids and p0 carries over revealed tokens (SUBS), so on a revealed token
the mixture keeps it w.p. kappa + (1 - kappa) alpha_s and re-masks it w.p.
(1 - kappa)(1 - alpha_s); on a masked one it reveals w.p. (alpha_s - (1 -
sigma) alpha_t) / (1 - alpha_t) with sigma = (1 - kappa)(1 - alpha_s).
That is exactly ReMDM with remasking probability sigma, so the masked path
runs the ReMDM step of grid.py (the same residual-uniform randomness): with
kappa = 1 it returns the tokens of the 'ancestral' sampler, and with
'max_capped_eta' those of 'remdm' (strategy cap) whenever eta <= 1 -
alpha_s (kappa not clipped), for the same key. Uniform-state and
interpolating processes run uniform.categorical_fill: with kappa = 1 the
tokens of 'uniform_ancestral'. NFE = T either way.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.base import Sampler, require_float, require_int
from ddlm_jax.sampling.common import (
  init_feedback,
  predict,
  process_family,
  row_gumbel,
)
from ddlm_jax.sampling.uniform import FAMILIES, categorical_fill

KAPPA_KINDS = (
  'ancestral',
  'pc',
  'constant_kappa',
  'max_capped_eta',
  'max_rescale_eta',
  'constant_eta',
)
TIME_PROFILES = ('linear', 'loop')
PHASES = ('high', 'middle', 'low')


def parse_rule(rule: str, kind: str, eta: float) -> tuple[str, float]:
  """'' -> (kind, eta); 'kind' -> (kind, eta); 'kind:eta' -> (kind, eta')."""
  rule = str(rule).strip()
  if rule:
    name, _, value = rule.partition(':')
    kind = name.strip()
    if value.strip():
      try:
        eta = float(value)
      except ValueError:
        raise ValueError(
          f"bad kappa rule {rule!r}; write 'kind' or 'kind:eta', e.g. "
          "'max_capped_eta:0.02'."
        ) from None
  if kind not in KAPPA_KINDS:
    raise ValueError(f'kappa rule {kind!r}; choose one of {KAPPA_KINDS}.')
  return kind, require_float('eta', eta, 0.0, 1.0)


def psi_kappas(kind: str, eta: float, alpha_s, alpha_t) -> np.ndarray:
  """kappa_t of one rule for steps with keep-probabilities alpha_s, alpha_t.

  Float64 numpy; kappa = 1 where 1 - alpha_s = 0 (nothing left to mix).
  """
  a_s = np.asarray(alpha_s, np.float64)
  a_t = np.asarray(alpha_t, np.float64)
  if kind == 'ancestral':
    return np.ones_like(a_s)
  if kind == 'pc':
    return np.zeros_like(a_s)
  if kind == 'constant_kappa':
    return np.full_like(a_s, eta)
  room = 1.0 - a_s
  ratio = np.divide(room, a_t, out=np.full_like(a_s, np.inf), where=a_t > 0)
  if kind == 'max_capped_eta':
    sigma = np.minimum(eta, ratio)
  elif kind == 'max_rescale_eta':
    sigma = eta * np.minimum(1.0, ratio)
  elif kind == 'constant_eta':
    sigma = np.full_like(a_s, eta)
  else:
    raise ValueError(f'kappa rule {kind!r}; choose one of {KAPPA_KINDS}.')
  frac = np.divide(sigma, room, out=np.zeros_like(a_s), where=room > 0)
  return np.clip(1.0 - frac, 0.0, 1.0)


def _alpha(process, t: np.ndarray) -> np.ndarray:
  """alpha(t) as grid.py evaluates it (float32, then float64)."""
  with jax.ensure_compile_time_eval():
    out = process.schedule.alpha(jnp.asarray(t, jnp.float32))
    return np.asarray(out, np.float64)


def time_grid(
  num_steps: int, profile: str, t_hi: float, t_lo: float
) -> tuple[np.ndarray, np.ndarray]:
  """(T + 1 times from 1 to 0, phase index 0/1/2 of each of the T steps)."""
  if profile == 'linear':
    t = 1.0 - np.arange(num_steps + 1, dtype=np.float64) / num_steps
    start = t[:-1]
    phase = np.where(start > t_hi, 0, np.where(start <= t_lo, 2, 1))
    return t, phase.astype(np.int32)
  n_hi = max(1, round(num_steps * (1.0 - t_hi)))
  n_mid = min(round(num_steps * (t_hi - t_lo)), num_steps - n_hi - 1)
  n_lo = num_steps - n_hi - n_mid
  t = np.concatenate(
    [
      np.linspace(1.0, t_hi, n_hi + 1),
      np.full(n_mid, t_hi),
      np.linspace(t_hi, 0.0, n_lo + 1)[1:],
    ]
  )
  phase = np.concatenate(
    [np.zeros(n_hi), np.ones(n_mid), np.full(n_lo, 2)]
  ).astype(np.int32)
  return t, phase


@dataclasses.dataclass(frozen=True, kw_only=True)
class PsiSampler(Sampler):
  """Psi predictor-corrector sampling for masked, uniform and interpolating.

  Attributes:
    num_steps: T, all phases together (the last one is the noise removal).
    kappa: the default kappa rule (see the module docstring).
    eta: the default rule's parameter.
    high, middle, low: per-phase rules ('' = kappa at eta, 'kind' or
      'kind:eta').
    phase_bounds: (t_hi, t_lo) with 0 <= t_lo <= t_hi <= 1.
    time_profile: 'linear' or 'loop' (the middle phase holds t = t_hi).
    greedy_tail: the last step takes the denoiser's argmax.
  """

  name: ClassVar[str] = 'psi'
  families: ClassVar[tuple[str, ...]] = ('masked',) + FAMILIES

  num_steps: int = 128
  kappa: str = 'max_capped_eta'
  eta: float = 0.01
  high: str = ''
  middle: str = ''
  low: str = ''
  phase_bounds: tuple = (1.0, 0.0)
  time_profile: str = 'linear'
  greedy_tail: bool = False

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    parse_rule('', self.kappa, self.eta)
    for phase in PHASES:
      parse_rule(getattr(self, phase), self.kappa, self.eta)
    bounds = tuple(self.phase_bounds)
    if len(bounds) != 2:
      raise ValueError(
        f'phase_bounds must be (t_hi, t_lo), got {self.phase_bounds!r}.'
      )
    t_hi = require_float('phase_bounds t_hi', bounds[0], 0.0, 1.0)
    t_lo = require_float('phase_bounds t_lo', bounds[1], 0.0, t_hi)
    self._set(phase_bounds=(t_hi, t_lo), greedy_tail=bool(self.greedy_tail))
    if self.time_profile not in TIME_PROFILES:
      raise ValueError(
        f'time_profile={self.time_profile!r}; choose one of {TIME_PROFILES}.'
      )
    if self.time_profile == 'loop':
      if not 0.0 < t_lo < t_hi < 1.0:
        raise ValueError(
          f'time_profile loop needs 0 < t_lo < t_hi < 1, got phase_bounds '
          f'{(t_hi, t_lo)}; e.g. (0.55, 0.05) as in ReMDM.'
        )
      if self.num_steps < 3:
        raise ValueError('time_profile loop needs num_steps >= 3.')

  def kappa_schedule(self, process) -> tuple[np.ndarray, np.ndarray]:
    """(t_grid [T + 1], kappa [T]) in float64; the last kappa is 1."""
    t_hi, t_lo = self.phase_bounds
    t, phase = time_grid(self.num_steps, self.time_profile, t_hi, t_lo)
    a = _alpha(process, t)
    a_t, a_s = a[:-1], a[1:]
    kappa = np.ones(self.num_steps)
    for index, field in enumerate(PHASES):
      kind, eta = parse_rule(getattr(self, field), self.kappa, self.eta)
      sel = phase == index
      kappa[sel] = psi_kappas(kind, eta, a_s[sel], a_t[sel])
    kappa[-1] = 1.0
    return t, kappa

  def fill(self, apply, key, process, z_BxL, window_BxL):
    apply = self._applies(apply)[0]
    t, kappa = self.kappa_schedule(process)
    if process_family(process) in FAMILIES:
      z_BxL = categorical_fill(
        apply,
        key,
        process,
        z_BxL,
        window_BxL,
        t,
        kappa,
        greedy_tail=self.greedy_tail,
        filters=self.filters,
      )
      return z_BxL, jnp.int32(self.num_steps)
    a_s = _alpha(process, t[1:])
    grid = grid_lib.make_grid(process, t, sigma_cap=(1.0 - kappa) * (1.0 - a_s))
    z_BxL = masked_fill(
      apply,
      key,
      process,
      z_BxL,
      window_BxL,
      grid,
      greedy_tail=self.greedy_tail,
      filters=self.filters,
    )
    return z_BxL, jnp.int32(self.num_steps)


def masked_fill(
  apply,
  key: jax.Array,
  process,
  z_BxL: jax.Array,
  window_BxL: jax.Array,
  grid: grid_lib.Grid,
  *,
  greedy_tail: bool,
  filters: dict,
) -> jax.Array:
  """ReMDM steps on a grid, with grid.stepwise_fill's randomness, one call
  per step; with greedy_tail the last step reveals argmax tokens.

  The same key gives the tokens of grid.stepwise_fill (use_cache=False):
  per-position residual uniforms decide reveals, Gumbel noise keyed by
  (row, step, position) draws tokens, and fold_in(remask key, step) the
  remasking.
  """
  batch = z_BxL.shape[0]
  mask_id, steps = process.mask_id, grid.num_steps
  keys = jax.random.split(key, batch + 2)
  row_keys, reveal_key, remask_key = keys[:batch], keys[batch], keys[batch + 1]
  free = (z_BxL == mask_id) & window_BxL
  v = jax.random.uniform(reveal_key, z_BxL.shape)
  t_T, p_T = jnp.asarray(grid.t), jnp.asarray(grid.p_unmask)
  sigma_T = jnp.asarray(grid.sigma)
  remasks = grid.remasks

  def step(i, carry):
    z, v, memory = carry
    masked = (z == mask_id) & free
    t_B = jnp.full((batch,), t_T[i], jnp.float32)
    logp, memory = predict(apply, z, t_B, memory, **filters)
    is_last = i == steps - 1
    reveal = masked & ((v < p_T[i]) | is_last)
    v = jnp.where(masked & ~reveal, (v - p_T[i]) / (1.0 - p_T[i]), v)
    noise = row_gumbel(row_keys, jnp.full((batch,), i), logp.shape[1:])
    tokens = jnp.argmax(logp + noise, axis=-1).astype(jnp.int32)
    if greedy_tail:
      best = jnp.argmax(logp, axis=-1).astype(jnp.int32)
      tokens = jnp.where(is_last, best, tokens)
    z_new = jnp.where(reveal, tokens, z)
    if remasks:
      k1, k2 = jax.random.split(jax.random.fold_in(remask_key, i))
      coin = jax.random.uniform(k1, z.shape) < sigma_T[i]
      remask = free & (z != mask_id) & coin
      z_new = jnp.where(remask, mask_id, z_new)
      v = jnp.where(remask, jax.random.uniform(k2, z.shape), v)
    return z_new, v, memory

  memory = init_feedback([apply], z_BxL, process.vocab_size)
  z_BxL, _, _ = jax.lax.fori_loop(0, steps, step, (z_BxL, v, memory))
  return z_BxL
