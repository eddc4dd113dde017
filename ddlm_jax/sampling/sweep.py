"""The runs of a sampler sweep: specs expanded over step counts and gammas.

Quality-vs-cost sweeps (experiments/sweep_samplers.py) compare samplers at
equal budgets, so each spec is expanded to the parameters it leaves open: a
sampler that takes num_steps runs at every step count; 'eb' without a gamma
at every gamma; 'semi_ar' at every step count spread over its blocks (inner
num_steps = T // blocks, so the total NFE budget matches). Each run is
{'name', 'params', 'label'}, ready for registry.get_sampler(name, **params).
"""

from __future__ import annotations

from collections.abc import Iterable

from ddlm_jax.sampling.registry import parse_spec, sampler_params


def expand_specs(
  specs: Iterable[str], steps: list[int], gammas: list[float], length: int
) -> list[dict]:
  """[{'name', 'params'}] for each spec at each open step count or gamma."""
  entries = []
  for spec in filter(None, (s.strip() for s in specs)):
    name, params = parse_spec(spec)
    if name == 'eb' and 'gamma' not in params:
      entries += [
        {'name': name, 'params': {**params, 'gamma': g}} for g in gammas
      ]
    elif name == 'semi_ar':
      inner = dict(params.get('inner_params', {}))
      blocks = -(-length // params.get('block_length', 32))
      for t in steps:
        p = dict(params)
        p['inner_params'] = {'num_steps': max(1, t // blocks), **inner}
        entries.append({'name': name, 'params': p})
    elif (
      'num_steps' in sampler_params(name)
      and 'num_steps' not in params
      and not params.get('tokens_per_step')
    ):
      entries += [
        {'name': name, 'params': {**params, 'num_steps': t}} for t in steps
      ]
    else:
      entries.append({'name': name, 'params': params})
  return entries


def label_entries(entries: list[dict]) -> list[dict]:
  """Fills each entry's params ({}) and label ('name k=v ...') in place."""
  for e in entries:
    e.setdefault('params', {})
    e['label'] = e.get('label') or e['name'] + ''.join(
      f' {k}={v}' for k, v in sorted(e['params'].items())
    )
  return entries
