"""One-line errors for bad command-line flags of experiments.run.

Kept apart from run.py, which defines its absl flags at import (a second
module defining --workdir in the same process, e.g. experiments.zero_shot
in a test worker, would clash), so tests parse flags through this module on
a FlagValues of their own.
"""

from __future__ import annotations

import sys

from absl import flags

from ddlm_jax.training.config import RENAMED_KEYS


def renamed_flag(argv) -> str | None:
  """The error for the first --config.OLD flag of a renamed key, if any.

  `RENAMED_KEYS` (ddlm_jax.training.config) maps each old key to its new one,
  e.g. data.batch_size -> train.batch_size; the message names the new flag
  with the value given.
  """
  for i, arg in enumerate(argv[1:], 1):
    name, eq, value = arg.partition('=')
    old = name.removeprefix('--config.')
    if name.startswith('--config.') and old in RENAMED_KEYS:
      if not eq and i + 1 < len(argv):  # --config.a.b VALUE
        value = argv[i + 1]
      new = RENAMED_KEYS[old]
      return (
        f'--config.{old} was renamed --config.{new} (the same setting); '
        f'pass --config.{new}={value or "VALUE"}.'
      )
  return None


def parse_flags(argv, flag_values=None):
  """absl's flag parsing, with a one-line error for a bad override.

  A misspelt key (--config.model.widht=3) surfaces from ml-collections as
  a chain of KeyError/AttributeError tracebacks around a good "Did you
  mean" message; print that message alone (the traceback with
  --verbosity). A renamed key (--config.data.batch_size) names its new
  flag instead. `flag_values`: absl's global FLAGS unless given (tests).
  """
  try:
    return (flags.FLAGS if flag_values is None else flag_values)(argv)
  except (AttributeError, KeyError, flags.Error) as err:
    if any(a.startswith(('--verbosity', '-v')) for a in argv[1:]):
      raise
    renamed = renamed_flag(argv)
    if renamed:
      print(f'error: bad flag: {renamed}', file=sys.stderr)
      sys.exit(2)
    message = str(err.args[0] if err.args else err).strip('\'"')
    for escaped, plain in (('\\n', ' '), ('\n', ' '), ("\\'", "'")):
      message = message.replace(escaped, plain)
    print(f'error: bad flag: {message}', file=sys.stderr)
    sys.exit(2)
