"""Linear (diagonal) and PD-SSM scans with reference, XLA and Pallas paths."""

from pallas_kernels.scan.linear import linear_combine, linear_scan
from pallas_kernels.scan.pd import (
  pd_apply,
  pd_apply_transpose,
  pd_combine,
  pd_identity,
  pd_scan,
)

__all__ = [
  'linear_combine',
  'linear_scan',
  'pd_apply',
  'pd_apply_transpose',
  'pd_combine',
  'pd_identity',
  'pd_scan',
]
