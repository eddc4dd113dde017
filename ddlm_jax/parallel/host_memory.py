"""Host allocator settings that stop XLA:CPU page-faulting every step.

XLA:CPU allocates a program's temporaries (748 MiB for the train step at
md4's reference config) as one block with malloc at every call and frees
it at the end. glibc serves a block that large with a fresh mmap (worker
threads' arenas always do) and unmaps it on free, so every call
page-faults the whole block in again: 200k minor faults and ~0.9 s of
kernel time per 1.9 s train step on a 2-core CPU (docs/HISTORY.md 2.2).
Keeping freed memory in the heap makes later calls reuse the same warm
pages: one arena, no mmap for large blocks, no trimming. The cost is that
the process keeps its peak heap until it exits, which a training or
sampling process reaches on its first step anyway.

`keep_freed_memory()` is called by the entry points (experiments.run,
the benchmarks, the test suite) before JAX starts its threads; set
DDLM_JAX_HOST_MALLOC=default to leave glibc's behaviour alone. On a
C library other than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

ENV_VAR = 'DDLM_JAX_HOST_MALLOC'

# mallopt(3) parameters and glibc's defaults for the two that are restored.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: ~2 GiB of free top of heap.


@functools.cache
def _glibc():
  """The process's glibc, or None on any other C library."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    libc.gnu_get_libc_version()
  except (OSError, AttributeError):
    return None
  return libc


def keep_freed_memory(keep: bool | None = None) -> bool:
  """Makes glibc keep freed blocks for reuse (keep=True) or restores its
  mmap and trim defaults (keep=False; the one-arena cap stays). With
  keep=None the environment decides: on unless DDLM_JAX_HOST_MALLOC is
  'default'. Returns whether the settings were applied."""
  if keep is None:
    mode = os.environ.get(ENV_VAR, 'keep')
    if mode not in ('keep', 'default'):
      raise ValueError(
        f'{ENV_VAR}={mode!r}: use "keep" (reuse freed host memory, the '
        'default) or "default" (glibc as it is).'
      )
    if mode == 'default':
      return False
    keep = True
  libc = _glibc()
  if libc is None:
    return False
  if keep:
    ok = (
      libc.mallopt(_M_ARENA_MAX, 1)
      and libc.mallopt(_M_MMAP_MAX, 0)
      and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)
    )
  else:
    ok = libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX) and libc.mallopt(
      _M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD
    )
  return bool(ok)
