"""Launches one run: python -m experiments.run --config=CFG --workdir=DIR.

Overrides: --config.a.b=value (a typo in a key is an error). Presets:
--config=experiments/configs/quickstart.py:smoke. Modes: train (default;
trains, evaluates and samples), eval, sample.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from ddlm_jax.parallel import initialize_distributed
from ddlm_jax.training import loop

_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Experiment config file (path[:preset]).', lock_config=True
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.')
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'sample'], '')
_SPLIT = flags.DEFINE_string('split', 'validation', 'Split for --mode=eval.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  initialize_distributed()
  config, workdir = _CONFIG.value, _WORKDIR.value
  if 'task' in config:  # State tracking: experiments/configs/state_tracking.py
    from ddlm_jax.training.classification import train_state_tracking

    return print(train_state_tracking(config, workdir))
  if 'pipeline' in config:  # Issue 8: experiments/configs/planner_executor.py
    from ddlm_jax.planning.trainer import run_planner_executor

    return print(run_planner_executor(config, workdir))
  if _MODE.value == 'train':
    loop.train_and_evaluate(config, workdir)
  elif _MODE.value == 'eval':
    print(loop.evaluate_checkpoint(config, workdir, _SPLIT.value))
  else:
    print(loop.sample_checkpoint(config, workdir))


if __name__ == '__main__':
  app.run(main)
