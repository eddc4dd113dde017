"""Ending a process at once, after its one line: shared by the fault paths.

`training.faults` (full disk) and `parallel.liveness` (a lost peer) both end
the run with a line already printed while native threads may still print
after it; this module sits in the foundation layer so the watchdog can use
it without importing the training layer above it.
"""

from __future__ import annotations

import os
import sys

# A process of a multi-process run died: the others stop with one line
# naming it (parallel/liveness.py). 128 + SIGABRT, so JAX's own abort, the
# fallback when process 0 and its service die first, reads the same.
LOST_PROCESS = 134


def exit_now(code: int) -> None:
  """Ends the process at once with `code`, after the line already printed.

  For faults where native threads still hold work that would print after
  the run's one line (tensorstore's failed writes print asyncio's
  'Event loop is closed' tracebacks; a lost peer's collectives abort): the
  streams are flushed, stderr is pointed at /dev/null so nothing native
  reaches it any more, and no Python shutdown (atexit, finalizers) runs.
  Everything the run keeps is on disk already when this is called.
  """
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # A closed or broken stream.
      pass
  try:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
  except OSError:
    pass
  os._exit(code)


__all__ = ['LOST_PROCESS', 'exit_now']
