"""One-line errors for bad command-line flags of experiments.run.

Kept apart from run.py, which defines its absl flags at import (a second
module defining --workdir in the same process, e.g. experiments.zero_shot
in a test worker, would clash), so tests parse flags through this module on
a FlagValues of their own.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys

from absl import flags

from ddlm_jax.training.config import RENAMED_KEYS, apply_overrides

PROCESS_PREFIX = '--config.process.'


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


def split_process_flags(argv):
  """(argv without them, {key: text}) of the --config.process.* flags.

  Only when one of them sets process.kind: the process block then holds
  another family's keys, which ml-collections cannot override before the
  kind is switched. Otherwise argv is returned as it is.
  """
  found, rest, i = {}, [argv[0]], 1
  while i < len(argv):
    arg = argv[i]
    if arg.startswith(PROCESS_PREFIX):
      name, eq, value = arg.partition('=')
      if not eq and i + 1 < len(argv):
        value, i = argv[i + 1], i + 1
      found[name.removeprefix('--config.')] = value
    else:
      rest.append(arg)
    i += 1
  if 'process.kind' not in found:
    return list(argv), {}
  return rest, found


def _typed(text: str, default):
  """A flag's text as the type of the setting's default."""
  if isinstance(default, bool):
    if text.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(f'expected True or False, got {text!r}')
    return text.lower() in ('true', '1')
  if isinstance(default, (int, float)):
    return type(default)(ast.literal_eval(text))
  return text


def apply_process_flags(config, found: dict) -> None:
  """Switches config.process to the flagged kind, then sets the others."""
  dotted = {'process.kind': found['process.kind']}
  apply_overrides(config, dotted)
  for key, text in found.items():
    if key == 'process.kind':
      continue
    leaf = key.removeprefix('process.')
    if leaf not in config.process:
      names = sorted(k for k in config.process if k != 'kind')
      close = difflib.get_close_matches(leaf, names, n=1)
      hint = f'did you mean process.{close[0]}? ' if close else ''
      raise ValueError(
        f'--config.{key}: process.kind={found["process.kind"]!r} has no '
        f'setting {leaf!r}; {hint}it takes {names}.'
      )
    try:
      config.process[leaf] = _typed(text, config.process[leaf])
    except (ValueError, SyntaxError, TypeError) as err:
      raise ValueError(f'--config.{key}={text}: {err}') from None


def wants_traceback(argv) -> bool:
  """--debug (or absl's --verbosity) asks for tracebacks, not one line."""
  return any(
    a.startswith(('--verbosity', '-v', '--debug')) and a != '--debug=false'
    for a in argv[1:]
  )


def _without_traceback(message: str) -> str:
  """A config file's own error out of ml-collections' parse message.

  A config whose get_config raises (an unknown preset, `quickstart.py:smok`)
  reaches absl as 'flag --config=...: Error whilst parsing config file:
  Traceback ...' with the traceback inside; keep the flag and the last
  line, the config's message ('unknown preset ...; choose one of ...').
  """
  if 'Traceback (most recent call last)' not in message:
    return message
  message = message.replace('\\n', '\n')
  head = message.split(': Error whilst parsing config file', 1)[0]
  head = head.removeprefix('flag ')
  lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
  last = re.match(r'^[\w.]+(Error|Exception): (.*)$', lines[-1])
  return f'{head}: {last.group(2) if last else lines[-1]}'


def parse_flags(argv, flag_values=None):
  """absl's flag parsing, with a one-line error for a bad override.

  A misspelt key (--config.model.widht=3) surfaces from ml-collections as
  a chain of KeyError/AttributeError tracebacks around a good "Did you
  mean" message; print that message alone (the traceback with
  --verbosity). A renamed key (--config.data.batch_size) names its new
  flag instead. `flag_values`: absl's global FLAGS unless given (tests).
  """
  argv, process_flags = split_process_flags(argv)
  flag_values = flags.FLAGS if flag_values is None else flag_values
  # ml-collections reads --config.* overrides from sys.argv itself.
  saved_argv = sys.argv
  if process_flags:
    sys.argv = list(argv)
  try:
    try:
      rest = flag_values(argv)
    finally:
      sys.argv = saved_argv
    config = flag_values['config'].value if 'config' in flag_values else None
    if process_flags and config is not None:
      apply_process_flags(config, process_flags)
    return rest
  except ValueError as err:
    if wants_traceback(argv):
      raise
    print(f'error: bad flag: {err}', file=sys.stderr)
    sys.exit(2)
  except (AttributeError, KeyError, flags.Error) as err:
    if wants_traceback(argv):
      raise
    renamed = renamed_flag(argv)
    if renamed:
      print(f'error: bad flag: {renamed}', file=sys.stderr)
      sys.exit(2)
    message = str(err.args[0] if err.args else err).strip('\'"')
    message = _without_traceback(message)
    for escaped, plain in (('\\n', ' '), ('\n', ' '), ("\\'", "'")):
      message = message.replace(escaped, plain)
    print(f'error: bad flag: {message}', file=sys.stderr)
    sys.exit(2)
