"""One writer per workdir: an advisory lock taken before anything is written.

Two runs on one workdir would interleave checkpoints and metrics and each
resume from the other's steps. `WorkdirLock` holds `fcntl.flock` on
`<workdir>/.lock` for its lifetime; the kernel drops it when the process
dies, so a crashed run never blocks the next one. The file also names its
owner (pid, host, start time, command) for the error a second run gets.

  with WorkdirLock(workdir, enabled=jax.process_index() == 0):
    train(...)
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys

from ddlm_jax.errors import WorkdirLockedError  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

LOCK_NAME = '.lock'


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Exists, owned by someone else.
    return True
  return True


def _read_owner(fd: int) -> dict:
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 64 * 1024).decode('utf-8', 'replace')
  except OSError:
    return {}
  try:
    owner = json.loads(raw)
  except ValueError:
    return {'raw': raw.strip()[:200]} if raw.strip() else {}
  return owner if isinstance(owner, dict) else {}


def _describe(owner: dict) -> str:
  if not owner.get('pid'):
    return 'an unknown process' + (
      f' (lock file says {owner["raw"]!r})' if owner.get('raw') else ''
    )
  text = f'pid {owner["pid"]} on host {owner.get("host", "?")}'
  if owner.get('started'):
    text += f', started {owner["started"]}'
  if owner.get('command'):
    text += f' ({owner["command"]})'
  return text


class WorkdirLock:
  """Exclusive advisory lock on a workdir; a context manager.

  `enabled=False` makes it a no-op (other processes of a multi-process run:
  only process 0 writes); `None` means `jax.process_index() == 0`.
  """

  def __init__(self, workdir: str, *, enabled: bool | None = None):
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, LOCK_NAME)
    self._enabled = enabled
    self._fd: int | None = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> WorkdirLock:
    """Takes the lock or raises WorkdirLockedError at once (no waiting)."""
    if self._fd is not None:
      return self
    enabled = self._enabled
    if enabled is None:
      import jax

      enabled = jax.process_index() == 0
    if not enabled:
      return self
    os.makedirs(self.workdir, exist_ok=True)
    for _ in range(10):
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as err:
        owner = _read_owner(fd)
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
          raise
        raise WorkdirLockedError(
          f'{self.workdir} is in use by {_describe(owner)}: only one run may '
          'write to a workdir. Wait for that run to finish or stop it'
          + (f' (kill {owner["pid"]})' if owner.get('pid') else '')
          + ', or pass a different --workdir.'
        ) from None
      # A releaser unlinks the file while holding the lock: if the path
      # now names another file (or none), this lock guards nothing; retry.
      try:
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    else:
      raise WorkdirLockedError(
        f'Could not take the lock {self.path}: it keeps being replaced.'
      )
    self._take_over(fd)
    return self

  def _take_over(self, fd: int):
    previous = _read_owner(fd)
    if previous:
      here = previous.get('host') == socket.gethostname()
      pid = previous.get('pid')
      state = (
        'no longer running'
        if here and isinstance(pid, int) and not _pid_alive(pid)
        else 'not holding the lock'
      )
      log.warning(
        'Taking over the stale lock %s left by %s (%s).',
        self.path,
        _describe(previous),
        state,
      )
    owner = {
      'pid': os.getpid(),
      'host': socket.gethostname(),
      'started': datetime.datetime.now(datetime.UTC).isoformat(
        timespec='seconds'
      ),
      'command': ' '.join(sys.argv)[:300],
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(owner) + '\n').encode())
    os.fsync(fd)
    self._fd = fd

  def release(self):
    """Removes the lock file and drops the lock; a no-op if not held."""
    fd, self._fd = self._fd, None
    if fd is None:
      return
    try:
      os.unlink(self.path)  # Still under the lock: see acquire's retry.
    except FileNotFoundError:
      pass
    finally:
      os.close(fd)  # Closing the last descriptor drops the flock.

  def __enter__(self) -> WorkdirLock:
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
    return False
