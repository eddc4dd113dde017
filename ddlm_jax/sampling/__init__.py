"""Samplers as pure, jit-compiled functions that count their network calls.

`get_sampler(name, **params)` picks one by name ('ancestral',
'first_hitting', 'confidence', 'eb', 'remdm', 'semi_ar', 'scheduled');
`sampler_from_config(config.sample)` does the same from a run's config.
"""

from ddlm_jax.sampling.ancestral import ancestral_sample
from ddlm_jax.sampling.autoregressive import autoregressive_sample
from ddlm_jax.sampling.registry import (
  get_sampler,
  parse_spec,
  sampler_from_config,
)

__all__ = [
  'ancestral_sample',
  'autoregressive_sample',
  'get_sampler',
  'parse_spec',
  'sampler_from_config',
]
