"""Forward processes and losses as pure functions."""

from ddlm_jax.diffusion.autoregressive import Autoregressive
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.schedules import Schedule, get_schedule

__all__ = ['Autoregressive', 'MaskedDiffusion', 'Schedule', 'get_schedule']
