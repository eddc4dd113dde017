"""Samplers as pure, jit-compiled functions that count their network calls."""

from ddlm_jax.sampling.ancestral import ancestral_sample
from ddlm_jax.sampling.autoregressive import autoregressive_sample

__all__ = ['ancestral_sample', 'autoregressive_sample']
