"""Flash attention with described masks (``MaskSpec``) and a reference."""

from pallas_kernels.attention.api import attention
from pallas_kernels.attention.flash import flash_attention, skipped_fraction
from pallas_kernels.attention.mask import (
  EMPTY,
  FULL,
  PARTIAL,
  MaskSpec,
  static_tile_table,
  tile_table,
)

__all__ = [
  'EMPTY',
  'FULL',
  'PARTIAL',
  'MaskSpec',
  'attention',
  'flash_attention',
  'skipped_fraction',
  'static_tile_table',
  'tile_table',
]
