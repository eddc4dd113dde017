"""Pallas kernels for ddlm_jax: scans (diagonal and PD-SSM) and attention.

Every op has a sequential/plain reference, an XLA path and a Pallas kernel
with a hand-written backward, lowered through Mosaic on TPU and Triton on
GPU. Attention also dispatches to library kernels (cuDNN on GPU, splash on
TPU). ``impl='auto'`` follows a small table per op: for the scans
``_common.AUTO_IMPL`` (Pallas on TPU, XLA elsewhere), for attention
``attention.api.AUTO_TABLE`` (by platform, mask kind, dtype and length).
This package imports nothing from ddlm_jax.
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
