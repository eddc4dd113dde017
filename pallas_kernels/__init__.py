"""Pallas kernels for ddlm_jax: scans (diagonal and PD-SSM) and attention.

Every op has a sequential/plain reference, an XLA path and a Pallas kernel
with a hand-written backward; ``impl='auto'`` picks Pallas on TPU and XLA on
CPU and GPU. This package imports nothing from ddlm_jax.
"""

from pallas_kernels.attention import MaskSpec, attention
from pallas_kernels.scan import (
  linear_combine,
  linear_scan,
  pd_apply,
  pd_apply_transpose,
  pd_combine,
  pd_identity,
  pd_scan,
)

__all__ = [
  'MaskSpec',
  'attention',
  'linear_combine',
  'linear_scan',
  'pd_apply',
  'pd_apply_transpose',
  'pd_combine',
  'pd_identity',
  'pd_scan',
]
