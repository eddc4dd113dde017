"""The stderr of a multi-process run, with JAX's fatal report made one line.

When process 0 of a `jax.distributed` run dies, the service it hosts goes
with it and every other process's JAX runtime aborts at once from a native
thread (SIGABRT), printing several C++ log lines and a stack trace; no
Python code can run first. So a multi-process run sends its stderr (fd 2)
through this small filter process (stdlib only, started by
`ddlm_jax.parallel.liveness`): every line passes unchanged, except JAX's
coordination-service lines, which are held back for a moment. If the fatal
report follows, the held lines and everything after are dropped and the
run's own one line naming the lost process is printed instead; otherwise
the held lines pass a moment later. The run's own lost-process line (from
its watchdog, which usually decides first) ends the output the same way.

Run as a script (`python stderr_guard.py PROCESS_ID NUM_PROCESSES`), so it
imports nothing of the package (no JAX); the pure functions below are
importable and tested.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import time

# The run's line starts with this; what follows it is dropped.
LOST_PREFIX = 'error: lost process'
# JAX's native line before its abort (xla/pjrt/distributed/client.h).
JAX_FATAL = 'Terminating process because the JAX distributed service'
# absl's native log prefix (severity, date, time, thread, file:line) on
# the files of JAX's coordination client and service.
_NATIVE = re.compile(
  r'^[IWEF]\d{4} [\d:.]+\s+\d+ (coordination_service|coordination_service_'
  r'agent|preemption_sync_manager|client\.h|client\.cc)'
)
_UNHEALTHY = re.compile(
  r'unhealthy \(stopped sending heartbeats\):\s*([\d\s,]+)'
)
HOLD_S = 2.0  # How long coordination lines wait for a fatal report.


def lost_line(lost: int | None, num_processes: int, silent_s=None) -> str:
  """The run's one line when process `lost` (None: unknown) is gone."""
  who = f'{"?" if lost is None else lost} of {num_processes}'
  if lost == 0:
    who += ' (the coordinator, host of the jax.distributed service)'
  why = f'silent for {silent_s:g} s' if silent_s else 'unreachable'
  return (
    f'{LOST_PREFIX} {who}: {why} (killed, crashed or its host lost); this '
    'process stops too. Every complete checkpoint is kept: start all '
    'processes again with the same command to resume.'
  )


def lost_in_report(text: str) -> int | None:
  """The process JAX's fatal report names: a silent task, or 0 when the
  coordination service itself is gone; None when it names neither."""
  found = _UNHEALTHY.search(text)
  if found:
    ids = [int(t) for t in re.findall(r'\d+', found.group(1))]
    if ids:
      return ids[0]
  if 'stopped sending heartbeats' in text:  # Its task ids not read yet.
    return None
  lowered = text.lower()
  if 'leader task' in lowered or 'coordination service' in lowered:
    return 0
  return None


class Filter:
  """Line filter state: feed(lines) -> text to pass on; tick() on idle."""

  def __init__(self, num_processes: int, clock=time.monotonic, process_id=None):
    self.num_processes = num_processes
    # This process cannot be the one it lost: process 0's own JAX reports
    # "coordination service" errors when a peer is gone (at its shutdown
    # barrier, say), which would otherwise name process 0.
    self.process_id = process_id
    self.clock = clock
    self.held: list[str] = []
    self.held_at = 0.0
    self.fatal: str | None = None  # JAX's fatal report, while it arrives.
    self.done = False  # A lost-process line was printed: drop the rest.

  def feed(self, line: str) -> str:
    if self.done:
      return ''
    if line.startswith(LOST_PREFIX):
      self.done, self.held, self.fatal = True, [], None
      return line
    if self.fatal is not None:
      self.fatal += line
      return self._lost(final=line.startswith('*** '))
    if JAX_FATAL in line:
      # The tasks JAX names may follow on the next lines of its report.
      self.fatal, self.held = ''.join(self.held) + line, []
      self.held_at = self.clock()
      return self._lost(final=False)
    if self.held or _NATIVE.match(line):
      if not self.held:
        self.held_at = self.clock()
      self.held.append(line)
      return ''
    return line

  def _lost(self, final: bool) -> str:
    """The one line once the report names the lost process (or is over)."""
    lost = lost_in_report(self.fatal)
    if lost == self.process_id:
      lost = None
    waiting = lost is None and 'stopped sending heartbeats' in self.fatal
    if waiting and not final:
      return ''
    self.done, self.fatal = True, None
    return lost_line(lost, self.num_processes) + '\n'

  def tick(self, final: bool = False) -> str:
    """The held lines (or the one line of an unfinished fatal report),
    once they waited HOLD_S, or at the end."""
    if self.done or not (self.held or self.fatal is not None):
      return ''
    if not final and self.clock() - self.held_at < HOLD_S:
      return ''
    if self.fatal is not None:
      return self._lost(final=True)
    out, self.held = ''.join(self.held), []
    return out


def main(argv) -> None:
  # A Ctrl-C or a scheduler's SIGTERM goes to the whole process group; the
  # filter must outlive the run to pass on its last lines.
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
  filt = Filter(int(argv[2]), process_id=int(argv[1]))
  out = sys.stderr
  pending = b''
  while True:
    ready, _, _ = select.select([0], [], [], 0.5)
    chunk = os.read(0, 65536) if ready else None
    if chunk == b'':
      break
    if chunk:
      pending += chunk
      *lines, pending = pending.split(b'\n')
      for raw in lines:
        out.write(filt.feed(raw.decode('utf-8', 'replace') + '\n'))
    elif pending and not filt.held:  # An unended line, idle: pass it on.
      out.write(filt.feed(pending.decode('utf-8', 'replace')))
      pending = b''
    out.write(filt.tick())
    out.flush()
  if pending:
    out.write(filt.feed(pending.decode('utf-8', 'replace')))
  out.write(filt.tick(final=True))
  out.flush()


if __name__ == '__main__':
  main(sys.argv)
