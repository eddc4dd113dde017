"""Timing helper: compile and warm up, then the median of repeated runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax


def median_ms(fn: Callable, *args, repeats: int = 5, min_time_s=0.0) -> float:
  """Median wall time of ``fn(*args)`` in ms (after one warm-up call)."""
  jax.block_until_ready(fn(*args))
  times = []
  start = time.perf_counter()
  while len(times) < repeats or time.perf_counter() - start < min_time_s:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
    if len(times) >= 10 * repeats:
      break
  return 1e3 * statistics.median(times)


def table(header: list[str], rows: list[list]) -> str:
  """A markdown table."""
  lines = ['| ' + ' | '.join(header) + ' |']
  lines.append('|' + '---|' * len(header))
  for row in rows:
    lines.append('| ' + ' | '.join(str(x) for x in row) + ' |')
  return '\n'.join(lines)
