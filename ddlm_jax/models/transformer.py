"""Transformer backbone shared by masked diffusion and the AR twin.

Pre-norm blocks (`layers.Block`) with rotary positions, SwiGLU or GELU MLPs,
bidirectional or causal attention, optional adaLN time conditioning, tied or
untied head. The forward pass is split (`embed`, `backbone`, `logits`) so
input layers such as soft-masking can replace the embedding and planners can
read hidden states.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.models import layers
from ddlm_jax.models.attention import ATTENTION_IMPLS, SelfAttention
from ddlm_jax.models.layers import (
  MLP,
  Dense,
  RMSNorm,
  param,
  sinusoidal_embedding,
)

# Vocabularies up to this size embed by one-hot matmul instead of a gather.
ONE_HOT_EMBED_MAX_VOCAB = 512

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Shape and options of the backbone (see field comments)."""

  vocab_size: int  # V: output classes.
  input_vocab_size: int  # V + 1: data tokens plus mask (or BOS).
  width: int = 256
  depth: int = 4
  num_heads: int = 4
  mlp_dim: int = 0  # 0 means 4 * width (GELU) or 8/3 * width (SwiGLU).
  mlp_kind: str = 'swiglu'
  causal: bool = False
  time_conditioning: bool = False
  cond_dim: int = 128
  tied_embeddings: bool = False
  rope_theta: float = 10_000.0
  attention_impl: str = 'xla'
  dtype: str = 'float32'  # Compute dtype; parameters stay float32.
  remat: bool = False  # Rematerialise each block in the backward pass.

  def __post_init__(self):
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f'attention_impl={self.attention_impl!r}; choose one of '
        f'{ATTENTION_IMPLS}.'
      )
    if self.dtype not in DTYPES:
      raise ValueError(f'dtype={self.dtype!r}; choose one of {list(DTYPES)}.')
    if self.input_vocab_size < self.vocab_size:
      raise ValueError('input_vocab_size must be >= vocab_size.')

  @property
  def hidden_dim(self) -> int:
    if self.mlp_dim:
      return self.mlp_dim
    if self.mlp_kind == 'swiglu':
      return 64 * ((8 * self.width // 3 + 63) // 64)
    return 4 * self.width


class Block(layers.Block):
  """`layers.Block` with rotary self-attention (`attn`) and the config's MLP."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    dtype = DTYPES[cfg.dtype]
    super().__init__(
      cfg.width,
      lambda r: SelfAttention(
        cfg.width,
        cfg.num_heads,
        causal=cfg.causal,
        impl=cfg.attention_impl,
        rope_theta=cfg.rope_theta,
        rngs=r,
        dtype=dtype,
      ),
      lambda r: MLP(
        cfg.width, cfg.hidden_dim, cfg.mlp_kind, rngs=r, dtype=dtype
      ),
      rngs=rngs,
      cond_dim=cfg.cond_dim if cfg.time_conditioning else 0,
      mixer_name='attn',
    )


class Transformer(nnx.Module):
  """tokens_BxL (+ t_B) -> logits_BxLxV."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedding = param(
      rngs,
      nnx.initializers.normal(stddev=1.0),
      (cfg.input_vocab_size, cfg.width),
      ('vocab', 'embed'),
    )
    if cfg.time_conditioning:
      self.time_mlp = nnx.List(
        [
          Dense((cfg.cond_dim,), (cfg.cond_dim,), ('cond',), ('cond',),
                rngs=rngs, use_bias=True),
          Dense((cfg.cond_dim,), (cfg.cond_dim,), ('cond',), ('cond',),
                rngs=rngs, use_bias=True),
        ]
      )  # fmt: skip
    else:
      self.time_mlp = None
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.final_norm = RMSNorm(cfg.width, rngs=rngs)
    self.head = (
      None
      if cfg.tied_embeddings
      else Dense(
        (cfg.width,),
        (cfg.vocab_size,),
        ('embed',),
        ('vocab',),
        rngs=rngs,
        init=nnx.initializers.zeros,
      )
    )

  def embed(self, tokens_BxL: jax.Array) -> jax.Array:
    dtype = DTYPES[self.cfg.dtype]
    table_VxD = self.embedding[...].astype(dtype)
    if self.cfg.input_vocab_size <= ONE_HOT_EMBED_MAX_VOCAB:
      # Small vocabularies: a one-hot matmul, whose backward is a matmul
      # instead of a scatter-add (far faster on CPU, cheap in FLOPs).
      onehot = jax.nn.one_hot(tokens_BxL, table_VxD.shape[0], dtype=dtype)
      return onehot @ table_VxD
    return jnp.take(table_VxD, tokens_BxL, axis=0)

  def condition(self, t_B: jax.Array | None) -> jax.Array | None:
    if self.time_mlp is None:
      return None
    if t_B is None:
      raise ValueError('This model is time-conditioned: pass t_B.')
    c_BxC = sinusoidal_embedding(t_B, self.cfg.cond_dim)
    c_BxC = jax.nn.silu(self.time_mlp[0](c_BxC))
    return jax.nn.silu(self.time_mlp[1](c_BxC))

  def backbone(self, x_BxLxD: jax.Array, t_B=None) -> jax.Array:
    """Blocks and final norm over input embeddings: hidden states."""
    c_BxC = self.condition(t_B)
    call = lambda block, x, c: block(x, c)
    if self.cfg.remat:
      call = nnx.remat(call)
    for block in self.blocks:
      x_BxLxD = call(block, x_BxLxD, c_BxC)
    return self.final_norm(x_BxLxD)

  def logits(self, h_BxLxD: jax.Array) -> jax.Array:
    if self.head is None:
      table_VxD = self.embedding[: self.cfg.vocab_size].astype(h_BxLxD.dtype)
      out = jnp.einsum('bld,vd->blv', h_BxLxD, table_VxD)
      out = out * self.cfg.width**-0.5
    else:
      out = self.head(h_BxLxD)
    return out.astype(jnp.float32)

  def __call__(self, tokens_BxL: jax.Array, t_B=None) -> jax.Array:
    return self.logits(self.backbone(self.embed(tokens_BxL), t_B))
