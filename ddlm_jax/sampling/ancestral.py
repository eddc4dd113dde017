"""Ancestral sampler for masked diffusion, with the caching rule.

Steps run from t = 1 down to 0 on a uniform grid of T steps. At each step a
masked token is revealed with probability (alpha(s) - alpha(t)) / (1 -
alpha(t)), drawn from p_theta; revealed tokens never change; the last step
reveals whatever is left. With a time-free network the prediction depends
only on z_t, so a step that reveals nothing needs no network call (MDLM's
ddpm_cache, RADD). The cache here is per row (grid.jump_fill): each row skips
its own idle steps, so NFE <= min(T, length) and, for T >> length, NFE is
close to the number of distinct states of the slowest row. use_cache=False
walks every step and returns the same tokens for the same key.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.base import Sampler, require_int
from ddlm_jax.sampling.common import ApplyFn


@dataclasses.dataclass(frozen=True, kw_only=True)
class AncestralSampler(Sampler):
  """T-step ancestral sampling (MD4/MDLM), optionally cached.

  Attributes:
    num_steps: T; with T >= length most steps are free when cached.
    use_cache: per-row caching; needs a time-free network.
  """

  name: ClassVar[str] = 'ancestral'

  num_steps: int = 128
  use_cache: bool = True

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    self._set(use_cache=bool(self.use_cache))

  @property
  def needs_time_free(self) -> bool:
    return self.use_cache

  def grid(self, process) -> grid_lib.Grid:
    return grid_lib.make_grid(process, grid_lib.uniform_times(self.num_steps))

  def fill(self, apply, key, process, z_BxL, window_BxL):
    applies = self._applies(apply)
    grid = self.grid(process)
    if self.use_cache:
      z, nfe = grid_lib.jump_fill(
        applies, key, process, z_BxL, window_BxL, grid, filters=self.filters
      )
    else:
      z, nfe = grid_lib.stepwise_fill(
        applies,
        key,
        process,
        z_BxL,
        window_BxL,
        grid,
        use_cache=False,
        filters=self.filters,
      )
    return z, nfe[0]


def ancestral_sample(
  apply: ApplyFn,
  key: jax.Array,
  process,
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
  sampler = AncestralSampler(
    num_steps=num_steps,
    use_cache=use_cache,
    temperature=temperature,
    top_k=top_k,
    top_p=top_p,
  )
  return sampler(
    apply, key, process, batch=batch, length=length, prompt_BxL=prompt_BxL
  )
