"""Rebuilds a finished (or interrupted) run from its workdir for reuse.

`load_run(workdir)` reads workdir/config.json, builds the `Run` (model,
process, tokenizer from workdir/tokenizer) and restores the newest
checkpoint, so saved runs can be scored (the AR twin as gen-ppl scorer) or
sampled from without their original config file.
"""

from __future__ import annotations

import json
import os

import ml_collections


def load_config(workdir: str, overrides: dict | None = None):
  """The run's ConfigDict from workdir/config.json, with dotted overrides."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise FileNotFoundError(
      f'{path} not found: {workdir} is not a run directory (train it with '
      'python -m experiments.run first).'
    )
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  for dotted, value in (overrides or {}).items():
    *parents, leaf = dotted.split('.')
    node = config
    for name in parents:
      if name not in node:
        node[name] = ml_collections.ConfigDict()
      node = node[name]
    node[leaf] = value
  if 'mesh' in config and 'shape' in config.mesh:
    config.mesh.shape = tuple(config.mesh.shape)
  return config


def load_run(workdir: str, overrides: dict | None = None):
  """Run from workdir/config.json with its newest checkpoint restored.

  Args:
    overrides: {'sample.num_samples': 8, ...} applied to the saved config
      (shape-changing model keys make the restore fail with a clear error).

  Returns:
    ddlm_jax.training.loop.Run; its checkpoint step is
    run.checkpointer.latest_step().
  """
  from ddlm_jax.training.loop import Run

  config = load_config(workdir, overrides)
  run = Run(config, workdir)
  step = run.restore()
  if step == 0:
    run.checkpointer.close()
    raise FileNotFoundError(
      f'No checkpoint in {workdir}/checkpoints; train first (--mode=train).'
    )
  return run
