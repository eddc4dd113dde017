"""Device mesh from config, and multi-host start-up.

Mesh axes are ('data', 'fsdp', 'tensor'); one size may be -1 and is filled
from the device count. axis_types are passed explicitly because JAX's default
differs between versions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np

MESH_AXES = ('data', 'fsdp', 'tensor')


def resolve_mesh_shape(
  shape: Sequence[int], num_devices: int
) -> tuple[int, ...]:
  """Fills a single -1 entry so that the product equals num_devices."""
  shape = [int(s) for s in shape]
  if len(shape) != len(MESH_AXES):
    raise ValueError(
      f'mesh shape {shape} must give one size per axis {MESH_AXES}.'
    )
  if shape.count(-1) > 1:
    raise ValueError(f'mesh shape {shape}: at most one axis may be -1.')
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if num_devices % known:
      raise ValueError(
        f'mesh shape {shape} cannot use {num_devices} devices: '
        f'{num_devices} is not divisible by {known}.'
      )
    shape[shape.index(-1)] = num_devices // known
  if int(np.prod(shape)) != num_devices:
    raise ValueError(
      f'mesh shape {shape} needs {int(np.prod(shape))} devices but '
      f'{num_devices} are available; set one axis to -1 to fill it.'
    )
  return tuple(shape)


def make_mesh(shape: Sequence[int], devices=None) -> jax.sharding.Mesh:
  """A mesh over `devices` (default: all) with explicit axis types.

  A shape without -1 that needs fewer devices than there are uses the first
  ones (handy for tests and for single-device debugging on a host).
  """
  devices = jax.devices() if devices is None else list(devices)
  if -1 not in shape and int(np.prod(shape)) < len(devices):
    devices = devices[: int(np.prod(shape))]
  resolved = resolve_mesh_shape(shape, len(devices))
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return jax.make_mesh(
    resolved, MESH_AXES, axis_types=axis_types, devices=devices
  )


def initialize_distributed(**kwargs) -> bool:
  """Starts jax.distributed on multi-host jobs; a no-op on one host.

  Idempotent. Returns True when a multi-process runtime is active. Cloud TPU
  and SLURM set the coordinator environment themselves; other launchers pass
  coordinator_address, num_processes and process_id.
  """
  if jax.distributed.is_initialized():
    return True
  auto_env = ('TPU_WORKER_HOSTNAMES', 'SLURM_JOB_ID', 'JAX_COORDINATOR_ADDRESS')
  if not kwargs and not any(os.environ.get(v) for v in auto_env):
    return False
  jax.distributed.initialize(**kwargs)
  return jax.process_count() > 1
