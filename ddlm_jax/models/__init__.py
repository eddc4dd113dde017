"""Flax NNX modules: transformer backbone and building blocks."""

from ddlm_jax.models.transformer import Transformer, TransformerConfig

__all__ = ['Transformer', 'TransformerConfig']
