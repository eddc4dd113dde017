"""ReMDM remasking (arXiv 2503.00307): revealed tokens may be masked again.

Per step t -> s, with sigma_t the remasking probability of a revealed (free)
token, a masked position is revealed with probability
(alpha(s) - (1 - sigma_t) alpha(t)) / (1 - alpha(t)) (arXiv 2503.00307).
Strategies:

* 'cap': sigma_t = min(eta, clip((1 - alpha(s)) / alpha(t), 0, 1)) at every
  step but the last, on the model's own schedule (the max-capped schedule;
  eta = 0.04 in the paper).
* 'loop': the paper's rescaled schedule. The sampler's alpha is piecewise
  linear in time: from 0 (the all-mask state the chain starts in) up to
  alpha_on over [1, t_on] (ancestral steps), held at alpha_on over
  [t_on, t_off] while remasking with sigma = min(eta, (1 - alpha_on) /
  alpha_on) (the largest sigma for which a step can keep the masked
  fraction at 1 - alpha_on), then from alpha_on up to 1 over [t_off, 0]
  (ancestral steps). The paper fixes alpha(t_on) = alpha_on and
  the constant loop phase, not the shape of the two ramps: linear in time
  is our choice (the log-linear shape, rescaled). Starting at 0 rather than
  the schedule's alpha(1) makes the expected masked fraction during the
  loop exactly 1 - alpha_on (from alpha(1) it would be (1 - alpha_on) /
  (1 - alpha(1))). Steps are shared in proportion to the time spans
  1 - t_on, t_on - t_off and t_off (paper: eta = 0.02, t_on = 0.55,
  t_off = 0.05, alpha_on = 0.9). The network is called at the model time
  whose alpha equals the sampler's (`grid.make_alpha_grid`; t = 1 at the
  start), so a time-conditioned network sees a consistent input.

With eta = 0 'cap' is the ancestral sampler token for token, and 'loop' is
ancestral sampling on the rescaled alpha path. Prompt positions are never
remasked.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.base import Sampler, require_float, require_int

STRATEGIES = ('cap', 'loop')


def loop_phase_steps(
  num_steps: int, t_on: float, t_off: float
) -> tuple[int, int, int]:
  """(n_on, n_loop, n_off): steps of the three phases, summing to T.

  In proportion to the time spans, with at least one step on each ramp.
  """
  n_on = max(1, round(num_steps * (1.0 - t_on)))
  n_loop = round(num_steps * (t_on - t_off))
  n_loop = max(0, min(n_loop, num_steps - n_on - 1))
  return n_on, n_loop, num_steps - n_on - n_loop


def loop_alphas(
  num_steps: int, t_on: float, t_off: float, alpha_on: float
) -> np.ndarray:
  """The T + 1 sampler alphas of the loop strategy (float64).

  0 (the all-mask start) -> alpha_on in n_on equal steps, alpha_on for
  n_loop steps, alpha_on -> 1 in n_off equal steps.
  """
  n_on, n_loop, n_off = loop_phase_steps(num_steps, t_on, t_off)
  return np.concatenate(
    [
      np.linspace(0.0, alpha_on, n_on + 1),
      np.full(n_loop, alpha_on),
      np.linspace(alpha_on, 1.0, n_off + 1)[1:],
    ]
  )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReMDMSampler(Sampler):
  """ReMDM with the max-capped or the loop schedule.

  Attributes:
    num_steps: T, all phases together.
    eta: the cap on the remasking probability.
    strategy: 'cap' or 'loop'.
    t_on, t_off: the loop phase's time span (strategy 'loop').
    alpha_on: the sampler's alpha during the loop phase, in (0, 1): a
      fraction 1 - alpha_on of the free positions stays masked in
      expectation (strategy 'loop').
    use_cache: reuse a prediction when no row changed (time-free nets).
  """

  name: ClassVar[str] = 'remdm'

  num_steps: int = 128
  eta: float = 0.04
  strategy: str = 'cap'
  t_on: float = 0.55
  t_off: float = 0.05
  alpha_on: float = 0.9
  use_cache: bool = False

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    require_float('eta', self.eta, 0.0, 1.0)
    if self.strategy not in STRATEGIES:
      raise ValueError(
        f'strategy={self.strategy!r}; choose one of {STRATEGIES}.'
      )
    if self.strategy == 'loop':
      require_float('t_on', self.t_on, 0.0, 1.0)
      require_float('t_off', self.t_off, 0.0, self.t_on)
      alpha_on = float(self.alpha_on)
      if not 0.0 < alpha_on < 1.0:
        raise ValueError(
          f'alpha_on must be in (0, 1) (the unmasked fraction held during '
          f'the loop; the paper uses 0.9), got {self.alpha_on}.'
        )
      if self.num_steps < 3:
        raise ValueError('strategy loop needs num_steps >= 3.')
    self._set(use_cache=bool(self.use_cache))

  @property
  def needs_time_free(self) -> bool:
    return self.use_cache

  def grid(self, process) -> grid_lib.Grid:
    steps = self.num_steps
    if self.strategy == 'cap':
      t_grid = grid_lib.uniform_times(steps)
      return grid_lib.make_grid(
        process, t_grid, sigma_cap=np.full(steps, self.eta)
      )
    alpha_T1 = loop_alphas(steps, self.t_on, self.t_off, self.alpha_on)
    n_on, n_loop, _ = loop_phase_steps(steps, self.t_on, self.t_off)
    cap = np.zeros(steps)
    cap[n_on : n_on + n_loop] = self.eta
    return grid_lib.make_alpha_grid(process, alpha_T1, sigma_cap=cap)

  def fill(self, apply, key, process, z_BxL, window_BxL):
    z, nfe = grid_lib.stepwise_fill(
      self._applies(apply),
      key,
      process,
      z_BxL,
      window_BxL,
      self.grid(process),
      use_cache=self.use_cache,
      filters=self.filters,
    )
    return z, nfe[0]
