"""Sampler registry: a config picks a sampler by name with its parameters.

  sampler = get_sampler('eb', gamma=0.1)
  tokens_BxL, nfe = sampler(apply, key, process, batch=4, length=128)

Names: ancestral, first_hitting, confidence, eb, remdm, semi_ar, scheduled
(the last takes apply = (heavy_apply, light_apply) and returns nfe as
(heavy calls, light calls)) for masked processes; uniform_ancestral and
loo_gibbs for uniform-state and interpolating ones; psi for all three;
block (KV-cached block-by-block generation, any masked sampler inside a
block) and did (Diffusion-in-Diffusion draft-then-refine) for block
diffusion; threshold (confidence-threshold parallel decoding, optional
re-editing) and approx_cache (the same with Fast-dLLM's approximate prefix
or dual KV cache, plain Transformers only) for masked processes; llada
(LLaDA's block-by-block decoding with low-confidence remasking) for masked
processes; prime_ancestral (sub-token ancestral sampling) for MDM-Prime
processes; ddpd (planned denoising: apply = (planner_apply,
denoiser_apply), nfe per network) for DDPD planner runs;
entropy_bound_canvas (DiffusionGemma's canvas sampler) for
'dgemma' processes; pgm (random-order decoding, L / T positions per
decoder call) for PGM processes.
Each sampler's `families` says which; `samplers_for(family)` lists them. A
spec string 'eb:gamma=0.1,temperature=0.9' or
'psi:kappa=max_capped_eta,eta=0.01' holds a name and parameters in one
command-line value; 'inner.KEY=VALUE' sets semi_ar's inner sampler
parameters.
"""

from __future__ import annotations

import ast
import dataclasses

from ddlm_jax.sampling import base
from ddlm_jax.sampling.approx_cache import ApproxCacheSampler
from ddlm_jax.sampling.base import Sampler, build, compatible_samplers
from ddlm_jax.sampling.block import BlockSampler
from ddlm_jax.sampling.ddpd import DDPDSampler
from ddlm_jax.sampling.dgemma_canvas import EntropyBoundCanvasSampler
from ddlm_jax.sampling.did import DiDSampler
from ddlm_jax.sampling.llada import LLaDASampler
from ddlm_jax.sampling.pgm import PGMSampler
from ddlm_jax.sampling.prime import PrimeAncestralSampler
from ddlm_jax.sampling.semi_ar import (
  INNER_SAMPLERS,
  NON_MASKED_SAMPLERS,
  SemiARSampler,
)

SAMPLERS: dict[str, type[Sampler]] = {
  **INNER_SAMPLERS,
  **NON_MASKED_SAMPLERS,
  SemiARSampler.name: SemiARSampler,
  BlockSampler.name: BlockSampler,
  DiDSampler.name: DiDSampler,
  ApproxCacheSampler.name: ApproxCacheSampler,
  LLaDASampler.name: LLaDASampler,
  PrimeAncestralSampler.name: PrimeAncestralSampler,
  DDPDSampler.name: DDPDSampler,
  EntropyBoundCanvasSampler.name: EntropyBoundCanvasSampler,
  PGMSampler.name: PGMSampler,
}
# The incompatibility errors of Sampler.__call__ list names from this table.
base.REGISTERED.update(SAMPLERS)


def samplers_for(family: str) -> list[str]:
  """Registered sampler names that apply to a process family."""
  return compatible_samplers(family, SAMPLERS)


def sampler_params(name: str) -> tuple[str, ...]:
  """The parameter names a sampler accepts."""
  _check_name(name)
  return tuple(f.name for f in dataclasses.fields(SAMPLERS[name]))


def _check_name(name: str):
  if name not in SAMPLERS:
    raise ValueError(
      f'unknown sampler {name!r}; choose one of {sorted(SAMPLERS)}.'
    )


def get_sampler(name: str, **params) -> Sampler:
  """Builds sampler `name`; unknown or invalid parameters raise ValueError."""
  return build(SAMPLERS, name, **params)


def _literal(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_spec(spec: str) -> tuple[str, dict]:
  """'name:key=value,key=value' -> (name, params); values are literals."""
  name, _, rest = spec.strip().partition(':')
  items = []
  for item in filter(None, (p.strip() for p in rest.split(','))):
    if '=' in item:
      items.append(item)
    elif items:  # A value with commas, e.g. pattern=light:0.5,heavy:0.5.
      items[-1] += ',' + item
    else:
      raise ValueError(
        f'bad parameter {item!r} in sampler spec {spec!r}; write key=value.'
      )
  params, inner = {}, {}
  for item in items:
    key, _, value = item.partition('=')
    key = key.strip()
    if key.startswith('inner.'):
      inner[key[len('inner.') :]] = _literal(value.strip())
    else:
      params[key] = _literal(value.strip())
  if inner:
    params['inner_params'] = inner
  _check_name(name)
  return name, params


def sampler_from_config(sample_cfg, *, eos_id: int | None = None) -> Sampler:
  """The sampler of a config's `sample` block.

  `sample.sampler` is a name or a spec string; `sample.params` (a dict)
  and the spec's parameters override the block's shared keys (steps ->
  num_steps, use_cache, temperature, top_k, top_p) where the sampler takes
  them. `eos_id` (the run tokenizer's end-of-text id) fills the `eos_id`
  of samplers that stop at EOS (block, did) unless the config sets one.
  """
  get = sample_cfg.get if hasattr(sample_cfg, 'get') else sample_cfg.__getitem__
  name, spec_params = parse_spec(get('sampler', 'ancestral') or 'ancestral')
  params = get('params', None) or {}
  if hasattr(params, 'to_dict'):
    params = params.to_dict()
  shared = {
    'num_steps': get('steps', None),
    'use_cache': get('use_cache', None),
    'temperature': get('temperature', None),
    'top_k': get('top_k', None),
    'top_p': get('top_p', None),
    'eos_id': eos_id,
  }
  allowed = sampler_params(name)
  merged = {k: v for k, v in shared.items() if v is not None and k in allowed}
  merged.update(params)
  merged.update(spec_params)
  return get_sampler(name, **merged)
