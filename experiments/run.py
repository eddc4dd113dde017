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
Every other fault ends with one line on stderr and its own exit code
(ddlm_jax.training.faults, docs/FAULTS.md); --debug shows the traceback.
--mode=eval|sample need only --workdir (its config.json is the config).
"""

import logging as std_logging
import os
import sys
import threading

from absl import app, flags, logging
from ml_collections import config_flags

from ddlm_jax.evaluation.prompt_file import sample_prompt_file
from ddlm_jax.evaluation.sample_run import name_samples
from ddlm_jax.parallel import (
  initialize_distributed,
  keep_freed_memory,
  liveness,
)
from ddlm_jax.tasks import plans
from ddlm_jax.training import faults
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.fit import PREEMPTED_EXIT_CODE
from ddlm_jax.training.progress import mode_summary
from experiments import discover
from experiments.flag_errors import parse_flags, wants_traceback
from experiments.modes import check_mode, run, saved_config

_CONFIG = config_flags.DEFINE_config_file(
  'config',
  None,
  'Experiment config file (path[:preset]); for --mode=eval|sample the '
  "workdir's config.json when not given.",
  lock_config=True,
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
_PROMPT_FILE = flags.DEFINE_string(
  'prompt_file',
  None,
  '--mode=sample: continue each prompt of this file (one per line, or '
  'JSONL with a "prompt" key), all in one batch.',
)
_MAX_NEW = flags.DEFINE_integer(
  'max_new_tokens',
  None,
  'With --prompt_file: tokens generated after each prompt (default: the '
  'rest of the row).',
)
_DEBUG = flags.DEFINE_bool(
  'debug', False, 'Show the traceback of an error (else one line).'
)
_FRESH = flags.DEFINE_bool(
  'allow_fresh_start',
  False,
  'Train from step 0 although every checkpoint of the workdir was set '
  'aside as unreadable (<step>.corrupt); without it such a run refuses.',
)
flags.mark_flags_as_required(['workdir'])
discover.define_flags(__name__)  # --list, --describe: handled before parsing.


def _config_flag_error(config):
  """The one-line error of a --config that did not load, or None.

  ml-collections defers a missing file's error to the first use of the
  config, as a traceback; name the file instead.
  """
  if type(config).__name__ != '_ErrorConfig':
    return None
  path = flags.FLAGS['config'].config_filename
  err = object.__getattribute__(config, '_error')
  if 'No such file' in str(err) or not os.path.exists(path.split(':')[0]):
    return ConfigError(
      f'--config={path}: no such config file; give a file of '
      'experiments/configs/ (e.g. experiments/configs/quickstart.py:smoke).'
    )
  return ConfigError(
    f'--config={path}: {faults.one_line(str(err).splitlines()[-1])}'
  )


def _quiet_thread_errors():
  """A background thread's error (an orbax writer hitting a full disk)
  prints one line; the main thread reports the fault itself."""

  def hook(args):
    print(
      f'error in thread {args.thread.name if args.thread else "?"}: '
      f'{args.exc_type.__name__}: {faults.one_line(args.exc_value)[:300]}',
      file=sys.stderr,
    )

  threading.excepthook = hook


class _OneLineLogs(std_logging.Filter):
  """Log records without their tracebacks, cut to their first line.

  orbax logs a failed background save at ERROR with the traceback of
  every failed write (hundreds of lines for a full disk), and asyncio logs
  each of its failed write tasks at exit; the run reports the fault itself
  in one line, so those records are dropped.
  --debug keeps them all.
  """

  def filter(self, record):
    if '/orbax/' in record.pathname and record.levelno < std_logging.CRITICAL:
      return False  # Its failures reach the run as one-line errors.
    if record.name == 'asyncio' and 'never retrieved' in record.getMessage():
      return False  # orbax's failed background writes, reported above.
    if record.exc_info or record.exc_text:
      record.exc_info, record.exc_text = None, None
    message = record.getMessage()
    if '\n' in message:
      record.msg, record.args = message.splitlines()[0][:300], None
    return True


def _quiet_logs():
  one_line = _OneLineLogs()
  for name in ('', 'absl'):
    logger = std_logging.getLogger(name)
    logger.addFilter(one_line)
    for handler in logger.handlers:
      handler.addFilter(one_line)


def check_prompt_flags(mode):
  """--prompt_file and --max_new_tokens: --mode=sample only, file given."""
  wanted = _PROMPT_FILE.value is not None or _MAX_NEW.value is not None
  if wanted and (mode != 'sample' or _PROMPT_FILE.value is None):
    raise ConfigError(
      '--prompt_file and --max_new_tokens belong to --mode=sample; give '
      '--mode=sample --prompt_file=PATH.'
    )
  return wanted


def main(argv):
  debug = (
    _DEBUG.value or wants_traceback(argv) or flags.FLAGS['verbosity'].present
  )
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  if not debug:
    _quiet_thread_errors()
    _quiet_logs()
  workdir, mode = _WORKDIR.value, _MODE.value
  try:
    config = _CONFIG.value
    bad = _config_flag_error(config)
    if bad is not None:
      raise bad
    if config is None:
      config = saved_config(workdir, mode)
    keep_freed_memory()  # Before JAX starts its threads; host_memory.py.
    check_mode(config, mode)  # Before the distributed start-up.
    prompted = check_prompt_flags(mode)
    if mode == 'plan':  # Compiles on fake devices; trains nothing.
      plans.launch(config, workdir, _DEVICES.value)
      return
    name_samples(config, workdir, _NAME.value)  # Refuses a taken name.
    initialize_distributed()
    if prompted:
      result = sample_prompt_file(
        config, workdir, _PROMPT_FILE.value, max_new_tokens=_MAX_NEW.value
      )
    else:
      result = run(
        config, workdir, mode, _SPLIT.value, allow_fresh_start=_FRESH.value
      )
  except Exception as err:  # noqa: BLE001 - faults get one line, bugs raise.
    liveness.settle()  # A lost peer's line (and exit 134) comes first.
    answer = faults.explain(err, workdir)
    if debug or answer is None:
      raise
    code, line = answer
    print(f'error: {line}', file=sys.stderr)
    if code == faults.WRITE_FAILED:
      # The checkpoint writer's native threads still hold failed writes; a
      # normal interpreter shutdown lets them print tracebacks after this
      # line. Every complete checkpoint is on disk already (the line names
      # the newest), so the process ends here.
      faults.exit_now(code)
    sys.exit(code)
  print(mode_summary(result, mode, workdir, _SPLIT.value))
  if isinstance(result, dict) and 'preempted_at_step' in result:
    sys.exit(PREEMPTED_EXIT_CODE)


if __name__ == '__main__':
  discover.handle(sys.argv)  # --list / --describe print and exit.
  app.run(main, flags_parser=parse_flags)
