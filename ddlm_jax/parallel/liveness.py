"""Lost processes of a multi-process run: noticed, named, one line, exit 134.

JAX's own answer to a dead process is an abort of every other process from
a native thread (SIGABRT), with C++ log lines and a stack trace. This
module answers first and in the run's words:

* A watchdog thread in every process writes a counter to jax.distributed's
  key-value store every `beat_s` and reads everyone's. A process whose
  counter has not moved for `timeout_s` is lost: the watchdog prints one
  line naming it and ends this process with exit code 134
  (process_exit.LOST_PROCESS). JAX's heartbeat timeout is set to twice
  `timeout_s` (mesh.initialize_distributed), so the watchdog always decides
  before JAX's coordination service does.
* When process 0 dies, the service it hosts goes with it and JAX aborts the
  others at once, before any Python code can run; stderr then passes
  through a small filter process (stderr_guard.py) that turns JAX's fatal
  report into the same one line.

A process that ends normally (or on SIGTERM) marks itself done in the
store, so the others never mistake a finished peer for a lost one.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time

from ddlm_jax.parallel import stderr_guard
from ddlm_jax.parallel.process_exit import LOST_PROCESS, exit_now

_PREFIX = 'ddlm_jax/alive/'
_DONE = 'done'
_active: Watchdog | None = None


def _key(process: int) -> str:
  return f'{_PREFIX}{process}'


def stale(
  last: dict[int, tuple[str | None, float]],
  values: dict[int, str | None],
  now: float,
  timeout_s: float,
) -> tuple[dict[int, tuple[str | None, float]], int | None]:
  """(updated last-change table, the first lost process or None).

  last: {process: (its counter when it last changed, when)}; values: the
  counters read now. A process marked done is never lost.
  """
  out, lost = {}, None
  for process, (seen, since) in last.items():
    value = values.get(process)
    if value != seen:
      since = now
    out[process] = (value, since)
    if value != _DONE and now - since > timeout_s and lost is None:
      lost = process
  return out, lost


class Watchdog(threading.Thread):
  """The thread that beats for this process and watches the others."""

  def __init__(self, client, process_id: int, num_processes: int, timeout_s):
    super().__init__(name='ddlm_jax-liveness', daemon=True)
    self.client = client
    self.process_id = process_id
    self.num_processes = num_processes
    self.timeout_s = float(timeout_s)
    self.beat_s = max(0.2, min(1.0, self.timeout_s / 10))
    self.stopped = threading.Event()
    now = time.monotonic()
    self.last = {
      p: (None, now) for p in range(num_processes) if p != process_id
    }

  def run(self) -> None:
    beat, failing_since = 0, None
    while not self.stopped.wait(self.beat_s):
      beat += 1
      try:
        self.client.key_value_set(
          _key(self.process_id), str(beat), allow_overwrite=True
        )
      except Exception:  # noqa: BLE001 - any failure: the service is silent.
        values = None
      else:
        values = self.counters()
      if values is None:
        # Process 0 hosts the service. Its death usually makes JAX abort
        # this process at once (stderr_guard.py words that); a store that
        # stays unreachable for the timeout means the same.
        now = time.monotonic()
        failing_since = failing_since or now
        if now - failing_since > self.timeout_s and not self.stopped.is_set():
          self.lose(0, self.timeout_s)
        continue
      failing_since = None
      self.last, lost = stale(
        self.last, values, time.monotonic(), self.timeout_s
      )
      if lost is not None and not self.stopped.is_set():
        self.lose(lost, self.timeout_s)

  def lose(self, process: int, silent_s) -> None:
    """Prints the one line naming `process` and ends this process (134)."""
    line = stderr_guard.lost_line(process, self.num_processes, silent_s)
    print(line, file=sys.stderr, flush=True)
    exit_now(LOST_PROCESS)

  def counters(self) -> dict[int, str | None] | None:
    """Every other process's counter as the store holds it now (None
    where the store cannot be read)."""
    try:
      entries = dict(self.client.key_value_dir_get(_PREFIX))
    except Exception:  # noqa: BLE001 - the service may be gone.
      return None
    return {p: entries.get(_key(p)) for p in self.last}

  def stop(self) -> None:
    """Marks this process done, so the others do not count it lost."""
    if self.stopped.is_set():
      return
    self.stopped.set()
    try:
      self.client.key_value_set(
        _key(self.process_id), _DONE, allow_overwrite=True
      )
    except Exception:  # noqa: BLE001, S110 - the service may be gone already.
      pass


_guard: subprocess.Popen | None = None


def start_guard(process_id: int, num_processes: int) -> None:
  """Sends this process's stderr through stderr_guard.py from now on."""
  global _guard
  read_fd, write_fd = os.pipe()
  real_fd = os.dup(2)
  try:
    _guard = subprocess.Popen(
      [
        sys.executable,
        '-I',
        '-S',
        stderr_guard.__file__,
        str(process_id),
        str(num_processes),
      ],
      stdin=read_fd,
      stdout=subprocess.DEVNULL,
      stderr=real_fd,
      close_fds=True,
    )
  except OSError:
    os.close(write_fd)
    raise
  finally:
    os.close(read_fd)
    os.close(real_fd)
  sys.stderr.flush()
  os.dup2(write_fd, 2)
  os.close(write_fd)


def start(
  client, process_id: int, num_processes: int, timeout_s
) -> Watchdog | None:
  """Starts the stderr guard and the watchdog (once per process).

  A store that refuses the first beat (a JAX whose client API changed)
  starts neither: JAX's own abort then remains the answer to a lost
  process, and a healthy run is never stopped by a watchdog that cannot
  work. Returns the watchdog, or None then.
  """
  global _active
  if _active is not None:
    return _active
  try:
    client.key_value_set(_key(process_id), '0', allow_overwrite=True)
    dict(client.key_value_dir_get(_PREFIX))
  except Exception as err:  # noqa: BLE001 - any API mismatch: no watchdog.
    print(
      f'warning: no lost-process watchdog ({type(err).__name__}: {err}); '
      "a lost process ends this one by JAX's own abort.",
      file=sys.stderr,
    )
    return None
  try:
    start_guard(process_id, num_processes)
  except OSError as err:  # No python to run the filter: unfiltered stderr.
    print(f'warning: stderr filter not started: {err}', file=sys.stderr)
  _active = Watchdog(client, process_id, num_processes, timeout_s)
  _active.start()
  atexit.register(_active.stop)  # Runs before jax.distributed's shutdown.
  return _active


def _count(value: str | None) -> int:
  return -1 if value is None or value == _DONE else int(value)


def moved(before: dict[int, str | None], now: dict[int, str | None]) -> bool:
  """Whether every process in `before` beat after it was read (its counter
  grew) or finished since."""
  return all(
    now.get(p) == _DONE or _count(now.get(p)) > _count(seen)
    for p, seen in before.items()
  )


def settle() -> None:
  """Before a multi-process run reports its own error: lets the watchdog
  decide first whether a lost process caused it (then this process ends
  here, with the lost-process line), waiting at most its timeout.

  A peer dying mid-collective can fail this process's step at once, long
  before the peer counts as lost; its error would then be misleading.
  Returns at once on one process, or once every peer's counter in the
  store has grown past the value read here: a beat written after the
  error. (The watchdog's own table cannot tell that: it may first see a
  dead peer's last beat a moment after the error.)
  """
  dog = _active
  if dog is None or not dog.is_alive():
    return
  deadline = time.monotonic() + dog.timeout_s + 3 * dog.beat_s
  before = dog.counters()
  while time.monotonic() < deadline and dog.is_alive():
    time.sleep(dog.beat_s / 2)
    if before is None:  # Unreadable store: the watchdog decides.
      before = dog.counters()
      continue
    now = dog.counters()
    if now is not None and moved(before, now):
      return
