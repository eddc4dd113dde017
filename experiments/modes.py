"""What each config kind runs: the dispatch behind experiments.run.

Kept apart from run.py (which defines absl flags at import) so tests and
scripts can dispatch without flags.
"""

import ml_collections

from ddlm_jax import paths
from ddlm_jax.tasks import language_model, plans, state_tracking
from ddlm_jax.tasks.language_model import load_config
from ddlm_jax.tasks.planner import run_planner_executor
from ddlm_jax.training import builders
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.faults import read_json

MODES = {
  'lm': ('train', 'eval', 'sample', 'plan'),
  'state_tracking': ('train', 'eval', 'plan'),
  'planner_executor': ('train', 'eval', 'plan'),
}


def check_mode(config, mode: str) -> str:
  """The config's declared kind, if it can run `mode` (else a clear error)."""
  kind = config.get('kind', 'lm')
  if kind not in MODES:
    raise ValueError(
      f'config.kind={kind!r} is not a task kind; choose one of {sorted(MODES)}.'
    )
  if mode not in MODES[kind]:
    raise ValueError(
      f'--mode={mode}: {kind} configs run --mode='
      f'{"|".join(MODES[kind])}; nothing was run.'
    )
  return kind


def saved_config(workdir: str | None, mode: str):
  """The config a run saved in workdir/config.json (for eval / sample).

  A run is addressed by its workdir: the config it was trained with is
  there. Training needs --config (a new run has no config.json yet).
  """
  if mode == 'train':
    raise ConfigError(
      '--mode=train needs --config (e.g. '
      '--config=experiments/configs/quickstart.py:smoke).'
    )
  path = paths.join(workdir or '', 'config.json')
  if not workdir or not paths.isfile(path):
    raise FileNotFoundError(
      f'{path} not found: --mode={mode} without --config reads the config '
      'of a trained run; pass the workdir of one, or --config.'
    )
  saved = read_json(path, "the run's config")
  if not isinstance(saved, dict):
    raise ConfigError(f'{path} does not hold a config (not a JSON object).')
  if saved.get('kind', 'lm') == 'lm':
    return load_config(workdir)  # Keys renamed since the run are moved.
  config = ml_collections.ConfigDict(saved)
  if 'mesh' in config and 'shape' in config.mesh:
    config.mesh.shape = tuple(config.mesh.shape)
  return config


def run(
  config,
  workdir: str,
  mode: str = 'train',
  split: str = 'validation',
  *,
  allow_fresh_start: bool = False,
):
  """Runs `mode` for the config's kind; returns its summary or result.

  allow_fresh_start: train from step 0 although every checkpoint of the
  workdir was set aside as unreadable (else that refuses).
  """
  kind = check_mode(config, mode)
  if mode == 'plan':  # In-process: the devices this process already has.
    return plans.write_plan(config, workdir)
  if kind == 'state_tracking':
    if mode == 'eval':
      return state_tracking.evaluate_checkpoint(config, workdir)
    return state_tracking.train_state_tracking(
      config, workdir, allow_fresh_start=allow_fresh_start
    )
  if kind == 'planner_executor':
    return run_planner_executor(
      config, workdir, mode=mode, allow_fresh_start=allow_fresh_start
    )
  # The one conversion of a language-model config into typed blocks: the
  # mode and everything below it read these, not config.process/.data.
  settings = builders.typed_blocks(config)
  if mode == 'eval':
    return language_model.evaluate_checkpoint(
      config, workdir, split, settings=settings
    )
  if mode == 'sample':
    return language_model.sample_checkpoint(config, workdir, settings=settings)
  return language_model.train_and_evaluate(
    config, workdir, settings=settings, allow_fresh_start=allow_fresh_start
  )
