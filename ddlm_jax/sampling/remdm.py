"""ReMDM remasking (arXiv 2503.00307): revealed tokens may be masked again.

Per step t -> s, with sigma_t the remasking probability of a revealed (free)
token, a masked position is revealed with probability
(alpha(s) - (1 - sigma_t) alpha(t)) / (1 - alpha(t)) (REFERENCE section 3).
Strategies:

* 'cap': sigma_t = min(eta, clip((1 - alpha(s)) / alpha(t), 0, 1)) at every
  step but the last (the max-capped schedule; eta = 0.04 in the paper).
* 'loop': ancestral steps from t = 1 to t_on, then a loop phase that holds
  alpha at alpha(t_on) and remasks with sigma = min(eta, (1 - alpha) / alpha)
  (each loop step keeps the expected masked fraction), then ancestral steps
  from t_on to 0. Steps are shared in proportion to the time spans
  1 - t_on, t_on - t_off and t_off (eta = 0.02 in the paper).

With eta = 0 both reduce to the ancestral sampler, token for token. Prompt
positions are never remasked.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.base import Sampler, require_float, require_int

STRATEGIES = ('cap', 'loop')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReMDMSampler(Sampler):
  """ReMDM with the max-capped or the loop schedule.

  Attributes:
    num_steps: T, all phases together.
    eta: the cap on the remasking probability.
    strategy: 'cap' or 'loop'.
    t_on, t_off: the loop phase's time span (strategy 'loop').
    use_cache: reuse a prediction when no row changed (time-free nets).
  """

  name: ClassVar[str] = 'remdm'

  num_steps: int = 128
  eta: float = 0.04
  strategy: str = 'cap'
  t_on: float = 0.55
  t_off: float = 0.05
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
    n_on = max(1, round(steps * (1.0 - self.t_on)))
    n_loop = round(steps * (self.t_on - self.t_off))
    n_loop = min(n_loop, steps - n_on - 1)
    n_off = steps - n_on - n_loop
    t_grid = np.concatenate(
      [
        np.linspace(1.0, self.t_on, n_on + 1),
        np.full(n_loop, self.t_on),
        np.linspace(self.t_on, 0.0, n_off + 1)[1:],
      ]
    )
    cap = np.zeros(steps)
    cap[n_on : n_on + n_loop] = self.eta
    return grid_lib.make_grid(process, t_grid, sigma_cap=cap)

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
