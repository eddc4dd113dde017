"""Pytest setup: 8 fake CPU devices so sharding tests run on one machine.

XLA reads the flag once, when the backend starts, so it must be set before
anything imports jax.
"""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
