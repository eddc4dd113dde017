"""Samplers as pure, jit-compiled functions that count their network calls.

`get_sampler(name, **params)` picks one by name: for masked processes
'ancestral', 'first_hitting', 'confidence', 'eb', 'remdm', 'semi_ar',
'scheduled', 'llada'; for uniform-state and interpolating ones
'uniform_ancestral' and 'loo_gibbs'; 'psi' for all three.
`sampler_from_config(config.sample)` does the same from a run's config;
`samplers_for(family)` lists the names that apply to a process family
(`process_family(process)`).
"""

from ddlm_jax.sampling.ancestral import ancestral_sample
from ddlm_jax.sampling.autoregressive import autoregressive_sample
from ddlm_jax.sampling.common import process_family
from ddlm_jax.sampling.registry import (
  get_sampler,
  parse_spec,
  sampler_from_config,
  samplers_for,
)

__all__ = [
  'ancestral_sample',
  'autoregressive_sample',
  'get_sampler',
  'parse_spec',
  'process_family',
  'sampler_from_config',
  'samplers_for',
]
