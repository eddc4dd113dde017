"""The host allocator setting that keeps XLA:CPU's temporaries warm."""

import ctypes
import os
import resource
import subprocess
import sys

import pytest

from ddlm_jax.parallel import host_memory

pytestmark = pytest.mark.skipif(
  host_memory._glibc() is None, reason='glibc only'
)

_BLOCK = 256 * 2**20  # Far above glibc's largest mmap threshold (32 MiB).


def _malloc_fill_free() -> None:
  """What XLA:CPU does with a program's temporaries at every call (numpy
  would not do: it asks for huge pages, which hides the faults)."""
  libc = host_memory._glibc()
  libc.malloc.restype = ctypes.c_void_p
  ptr = libc.malloc(ctypes.c_size_t(_BLOCK))
  assert ptr
  ctypes.memset(ptr, 1, _BLOCK)
  libc.free(ctypes.c_void_p(ptr))


def _faults_of_second_block() -> int:
  """Minor page faults of a block the size of one that was just freed."""
  _malloc_fill_free()
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  _malloc_fill_free()
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _measure() -> None:
  """Prints the faults of a fresh and of a kept block (run in a child)."""
  try:
    assert host_memory.keep_freed_memory(False)
    fresh = _faults_of_second_block()
    assert host_memory.keep_freed_memory(True)
    kept = _faults_of_second_block()
  finally:
    host_memory.keep_freed_memory()
  print(fresh, kept)


def test_kept_memory_is_reused_without_page_faults():
  # The allocator's settings are process-global and other tests in the same
  # worker change them (every in-process run keeps freed memory), so the
  # faults are counted in a fresh interpreter.
  code = (
    'import sys; sys.path.insert(0, "tests"); '
    'import test_host_memory as t; t._measure()'
  )
  out = subprocess.run(
    [sys.executable, '-c', code],
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    capture_output=True,
    text=True,
    check=True,
  )
  fresh, kept = map(int, out.stdout.split()[-2:])
  pages = _BLOCK // resource.getpagesize()
  assert fresh > pages // 2  # glibc's default: a new mmap, faulted in again.
  assert kept < pages // 20  # kept: the same warm pages.


def test_environment_switch(monkeypatch):
  monkeypatch.setenv(host_memory.ENV_VAR, 'default')
  assert host_memory.keep_freed_memory() is False
  monkeypatch.setenv(host_memory.ENV_VAR, 'kep')
  with pytest.raises(ValueError, match='DDLM_JAX_HOST_MALLOC=.kep.'):
    host_memory.keep_freed_memory()
