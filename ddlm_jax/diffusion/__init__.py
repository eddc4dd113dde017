"""Forward processes and losses as pure functions.

Every family module is imported here, so its config class is registered
(`ddlm_jax.diffusion.base.ProcessConfig.register`) once the package is.
"""

from ddlm_jax.diffusion.autoregressive import Autoregressive
from ddlm_jax.diffusion.base import (
  BlockProcess,
  DiffusionProcess,
  Process,
  ProcessConfig,
  process_config,
  registered_kinds,
)
from ddlm_jax.diffusion.block import BlockDiffusion
from ddlm_jax.diffusion.ddpd import PlannerProcess
from ddlm_jax.diffusion.dgemma import DGemmaDiffusion
from ddlm_jax.diffusion.duo import DuoDiffusion
from ddlm_jax.diffusion.interpolating import InterpolatingDiffusion
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.mix_scale import MixScaleBlockDiffusion
from ddlm_jax.diffusion.pgm import PGMDiffusion
from ddlm_jax.diffusion.prime import PrimeDiffusion
from ddlm_jax.diffusion.schedules import Schedule, get_schedule
from ddlm_jax.diffusion.sft import ResponseMaskedDiffusion
from ddlm_jax.diffusion.soft_masking import SoftMaskedDiffusion
from ddlm_jax.diffusion.uniform import UniformDiffusion

__all__ = [
  'Autoregressive',
  'BlockDiffusion',
  'BlockProcess',
  'DGemmaDiffusion',
  'DiffusionProcess',
  'DuoDiffusion',
  'InterpolatingDiffusion',
  'MaskedDiffusion',
  'MixScaleBlockDiffusion',
  'PGMDiffusion',
  'PlannerProcess',
  'PrimeDiffusion',
  'Process',
  'ProcessConfig',
  'ResponseMaskedDiffusion',
  'Schedule',
  'SoftMaskedDiffusion',
  'UniformDiffusion',
  'get_schedule',
  'process_config',
  'registered_kinds',
]
