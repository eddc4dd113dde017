"""One writer per workdir: an advisory lock taken before anything is written.

Two runs on one workdir would interleave checkpoints and metrics and each
resume from the other's steps. On a local (or shared POSIX) filesystem
`WorkdirLock` holds `fcntl.flock` on `<workdir>/.lock` for its lifetime;
the kernel drops it when the process dies, so a crashed run never blocks
the next one. The file also names its owner (pid, host, start time,
command) for the error a second run gets.

An object store (a URI workdir, gs://...) has no locks, and `etils.epath`
no create-if-absent write, so there `<workdir>/.lock` is a lease
(`_Lease`): the owner rewrites it every `heartbeat_s` seconds, a second run
refuses while it is younger than `stale_after_s`, and takes over an older
one (its owner died without releasing it). A claim is read back after
`settle_s` seconds, so of two runs that start together the one whose write
landed last keeps the lease and the other refuses.

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
import threading
import time
import uuid

from ddlm_jax import paths
from ddlm_jax.errors import WorkdirLockedError  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

LOCK_NAME = '.lock'
# Object-store leases: renewed every HEARTBEAT_S, stale after STALE_AFTER_S
# without renewal (a crashed owner blocks the workdir that long at most),
# a claim read back after SETTLE_S.
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0
SETTLE_S = 2.0


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

  def __init__(
    self,
    workdir: str,
    *,
    enabled: bool | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    stale_after_s: float = STALE_AFTER_S,
    settle_s: float = SETTLE_S,
  ):
    self.workdir = paths.absolute(workdir)
    self.path = paths.join(self.workdir, LOCK_NAME)
    self._enabled = enabled
    self._fd: int | None = None
    self._lease: _Lease | None = None
    if paths.is_remote(self.workdir):
      self._lease = _Lease(self.path, heartbeat_s, stale_after_s, settle_s)

  @property
  def held(self) -> bool:
    return self._fd is not None or bool(self._lease and self._lease.held)

  def acquire(self) -> WorkdirLock:
    """Takes the lock or raises WorkdirLockedError at once (no waiting)."""
    if self.held:
      return self
    enabled = self._enabled
    if enabled is None:
      import jax

      enabled = jax.process_index() == 0
    if not enabled:
      return self
    if self._lease is not None:
      self._lease.acquire(self.workdir)
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
    owner = _owner_record()
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(owner) + '\n').encode())
    os.fsync(fd)
    self._fd = fd

  def release(self):
    """Removes the lock file and drops the lock; a no-op if not held."""
    if self._lease is not None:
      self._lease.release()
      return
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


def _owner_record() -> dict:
  return {
    'pid': os.getpid(),
    'host': socket.gethostname(),
    'started': datetime.datetime.now(datetime.UTC).isoformat(
      timespec='seconds'
    ),
    'command': ' '.join(sys.argv)[:300],
  }


class _Lease:
  """The lock of an object-store workdir: a lease file kept fresh.

  The file holds the owner record plus a random `token` and `renewed` (Unix
  time of the last renewal, by the owner's clock: hosts' clocks must agree
  to well within `stale_after_s`). A daemon thread renews it; a renewal
  that finds another token stops renewing and logs an error (this run was
  taken for dead and its workdir taken over).
  """

  def __init__(self, path, heartbeat_s, stale_after_s, settle_s):
    if not 0 < heartbeat_s < stale_after_s:
      raise ValueError(
        f'heartbeat_s={heartbeat_s} must be > 0 and below stale_after_s='
        f'{stale_after_s}, or a live run looks stale.'
      )
    self.path = path
    self.heartbeat_s = heartbeat_s
    self.stale_after_s = stale_after_s
    self.settle_s = settle_s
    self.record: dict | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  @property
  def held(self) -> bool:
    return self.record is not None

  def _read(self) -> dict | None:
    """The lease on the store; None when there is none; {} if unreadable."""
    try:
      text = paths.read_text(self.path)
    except FileNotFoundError:
      return None
    try:
      owner = json.loads(text)
    except ValueError:
      return {'raw': text.strip()[:200]} if text.strip() else {}
    return owner if isinstance(owner, dict) else {}

  def _write(self):
    self.record['renewed'] = time.time()
    paths.write_text(self.path, json.dumps(self.record) + '\n')

  def acquire(self, workdir: str):
    owner = self._read()
    if owner is not None:
      age = time.time() - float(owner.get('renewed') or 0)
      if age < self.stale_after_s:
        raise WorkdirLockedError(
          f'{workdir} is in use by {_describe(owner)} (its lease {self.path} '
          f'was renewed {age:.0f}s ago): only one run may write to a '
          'workdir. Wait for that run to finish or stop it, or pass a '
          f'different --workdir; a lease left by a crashed run expires '
          f'{self.stale_after_s:.0f}s after its last renewal.'
        )
      log.warning(
        'Taking over the stale lease %s left by %s (not renewed for %.0fs).',
        self.path,
        _describe(owner),
        age,
      )
    self.record = {**_owner_record(), 'token': uuid.uuid4().hex}
    self._write()
    self._settle()
    now = self._read()
    if not now or now.get('token') != self.record['token']:
      self.record = None
      raise WorkdirLockedError(
        f'{workdir} was claimed at the same moment by '
        f'{_describe(now or {})}: only one run may write to a workdir. '
        'Pass a different --workdir, or stop that run and start again.'
      )
    self._stop.clear()
    self._thread = threading.Thread(
      target=self._renew, name='ddlm-workdir-lease', daemon=True
    )
    self._thread.start()

  def _settle(self):
    """Lets a claim made at the same moment land before reading back."""
    time.sleep(self.settle_s)

  def _renew(self):
    while not self._stop.wait(self.heartbeat_s):
      try:
        now = self._read()
        if not now or now.get('token') != self.record['token']:
          log.error(
            'The lease %s now names %s: this run was taken for stopped and '
            'another one took its workdir over; renewals stop.',
            self.path,
            _describe(now or {}),
          )
          return
        self._write()
      except Exception as err:  # noqa: BLE001 - retried next beat.
        log.warning('Could not renew the lease %s: %s', self.path, err)

  def release(self):
    """Stops renewing and deletes the lease if it is still this run's."""
    if self.record is None:
      return
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    try:
      now = self._read()
      if now and now.get('token') == self.record['token']:
        paths.remove(self.path)
    finally:
      self.record = None
