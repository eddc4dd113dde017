"""Model scheduling (arXiv 2604.02340): a light network on some steps.

The ancestral sampler's T steps are split into segments by fractions, each
run by the 'heavy' or the 'light' network, e.g. the sandwich
'light:0.25,heavy:0.5,light:0.25'. `apply` is the pair (heavy_apply,
light_apply) and the sampler returns nfe as int32 [2]: (heavy calls, light
calls), so FLOPs = nfe . (heavy FLOPs per call, light FLOPs per call)
(ddlm_jax.evaluation.cost.sampling_flops). With use_cache the per-row cache
of the ancestral sampler runs inside each segment.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.ancestral import AncestralSampler

MODELS = ('heavy', 'light')


def parse_pattern(pattern) -> tuple[tuple[str, float], ...]:
  """'light:0.25,heavy:0.5,light:0.25' (',' or '+'; or pairs) -> pairs."""
  if isinstance(pattern, str):
    pairs = []
    for part in pattern.replace('+', ',').split(','):
      name, _, frac = part.strip().partition(':')
      try:
        pairs.append((name.strip(), float(frac)))
      except ValueError:
        raise ValueError(
          f'bad segment {part!r} in pattern {pattern!r}; write '
          "'light:0.25,heavy:0.5,light:0.25'."
        ) from None
  else:
    pairs = [(str(n), float(f)) for n, f in pattern]
  for name, frac in pairs:
    if name not in MODELS or frac < 0:
      raise ValueError(
        f'segment ({name!r}, {frac}) in pattern {pattern!r}: the model must '
        f'be one of {MODELS} and the fraction >= 0.'
      )
  total = sum(f for _, f in pairs)
  if not pairs or abs(total - 1.0) > 1e-6:
    raise ValueError(
      f'pattern {pattern!r}: segment fractions must sum to 1, got {total}.'
    )
  return tuple(pairs)


def step_models(pattern, num_steps: int) -> np.ndarray:
  """Network index (0 heavy, 1 light) for each of the T steps."""
  bounds = np.round(
    np.cumsum([0.0] + [f for _, f in pattern]) * num_steps
  ).astype(int)
  out = np.zeros(num_steps, np.int32)
  for (name, _), a, b in zip(pattern, bounds[:-1], bounds[1:]):
    out[a:b] = MODELS.index(name)
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduledSampler(AncestralSampler):
  """Ancestral sampling with the heavy or the light network per segment.

  Attributes:
    pattern: segments 'model:fraction' in step order (fractions sum to 1).
  """

  name: ClassVar[str] = 'scheduled'
  num_models: ClassVar[int] = 2

  pattern: str = 'light:0.25,heavy:0.5,light:0.25'

  def __post_init__(self):
    super().__post_init__()
    pairs = parse_pattern(self.pattern)
    self._set(pattern=','.join(f'{n}:{f:g}' for n, f in pairs))

  def grid(self, process) -> grid_lib.Grid:
    models = step_models(parse_pattern(self.pattern), self.num_steps)
    return grid_lib.make_grid(
      process, grid_lib.uniform_times(self.num_steps), model=models
    )

  def fill(self, apply, key, process, z_BxL, window_BxL):
    applies = self._applies(apply)
    grid = self.grid(process)
    if self.use_cache:
      return grid_lib.jump_fill(
        applies, key, process, z_BxL, window_BxL, grid, filters=self.filters
      )
    return grid_lib.stepwise_fill(
      applies,
      key,
      process,
      z_BxL,
      window_BxL,
      grid,
      use_cache=False,
      filters=self.filters,
    )
