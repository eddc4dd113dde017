"""Launches one run: python -m experiments.run --config=CFG --workdir=DIR.

Overrides: --config.a.b=value (a typo in a key is an error). Presets:
--config=experiments/configs/quickstart.py:smoke. Modes: train (default;
trains, evaluates and samples), eval, sample, plan, as the config's
declared `kind` supports them:

  lm                train, eval [--split=test], sample, plan [--devices=N]
  state_tracking    train, eval (test accuracy of the newest checkpoint), plan
  planner_executor  train, eval (every stage trained already), plan

The process keeps freed host memory for reuse (XLA:CPU would otherwise
page-fault its temporaries in at every step; DDLM_JAX_HOST_MALLOC=default
turns that off). A run stopped by SIGTERM or SIGINT saves a checkpoint and
exits with code 75 (PREEMPTED_EXIT_CODE); starting it again resumes it.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from ddlm_jax.evaluation.sample_run import name_samples
from ddlm_jax.parallel import initialize_distributed, keep_freed_memory
from ddlm_jax.training import plan
from ddlm_jax.training.checkpoint import CheckpointSaveError
from ddlm_jax.training.fit import PREEMPTED_EXIT_CODE
from ddlm_jax.training.progress import mode_summary
from ddlm_jax.training.workdir_lock import WorkdirLockedError
from experiments import discover
from experiments.flag_errors import parse_flags
from experiments.modes import check_mode, run

_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Experiment config file (path[:preset]).', lock_config=True
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.')
_MODE = flags.DEFINE_enum(
  'mode', 'train', ['train', 'eval', 'sample', 'plan'], ''
)
_DEVICES = flags.DEFINE_integer(
  'devices', None, '--mode=plan: fake devices for a mesh with a -1.'
)
_SPLIT = flags.DEFINE_string('split', 'validation', 'Split for --mode=eval.')
_NAME = flags.DEFINE_string(
  'name', '', 'Sample files samples_NAME.txt (default: the next free number).'
)
flags.mark_flags_as_required(['config', 'workdir'])
discover.define_flags(__name__)  # --list, --describe: handled before parsing.

# User mistakes and refusals: one line on stderr, no traceback (unless
# --verbosity is given). Anything else is a bug and keeps its traceback.
USER_ERRORS = (
  ValueError,
  FileNotFoundError,
  FloatingPointError,
  WorkdirLockedError,
  CheckpointSaveError,
)


def main(argv):
  del argv
  verbose = flags.FLAGS['verbosity'].present
  if not verbose:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  config, workdir = _CONFIG.value, _WORKDIR.value
  try:
    keep_freed_memory()  # Before JAX starts its threads; host_memory.py.
    check_mode(config, _MODE.value)  # Before the distributed start-up.
    if _MODE.value == 'plan':  # Compiles on fake devices; trains nothing.
      plan.launch(config, workdir, _DEVICES.value)
      return
    name_samples(config, workdir, _NAME.value)  # Refuses a taken name.
    initialize_distributed()
    result = run(config, workdir, _MODE.value, _SPLIT.value)
  except USER_ERRORS as err:
    if verbose:
      raise
    print(f'error: {type(err).__name__}: {err}', file=sys.stderr)
    sys.exit(2 if not isinstance(err, FloatingPointError) else 1)
  print(mode_summary(result, _MODE.value, workdir, _SPLIT.value))
  if isinstance(result, dict) and 'preempted_at_step' in result:
    sys.exit(PREEMPTED_EXIT_CODE)


if __name__ == '__main__':
  discover.handle(sys.argv)  # --list / --describe print and exit.
  app.run(main, flags_parser=parse_flags)
