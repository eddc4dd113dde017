"""Flax NNX modules: transformer backbone and building blocks.

`backbones` is the registry of the networks a run can train by name.
"""

from ddlm_jax.models.backbones import (
  get_backbone,
  register_backbone,
  registered_backbones,
)
from ddlm_jax.models.transformer import Transformer, TransformerConfig

__all__ = [
  'Transformer',
  'TransformerConfig',
  'get_backbone',
  'register_backbone',
  'registered_backbones',
]
