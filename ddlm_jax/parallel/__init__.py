"""Meshes, logical-axis rules, distributed and host start-up."""

from ddlm_jax.parallel.host_memory import keep_freed_memory
from ddlm_jax.parallel.mesh import (
  MESH_AXES,
  distributed_args,
  initialize_distributed,
  make_mesh,
)
from ddlm_jax.parallel.rules import (
  DEFAULT_RULES,
  batch_sharding,
  logical_to_spec,
  replicated,
)

__all__ = [
  'DEFAULT_RULES',
  'MESH_AXES',
  'batch_sharding',
  'distributed_args',
  'initialize_distributed',
  'keep_freed_memory',
  'logical_to_spec',
  'make_mesh',
  'replicated',
]
