"""Forward processes and losses as pure functions."""

from ddlm_jax.diffusion.autoregressive import Autoregressive
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.schedules import Schedule, get_schedule

__all__ = ['Autoregressive', 'MaskedDiffusion', 'Schedule', 'get_schedule']
from ddlm_jax.diffusion.interpolating import InterpolatingDiffusion  # noqa: E402
from ddlm_jax.diffusion.uniform import UniformDiffusion  # noqa: E402

__all__ += ['InterpolatingDiffusion', 'UniformDiffusion']
from ddlm_jax.diffusion.block import BlockDiffusion  # noqa: E402

__all__ += ['BlockDiffusion']
