"""Logical-axis-to-mesh rules and the shardings they give.

Models name their parameter axes ('embed', 'mlp', ...). These rules say which
mesh axis (if any) each name is split over. A dimension that the mesh axis
does not divide is replicated instead (e.g. a 66-token vocabulary on a
2-way tensor axis), so small models run on any mesh.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# FSDP splits the model width; tensor parallelism splits heads, MLP and vocab,
# and the experts of a mixture-of-experts layer (expert parallelism on the
# tensor axis: an expert kernel [E, in, out] then keeps its MLP axis whole,
# since one mesh axis splits one dimension).
DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
  'batch': ('data', 'fsdp'),
  'length': None,
  'embed': 'fsdp',
  'mlp': 'tensor',
  'heads': 'tensor',
  'head_dim': None,
  'qkv': None,
  'vocab': 'tensor',
  'cond': None,
  'modulation': None,
  'state': None,
  'dict': None,
  'classes': None,
  'expert': 'tensor',
}


def _axis_size(mesh: jax.sharding.Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  return size


def logical_to_spec(
  names, shape, mesh: jax.sharding.Mesh, rules: Mapping = DEFAULT_RULES
) -> P:
  """PartitionSpec for one array from its logical axis names."""
  spec, used = [], set()
  for name, dim in zip(names, shape, strict=True):
    if name is None:
      spec.append(None)
      continue
    if name not in rules:
      raise KeyError(
        f'logical axis {name!r} has no sharding rule; add it to '
        'ddlm_jax.parallel.rules.DEFAULT_RULES.'
      )
    axes = rules[name]
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
    if not flat or dim % _axis_size(mesh, axes) or used & set(flat):
      spec.append(None)
    else:
      spec.append(axes)
      used |= set(flat)
  return P(*spec)


def logical_names(variable) -> tuple:
  """The logical axis names recorded on an nnx Variable (or ())."""
  return tuple(variable.get_metadata().get('out_sharding') or ())


def batch_sharding(mesh, rules: Mapping = DEFAULT_RULES) -> NamedSharding:
  """Batch-major arrays split over the batch rule's mesh axes."""
  return NamedSharding(mesh, P(rules['batch']))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
