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
from absl import logging

from ddlm_jax.parallel import liveness

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


# Environments in which jax.distributed.initialize() finds its own arguments.
_CLUSTER_ENV = ('TPU_WORKER_HOSTNAMES', 'SLURM_JOB_ID', 'OMPI_COMM_WORLD_SIZE')
# Explicit launch (one process per host or per GPU, any launcher):
# JAX_COORDINATOR_ADDRESS=host:port JAX_NUM_PROCESSES=N JAX_PROCESS_ID=i
# (and optionally JAX_LOCAL_DEVICE_IDS=0,1, which JAX reads itself).
_EXPLICIT_ENV = (
  'JAX_COORDINATOR_ADDRESS',
  'JAX_NUM_PROCESSES',
  'JAX_PROCESS_ID',
)


def _env_int(env, name: str) -> int | None:
  raw = env.get(name, '').strip()
  if not raw:
    return None
  try:
    return int(raw)
  except ValueError:
    raise ValueError(
      f'{name}={raw!r} must be an integer (see docs/LAUNCH.md, 3.4).'
    ) from None


def distributed_args(environ=None) -> dict | None:
  """The jax.distributed.initialize keyword arguments this job needs.

  None on one host (no launcher environment), {} where JAX detects its own
  arguments (Cloud TPU, SLURM, Open MPI), and coordinator_address,
  num_processes and process_id from JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID otherwise. jax.distributed reads only
  the first of those three itself, so a launch that sets just the address
  would fail inside JAX with a message that names none of them; a partial
  set is refused here, naming what is missing.
  """
  env = os.environ if environ is None else environ
  explicit = {v: env.get(v, '').strip() for v in _EXPLICIT_ENV}
  if not any(explicit.values()):
    return {} if any(env.get(v) for v in _CLUSTER_ENV) else None
  missing = [v for v, x in explicit.items() if not x]
  if missing and not any(env.get(v) for v in _CLUSTER_ENV):
    raise ValueError(
      'A multi-process launch needs all of '
      + ', '.join(_EXPLICIT_ENV)
      + f'; {", ".join(missing)} unset. Set them on every process (the '
      'same address and count, process ids 0..N-1), or unset all three for '
      'one process.'
    )
  args = {}
  if explicit['JAX_COORDINATOR_ADDRESS']:
    args['coordinator_address'] = explicit['JAX_COORDINATOR_ADDRESS']
  num = _env_int(env, 'JAX_NUM_PROCESSES')
  pid = _env_int(env, 'JAX_PROCESS_ID')
  if num is not None:
    if num < 1:
      raise ValueError(f'JAX_NUM_PROCESSES={num} must be >= 1.')
    args['num_processes'] = num
  if pid is not None:
    if num is not None and not 0 <= pid < num:
      raise ValueError(
        f'JAX_PROCESS_ID={pid} must be in [0, JAX_NUM_PROCESSES={num}).'
      )
    args['process_id'] = pid
  return args


# A process silent this long counts as lost (DDLM_JAX_HEARTBEAT_TIMEOUT_S).
LIVENESS_TIMEOUT_S = 50


def _timeouts(environ=None) -> tuple[int, dict]:
  """(liveness timeout, jax.distributed's timeout arguments).

  DDLM_JAX_HEARTBEAT_TIMEOUT_S (default 50 s) is how long a process may
  stay silent before the others stop, naming it (liveness.py);
  JAX's own heartbeat timeout is set to twice that, so the run's watchdog
  always decides before JAX's service aborts everyone. The shutdown timeout
  (DDLM_JAX_SHUTDOWN_TIMEOUT_S, JAX's default otherwise) bounds how long a
  finishing process waits for the others.
  """
  env = os.environ if environ is None else environ
  values = {}
  for var in ('DDLM_JAX_HEARTBEAT_TIMEOUT_S', 'DDLM_JAX_SHUTDOWN_TIMEOUT_S'):
    value = _env_int(env, var)
    if value is not None and value < 1:
      raise ValueError(f'{var}={value} must be >= 1 (seconds).')
    values[var] = value
  liveness = values['DDLM_JAX_HEARTBEAT_TIMEOUT_S'] or LIVENESS_TIMEOUT_S
  out = {'heartbeat_timeout_seconds': 2 * liveness}
  if values['DDLM_JAX_SHUTDOWN_TIMEOUT_S'] is not None:
    out['shutdown_timeout_seconds'] = values['DDLM_JAX_SHUTDOWN_TIMEOUT_S']
  return liveness, out


def initialize_distributed(**kwargs) -> bool:
  """Starts jax.distributed on multi-process jobs; a no-op on one process.

  Idempotent. Returns True when a multi-process runtime is active. Cloud
  TPU, SLURM and Open MPI set the coordinator environment themselves; any
  other launcher sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID (distributed_args) or passes the same as keyword
  arguments, which win over the environment. Must run before anything
  touches a JAX backend.
  """
  if jax.distributed.is_initialized():
    return True
  args = distributed_args()
  if not kwargs and args is None:
    return False
  liveness_s, timeouts = _timeouts()
  jax.distributed.initialize(**{**(args or {}), **timeouts, **kwargs})
  if jax.process_count() > 1:
    _watch(liveness_s)
    _avoid_cached_collective_hang()
  return jax.process_count() > 1


# jax/jaxlib 0.12.1 on CPU (gloo collectives): a multi-process program whose
# executable is read back from the persistent compilation cache never
# finishes its first collective; every process waits forever. A two-process
# float sum shows it with nothing of this project involved, on the second
# run over the same cache directory; 0.10.x and 0.12.0.1 run it.
_CACHED_COLLECTIVES_HANG_FROM = (0, 12, 1)


def cached_collectives_hang(platform: str, jax_version: tuple) -> bool:
  """Whether a multi-process run on this platform and JAX version hangs on
  executables loaded from the persistent compilation cache (True from
  jax 0.12.1 on CPU; later versions count as affected until one is known to
  have fixed it)."""
  return platform == 'cpu' and tuple(jax_version) >= (
    _CACHED_COLLECTIVES_HANG_FROM
  )


def _avoid_cached_collective_hang() -> None:
  """Turns the persistent compilation cache off for this multi-process run
  where cached executables hang (cached_collectives_hang), saying so: a
  run that compiles every program beats one that never takes a step."""
  if not jax.config.jax_compilation_cache_dir:
    return
  if not cached_collectives_hang(jax.default_backend(), jax.__version_info__):
    return
  jax.config.update('jax_enable_compilation_cache', False)
  logging.warning(
    'The persistent compilation cache (%s) is off for this run: on CPU, '
    'jax %s hangs in the first collective of a multi-process program read '
    'back from it.',
    jax.config.jax_compilation_cache_dir,
    jax.__version__,
  )


def _watch(timeout_s: int) -> None:
  """Starts the lost-process watchdog (liveness.py) on jax.distributed's
  client; without one (a JAX whose internals moved) JAX's own abort
  remains the answer to a lost process."""
  from jax._src import distributed as jax_distributed

  client = getattr(jax_distributed.global_state, 'client', None)
  if client is None or not hasattr(client, 'key_value_dir_get'):
    return
  liveness.start(client, jax.process_index(), jax.process_count(), timeout_s)
