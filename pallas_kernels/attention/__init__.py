"""Masked attention (``MaskSpec``) behind one dispatch over its backends.

``attention(..., impl=)`` runs the reference, XLA, cuDNN (GPU), splash
(TPU) or this suite's flash kernels (Pallas: Mosaic on TPU, Triton on GPU);
``supported_impls`` names the impls that can run a mask on a platform and
``auto_impl`` what impl='auto' picks.
"""

from pallas_kernels.attention.api import (
  AUTO_TABLE,
  IMPLS,
  attention,
  auto_impl,
  resolve_attention_impl,
  supported_impls,
)
from pallas_kernels.attention.flash import flash_attention, skipped_fraction
from pallas_kernels.attention.flash_gpu import flash_attention_gpu
from pallas_kernels.attention.library import cudnn_attention, splash_attention
from pallas_kernels.attention.mask import (
  EMPTY,
  FULL,
  PARTIAL,
  MaskSpec,
  static_tile_table,
  tile_table,
)

__all__ = [
  'AUTO_TABLE',
  'EMPTY',
  'FULL',
  'IMPLS',
  'PARTIAL',
  'MaskSpec',
  'attention',
  'auto_impl',
  'cudnn_attention',
  'flash_attention',
  'flash_attention_gpu',
  'resolve_attention_impl',
  'skipped_fraction',
  'splash_attention',
  'static_tile_table',
  'supported_impls',
  'tile_table',
]
