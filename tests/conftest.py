"""Pytest setup: 8 fake CPU devices, and JAX's persistent compilation cache.

XLA reads the device flag once, when the backend starts, so it must be set
before anything imports jax. The compilation cache lives in the checkout
(.jax_cache/, ignored by git), so a fresh clone starts empty and the tests
of one session (both xdist workers and the CLI subprocesses, which inherit
the environment) reuse each other's compiled smoke programs.
"""

import os
import pathlib

_CACHE = pathlib.Path(__file__).resolve().parents[1] / '.jax_cache' / 'tests'

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', str(_CACHE))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.3')
