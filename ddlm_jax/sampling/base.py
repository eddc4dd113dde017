"""The interface every diffusion sampler implements.

A sampler is a frozen (hashable) dataclass of its parameters, checked when it
is built, before any tracing. Calling it,

  sampler(apply, key, process, *, batch, length, prompt_BxL=None)
    -> (tokens_BxL, nfe),

draws `batch` sequences; it is pure and jit-compatible, and the same key
gives the same tokens. `nfe` is an int32 scalar counting executed network
calls (model scheduling returns one count per network, see scheduling.py).
Prompts put the generate id (the mask id; V for uniform-state processes) at
the positions to generate, or are a pair (tokens_BxL, keep_BxL); every other
position is fixed (common.initial_state). `fill(apply, key, process, z_BxL,
window_BxL)` is the inner routine: it fills the positions holding the
generate id inside a window, which lets the semi-autoregressive sampler run
any sampler block by block.

Each sampler declares the process families it applies to (`families`, see
common.process_family); calling it on another family raises a ValueError
that lists the registered samplers which do apply.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import Process
from ddlm_jax.sampling.common import (
  check_process,
  initial_state,
  process_family,
)

# The registry's table, name -> sampler class. registry.py fills it when it
# is imported (always, through the package __init__); base.py cannot import
# the registry, which imports it. Only used to word incompatibility errors.
REGISTERED: dict[str, type] = {}


def build(samplers: dict, name: str, **params):
  """samplers[name](**params); a bad name or parameter raises ValueError.

  The table is an argument so that semi_ar can build its inner sampler from
  the samplers below it without importing the registry, which imports it.
  """
  if name not in samplers:
    raise ValueError(
      f'unknown sampler {name!r}; choose one of {sorted(samplers)}.'
    )
  allowed = tuple(f.name for f in dataclasses.fields(samplers[name]))
  unknown = sorted(set(params) - set(allowed))
  if unknown:
    raise ValueError(
      f'sampler {name!r} does not take {unknown}; it takes {list(allowed)}.'
    )
  return samplers[name](**params)


def compatible_samplers(family: str, table: dict | None = None) -> list[str]:
  """Names in the table (default: the registry's) that apply to `family`."""
  table = REGISTERED if table is None else table
  return sorted(
    name
    for name, cls in table.items()
    if family in getattr(cls, 'families', ('masked',))
  )


def check_family(sampler, process: Process, table: dict | None = None) -> str:
  """The process family; ValueError if `sampler` does not apply to it."""
  family = process_family(process)
  families = tuple(getattr(type(sampler), 'families', ('masked',)))
  if family not in families:
    others = compatible_samplers(family, table)
    hint = (
      f'for a {family} process use one of {others}'
      if others
      else f'no registered sampler applies to {family} processes'
    )
    raise ValueError(
      f'{sampler.name} applies to {" and ".join(families)} processes; {hint}.'
    )
  return family


def require_int(name: str, value, minimum: int) -> int:
  if isinstance(value, bool) or int(value) != value or value < minimum:
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}.')
  return int(value)


def require_float(name: str, value, low: float, high: float) -> float:
  value = float(value)
  if not low <= value <= high:
    raise ValueError(f'{name} must be in [{low}, {high}], got {value}.')
  return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampler(abc.ABC):
  """Base class: filtering of the predictions, and the prompt handling.

  Attributes:
    temperature: divides the logits (> 0).
    top_k: keep the k most likely tokens (0 keeps all).
    top_p: nucleus filtering (1 keeps all).
  """

  name: ClassVar[str] = ''
  # True when the sampler reuses predictions and so needs a time-free net.
  caches: ClassVar[bool] = False
  # Number of networks `apply` must hold (a tuple when > 1).
  num_models: ClassVar[int] = 1
  # Process families (common.process_family) the sampler applies to.
  families: ClassVar[tuple[str, ...]] = ('masked',)

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not float(self.temperature) > 0:
      raise ValueError(
        f'temperature must be > 0, got {self.temperature}; for near-greedy '
        'decoding use a small value such as 1e-4.'
      )
    require_int('top_k', self.top_k, 0)
    require_float('top_p', self.top_p, 0.0, 1.0)

  def _set(self, **kwargs):
    """Normalises a field of the frozen dataclass in __post_init__."""
    for k, v in kwargs.items():
      object.__setattr__(self, k, v)

  @property
  def filters(self) -> dict:
    return dict(
      temperature=float(self.temperature),
      top_k=int(self.top_k),
      top_p=float(self.top_p),
    )

  @property
  def needs_time_free(self) -> bool:
    """Whether the sampler's result is only exact for a time-free network."""
    return self.caches

  @abc.abstractmethod
  def fill(self, apply, key, process, z_BxL, window_BxL):
    """Fills generate-id positions of z inside the window: (z_BxL, nfe)."""

  def check_applies(self, process: Process) -> None:
    """TypeError for the AR twin, ValueError for another process family."""
    check_process(process)
    check_family(self, process)

  def _applies(self, apply):
    if self.num_models == 1:
      if isinstance(apply, (tuple, list)):
        raise TypeError(
          f'sampler {self.name!r} takes one network; got {len(apply)}.'
        )
      return (apply,)
    if not isinstance(apply, (tuple, list)) or len(apply) != self.num_models:
      raise TypeError(
        f'sampler {self.name!r} takes a tuple of {self.num_models} apply '
        'functions (heavy, light).'
      )
    return tuple(apply)

  def __call__(
    self,
    apply,
    key: jax.Array,
    process,
    *,
    batch: int,
    length: int,
    prompt_BxL: jax.Array | tuple | None = None,
  ):
    self.check_applies(process)
    self._applies(apply)
    z_BxL = initial_state(process, batch, length, prompt_BxL)
    window = jnp.ones((batch, length), bool)
    return self.fill(apply, key, process, z_BxL, window)
