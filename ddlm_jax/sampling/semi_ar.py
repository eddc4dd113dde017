"""Semi-autoregressive sampling: left-to-right blocks, diffusion inside.

The sequence is cut into blocks of `block_length` positions. Block b is
filled by an inner sampler (any registered sampler with one network) while
later blocks stay masked and earlier blocks are fixed; the network always
sees the whole sequence. NFE is the sum over blocks. Prompt positions inside
a block stay fixed as everywhere else. Masked processes only (later blocks
must hold the mask id), and the inner sampler must apply to masked
processes too (psi does; uniform_ancestral and loo_gibbs do not).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.sampling.ancestral import AncestralSampler
from ddlm_jax.sampling.base import Sampler, build, check_family, require_int
from ddlm_jax.sampling.psi import PsiSampler
from ddlm_jax.sampling.remdm import ReMDMSampler
from ddlm_jax.sampling.scheduling import ScheduledSampler
from ddlm_jax.sampling.threshold import ThresholdSampler
from ddlm_jax.sampling.uniform import LOOGibbsSampler, UniformAncestralSampler
from ddlm_jax.sampling.unmasking import (
  ConfidenceSampler,
  EBSampler,
  FirstHittingSampler,
)

# Every registered sampler that applies to masked processes but semi_ar
# itself, which cannot nest; the registry adds semi_ar and the samplers
# below to these. Two-network ones are refused when built.
INNER_SAMPLERS: dict[str, type[Sampler]] = {
  cls.name: cls
  for cls in (
    AncestralSampler,
    FirstHittingSampler,
    ConfidenceSampler,
    EBSampler,
    ReMDMSampler,
    ScheduledSampler,
    PsiSampler,
    ThresholdSampler,
  )
}

# Samplers for uniform-state / interpolating processes only: registered,
# but not usable inside semi_ar (named here so that its error says why).
NON_MASKED_SAMPLERS: dict[str, type[Sampler]] = {
  cls.name: cls for cls in (UniformAncestralSampler, LOOGibbsSampler)
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SemiARSampler(Sampler):
  """Block-wise left-to-right generation.

  Attributes:
    block_length: positions per block (the last block may be shorter).
    inner: name of the sampler run inside each block.
    inner_params: that sampler's parameters (a dict, or pairs); its
      temperature/top_k/top_p default to this sampler's.
  """

  name: ClassVar[str] = 'semi_ar'
  families: ClassVar[tuple[str, ...]] = ('masked',)

  block_length: int = 32
  inner: str = 'ancestral'
  inner_params: tuple = ()

  def __post_init__(self):
    super().__post_init__()
    require_int('block_length', self.block_length, 1)
    params = self.inner_params
    if isinstance(params, dict) or hasattr(params, 'items'):
      params = tuple(sorted(dict(params).items()))
    self._set(inner_params=tuple(tuple(p) for p in params))
    if self.inner == self.name:
      raise ValueError('semi_ar cannot nest itself; pick another inner.')
    _ = self.inner_sampler  # Validates the inner sampler now.

  @property
  def inner_sampler(self) -> Sampler:
    params = {**self.filters, **dict(self.inner_params)}
    table = {**INNER_SAMPLERS, **NON_MASKED_SAMPLERS}
    sampler = build(table, self.inner, **params)
    if sampler.num_models != 1:
      raise ValueError(f'inner sampler {self.inner!r} needs one network.')
    if not set(self.families) & set(sampler.families):
      raise ValueError(
        f'inner sampler {self.inner!r} applies to '
        f'{" and ".join(sampler.families)} processes, but semi_ar runs '
        f'masked processes; pick one of {sorted(INNER_SAMPLERS)}.'
      )
    return sampler

  def check_applies(self, process) -> None:
    super().check_applies(process)
    check_family(self.inner_sampler, process)

  @property
  def needs_time_free(self) -> bool:
    return self.inner_sampler.needs_time_free

  def fill(self, apply, key, process, z_BxL, window_BxL):
    inner = self.inner_sampler
    length = z_BxL.shape[1]
    blocks = -(-length // self.block_length)
    pos = jnp.arange(length)

    def body(b, carry):
      z, nfe = carry
      lo = b * self.block_length
      block = (pos >= lo) & (pos < lo + self.block_length)
      z, n = inner.fill(
        apply, jax.random.fold_in(key, b), process, z, window_BxL & block
      )
      return z, nfe + n

    return jax.lax.fori_loop(0, blocks, body, (z_BxL, jnp.int32(0)))
