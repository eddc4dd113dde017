"""Fault classes of a run, their exit codes and their one-line answers.

Every way a run can stop short maps to one exit code, so a launcher can
tell a retryable stop (preemption, a lost peer process) from one a person
must fix (bad input, corrupt files, a full disk). docs/FAULTS.md is the
written policy: per class, what the run does, what it keeps and its code.

`explain(err)` turns an exception into (exit code, one line), or None for
an exception that is a bug (which keeps its traceback).
"""

from __future__ import annotations

import errno
import json
import os

from ddlm_jax import paths
from ddlm_jax.errors import (
  AllCheckpointsCorruptError,
  CheckpointSaveError,
  CorruptFileError,
  NoCheckpointError,
  WorkdirLockedError,
)
from ddlm_jax.parallel.process_exit import LOST_PROCESS, exit_now  # noqa: F401

# Exit codes (sysexits.h where one fits). Distinct per class of fault.
OK = 0
BUG = 1  # Any other exception: Python's own exit status, with traceback.
DIVERGED = 3  # Non-finite loss/params; the last finite checkpoint is kept.
BAD_INPUT = 2  # Flags, config, prompt, mode: refused before compute.
CORRUPT_FILES = 65  # EX_DATAERR: unreadable checkpoints, config, tokenizer.
NO_INPUT = 66  # EX_NOINPUT: nothing to read (no checkpoint, no run dir).
WORKDIR_IN_USE = 73  # Another live run holds the workdir's lock.
WRITE_FAILED = 74  # EX_IOERR: disk full, directory unwritable or a file.
PREEMPTED = 75  # EX_TEMPFAIL: SIGTERM/SIGINT; a checkpoint was saved.
# A process of a multi-process run died: the others stop with one line
# naming it (parallel/liveness.py); LOST_PROCESS = 134 (128 + SIGABRT) and
# exit_now live in parallel/process_exit.py, below this layer.

# Codes a retry loop restarts on (the run resumes from its checkpoint).
RETRYABLE = (PREEMPTED, LOST_PROCESS)


_WRITE_ERRNOS = {
  errno.ENOSPC: 'the disk is full',
  errno.EDQUOT: 'the disk quota is exhausted',
  errno.EROFS: 'the file system is read-only',
  errno.EACCES: 'permission denied',
  errno.EPERM: 'permission denied',
  errno.EEXIST: 'a file is in the way of a directory',
  errno.ENOTDIR: 'a path component is a file, not a directory',
}


_WRITE_FIX = {
  errno.ENOSPC: 'free space on that disk (or pass another --workdir)',
  errno.EDQUOT: 'free space on that disk (or pass another --workdir)',
  errno.EACCES: 'make it writable or pass another --workdir',
  errno.EEXIST: 'pass a --workdir that is a directory or a new path',
  errno.ENOTDIR: 'pass a --workdir that is a directory or a new path',
}


# The same faults as tensorstore (orbax's array writer) words them: its
# errors are ValueErrors whose text carries the OS message.
_WRITE_TEXTS = {
  os.strerror(code): reason for code, reason in _WRITE_ERRNOS.items()
}


def os_error_reason(err: BaseException) -> str | None:
  """'the disk is full' etc. for a write fault anywhere in err's chain."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
      return _WRITE_ERRNOS[err.errno]
    text = str(err)
    for words, reason in _WRITE_TEXTS.items():
      if words in text:
        return reason
    err = err.__cause__ or err.__context__
  return None


def read_json(path: str, what: str = 'file'):
  """json.load of `path`, with a CorruptFileError naming it if unparsable."""
  try:
    return json.loads(paths.read_text(path))  # Local or a URI.
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise CorruptFileError(
      f'{path} ({what}) is corrupt or truncated: {err}. Restore it from a '
      'copy, or delete it to let the run rebuild it where it can.'
    ) from None


def one_line(text: str) -> str:
  return ' '.join(str(text).split())


def explain(
  err: BaseException, workdir: str | None = None
) -> tuple[int, str] | None:
  """(exit code, one-line message) of a fault, or None for a bug.

  workdir: named as the place of a write error that names no file.
  """
  name = type(err).__name__
  if isinstance(err, CheckpointSaveError):
    return WRITE_FAILED, one_line(err)
  if isinstance(err, (CorruptFileError, AllCheckpointsCorruptError)):
    return CORRUPT_FILES, one_line(err)
  if isinstance(err, NoCheckpointError):
    return NO_INPUT, one_line(err)
  if isinstance(err, WorkdirLockedError):
    return WORKDIR_IN_USE, one_line(err)
  if isinstance(err, FloatingPointError):
    return DIVERGED, one_line(err)
  if isinstance(err, OSError):
    reason = os_error_reason(err)
    where = err.filename or (f'in {workdir}' if workdir else 'a file')
    if reason is not None:
      return WRITE_FAILED, (
        f'cannot write {where}: {reason}. Nothing was written there; '
        f'{_WRITE_FIX.get(err.errno, _WRITE_FIX[errno.EACCES])}, then run '
        'again.'
      )
    if isinstance(err, FileNotFoundError):
      return NO_INPUT, one_line(f'{name}: {err}')
    return None
  if isinstance(err, ValueError):
    return BAD_INPUT, one_line(f'{name}: {err}')
  return None
