"""Noise schedules for masked (absorbing) diffusion.

A schedule gives the keep-probability alpha(t), decreasing from about 1 at
t = 0 to about 0 at t = 1, and its time derivative. The continuous-time ELBO
weight of a masked token is -alpha'(t) / (1 - alpha(t)).

MD4 (Shi et al. 2024) wraps a base curve abar(t) as
alpha(t) = (1 - 2 eps) abar(t) + eps with eps = 1e-4. MDLM (Sahoo et al. 2024)
uses the log-linear schedule: mask probability (1 - eps) t with eps = 1e-3,
whose weight is exactly 1 / t.
"""

from __future__ import annotations

import abc
import dataclasses
import math

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Schedule(abc.ABC):
  """Base class: subclasses define `alpha` and `dalpha`."""

  @abc.abstractmethod
  def alpha(self, t):
    """Keep-probability at time t in [0, 1]."""

  @abc.abstractmethod
  def dalpha(self, t):
    """Time derivative of alpha."""

  def weight(self, t):
    """Continuous-time ELBO weight -alpha'(t) / (1 - alpha(t))."""
    return -self.dalpha(t) / (1.0 - self.alpha(t))

  def discrete_weight(self, s, t):
    """Weight (alpha(s) - alpha(t)) / (1 - alpha(t)) of one step s < t."""
    return (self.alpha(s) - self.alpha(t)) / (1.0 - self.alpha(t))


@dataclasses.dataclass(frozen=True)
class _MD4Schedule(Schedule):
  """alpha(t) = (1 - 2 eps) abar(t) + eps; subclasses give abar and abar'."""

  eps: float = 1e-4

  @abc.abstractmethod
  def abar(self, t):
    """Base curve from 1 (t = 0) to 0 (t = 1)."""

  @abc.abstractmethod
  def dabar(self, t):
    """Time derivative of abar."""

  def alpha(self, t):
    return (1.0 - 2.0 * self.eps) * self.abar(t) + self.eps

  def dalpha(self, t):
    return (1.0 - 2.0 * self.eps) * self.dabar(t)


@dataclasses.dataclass(frozen=True)
class LinearSchedule(_MD4Schedule):
  """MD4 linear: abar(t) = 1 - t."""

  def abar(self, t):
    return 1.0 - t

  def dabar(self, t):
    return -jnp.ones_like(t)


@dataclasses.dataclass(frozen=True)
class CosineSchedule(_MD4Schedule):
  """MD4 cosine: abar(t) = 1 - cos(pi/2 (1 - t))."""

  def abar(self, t):
    return 1.0 - jnp.cos(0.5 * math.pi * (1.0 - t))

  def dabar(self, t):
    return -0.5 * math.pi * jnp.sin(0.5 * math.pi * (1.0 - t))


@dataclasses.dataclass(frozen=True)
class PolySchedule(_MD4Schedule):
  """MD4 polynomial: abar(t) = 1 - t^k."""

  k: float = 2.0

  def abar(self, t):
    return 1.0 - t**self.k

  def dabar(self, t):
    return -self.k * t ** (self.k - 1.0)


@dataclasses.dataclass(frozen=True)
class LogLinearSchedule(Schedule):
  """MDLM log-linear: 1 - alpha(t) = (1 - eps) t, so the weight is 1 / t."""

  eps: float = 1e-3

  def alpha(self, t):
    return 1.0 - (1.0 - self.eps) * t

  def dalpha(self, t):
    return -(1.0 - self.eps) * jnp.ones_like(t)

  def weight(self, t):
    # Exact simplification of -alpha' / (1 - alpha); avoids 0/0 at t = 0.
    return 1.0 / t


SCHEDULES = {
  'linear': LinearSchedule,
  'cosine': CosineSchedule,
  'poly': PolySchedule,
  'loglinear': LogLinearSchedule,
}


def get_schedule(name: str, **kwargs) -> Schedule:
  """Builds a schedule by name ('linear', 'cosine', 'poly', 'loglinear')."""
  if name not in SCHEDULES:
    raise ValueError(
      f'Unknown noise schedule {name!r}; choose one of {sorted(SCHEDULES)}.'
    )
  return SCHEDULES[name](**kwargs)
