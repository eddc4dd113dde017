"""--mode=plan for every config kind: its programs compiled on the mesh it
asks for, with nothing allocated (`ddlm_jax.training.plan`).

`plan_config` turns an LM, state-tracking or planner-executor ConfigDict
into the task's plan (`plan_lm` for a language model, `plan_task` for the
others' loop tasks); `launch` is what ``python -m experiments.run
--config=... --mode=plan [--devices=N]`` calls: it re-executes the command
with N fake devices and plans there.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import jax

from ddlm_jax.tasks import planner as pt
from ddlm_jax.tasks import state_tracking
from ddlm_jax.training.plan import (
  MAX_DEVICES,
  LMSpec,
  plan_lm,
  plan_task,
  table,
  vocab_size_of,
  write,
)

# Parameter counts the papers report for the 12 x 768 model of a corpus:
# MDLM's OpenWebText DiT (GPT-2 vocabulary, adaLN time conditioning) has
# 169M; this suite's network matches it with model.time_conditioning and
# is 7M smaller without (docs/LAUNCH.md section 7).
PAPER_PARAMS = {'openwebtext': 169_000_000}


def spec_from_config(config, mesh) -> LMSpec:
  """An LMSpec of an LM ConfigDict on `mesh` (nothing read from disk)."""
  from ddlm_jax.training import builders
  from ddlm_jax.training.optimizer import optimizer_from_config

  soft_mask = config.get('soft_mask')
  # The plan's entry point: the config's typed blocks, converted once.
  settings = builders.typed_blocks(config)
  data = settings.data
  builders.check_process(
    settings.process, config.model, data.seq_len, soft_mask
  )
  process = builders.make_process(
    settings.process, vocab_size_of(data), soft_mask
  )
  tr = config.train
  trainer = settings.trainer  # The run's own optimizer settings.
  tx, _ = optimizer_from_config(trainer.optimizer, trainer.num_steps)

  def build(remat: bool):
    model = config.model.copy_and_resolve_references()
    with model.unlocked():
      model.remat = remat
    return builders.model_builder(model, process, soft_mask)

  backbone = config.model.get('backbone', 'transformer')
  mcfg = builders.model_config(config.model, process)
  sample_batch = min(
    int(config.sample.get('batch_size', 0) or 0),
    int(config.sample.num_samples),
  )
  data_ways = mesh.shape['data'] * mesh.shape['fsdp']
  round_up = lambda n: -(-n // data_ways) * data_ways if n else 0
  return LMSpec(
    build=build,
    process=process,
    tx=tx,
    mesh=mesh,
    batch_size=tr.batch_size,
    seq_len=data.seq_len,
    num_steps=tr.num_steps,
    remat=bool(config.model.get('remat', False)),
    ema_decay=trainer.ema_decay,
    accum_steps=trainer.grad_accum_steps,
    loss_mask=data.packing == 'padded' and data.corpus == 'lm1b',
    eval_batch_size=config.eval.batch_size,
    sample_batch_size=round_up(sample_batch),
    model_config=mcfg if backbone == 'transformer' else None,
    paper_params=PAPER_PARAMS.get(data.corpus, 0)
    if mcfg.width == 768 and mcfg.depth == 12
    else 0,
    settings={
      'process': settings.process.kind,
      'width': mcfg.width,
      'depth': mcfg.depth,
      'vocab': process.vocab_size,
      'dtype': mcfg.dtype,
      'grad_accum_steps': trainer.grad_accum_steps,
    },
  )


def mesh_shape_of(config) -> tuple[int, ...]:
  """The mesh a config trains on: config.mesh.shape for language models;
  state tracking trains on one device."""
  if config.get('kind', 'lm') == 'lm':
    return tuple(config.mesh.shape)
  return (1, 1, 1)


def plan_config(config, devices: int | None = None, sections=None) -> dict:
  """The plan of a config on the mesh it asks for (or `devices`): an LM
  config (plan_lm) or a state-tracking one (plan_task)."""
  from ddlm_jax.parallel import make_mesh
  from ddlm_jax.training.config import ConfigError

  kind = config.get('kind', 'lm')
  if kind not in ('lm', 'state_tracking', 'planner_executor'):
    raise ConfigError(
      f'--mode=plan plans lm, state_tracking and planner_executor '
      f'configs; config.kind={kind!r} has no planner.'
    )
  shape = mesh_shape_of(config)
  have = len(jax.devices())
  use = devices or have
  if -1 not in shape:
    use = int(math.prod(shape))
  if use > have:
    raise ConfigError(
      f'the plan needs {use} devices and this process has {have}; run it '
      f'through experiments.run --mode=plan --devices={use} (it starts the '
      'fake devices).'
    )
  mesh = make_mesh(shape, jax.devices()[:use])
  if kind == 'planner_executor':
    return plan_roles(config, mesh)
  if kind == 'state_tracking':
    task = state_tracking.state_tracking_task(config)
    display = state_tracking.display(config)
    return plan_task(
      task,
      state_tracking.trainer_config(config),
      mesh,
      display.name,
      display.tokens_per_step,
    )
  for name, batch in (
    ('train.batch_size', config.train.batch_size),
    ('eval.batch_size', config.eval.batch_size),
  ):
    ways = mesh.shape['data'] * mesh.shape['fsdp']
    if batch % ways:
      raise ConfigError(
        f'{name}={batch} does not split over the {ways} data-parallel '
        f'devices of mesh {dict(mesh.shape)}; change --devices or the '
        'batch size.'
      )
  spec = spec_from_config(config, mesh)
  kwargs = {} if sections is None else {'sections': sections}
  return plan_lm(spec, **kwargs)


def plan_roles(config, mesh) -> dict:
  """Plans of the planner / executor roles a planner_executor pipeline
  trains (each its own loop task and train step). The latent projector
  is trained on the trained planner's hidden states, so it is not
  planned."""
  from ddlm_jax.planning import models as pm
  from ddlm_jax.training.fit import Task

  cfgs = pt.model_configs(config)
  plan_len = int(config.reasoning.plan_len)
  task_name = pt.task_of(config).name
  roles = {}
  for role in pt.NEEDS[config.pipeline]:
    key = 'planner' if role == 'planner' else 'executor'
    graphdef, params = pm.split(pm.build(cfgs[key], config.seed))
    block = config[key]

    def batches(start, role=role, block=block):
      for raw in pt._task_stream(config, block, start):
        yield pt._role_batch(role, raw, plan_len, task_name)

    task = Task(
      init=lambda _, params=params: params,
      loss=pt.role_loss(
        role, graphdef, plan_len, config.planner.loss_type, task_name
      ),
      batches=batches,
    )
    trainer = pt.stage_trainer_config(config, key)
    roles[role] = plan_task(task, trainer, mesh, role)
  return {'kind': 'planner_executor', 'roles': roles}


# ------------------------------------------------------ the command line --

CHILD_ENV = 'DDLM_JAX_PLAN_CHILD'
DEFAULT_DEVICES = 8


def devices_needed(config, devices: int | None) -> int:
  """Fake devices a plan of `config` needs: the mesh's, else --devices."""
  shape = mesh_shape_of(config)
  if -1 not in shape:
    n = int(math.prod(shape))
    if devices and devices != n:
      from ddlm_jax.training.config import ConfigError

      raise ConfigError(
        f'--devices={devices} disagrees with config.mesh.shape={shape} '
        f'({n} devices); drop one of them.'
      )
    return n
  return devices or DEFAULT_DEVICES


def launch(config, workdir: str, devices: int | None) -> dict | None:
  """--mode=plan: plans here when this process was started with the fake
  devices (it is the child), else re-executes the same command with
  XLA_FLAGS asking for them and returns None (the child prints and
  writes). Before JAX starts any backend."""
  n = devices_needed(config, devices)
  if n < 1 or n > MAX_DEVICES:
    from ddlm_jax.training.config import ConfigError

    raise ConfigError(
      f'--devices={n}: plan on 1..{MAX_DEVICES} devices (a smaller slice '
      'with the same per-device batch has the same per-device memory).'
    )
  if os.environ.get(CHILD_ENV) == str(n):
    plan = plan_config(config, n)
    if not plan.get('label') and 'roles' not in plan:
      plan['label'] = os.path.basename(workdir.rstrip('/'))
    path = write(plan, workdir)
    print(table(plan))
    print(f'plan.json: {path}')
    return plan
  env = dict(os.environ)
  flags = [
    f
    for f in env.get('XLA_FLAGS', '').split()
    if not f.startswith('--xla_force_host_platform_device_count')
  ]
  env['XLA_FLAGS'] = ' '.join(
    [*flags, f'--xla_force_host_platform_device_count={n}']
  )
  env['JAX_PLATFORMS'] = 'cpu'
  env[CHILD_ENV] = str(n)
  code = subprocess.call([sys.executable, *sys.orig_argv[1:]], env=env)
  if code:
    sys.exit(code)
  return None


def write_plan(config, workdir: str, devices: int | None = None) -> dict:
  """plan_config on this process's devices, written to workdir/plan.json."""
  plan = plan_config(config, devices)
  write(plan, workdir)
  return plan
