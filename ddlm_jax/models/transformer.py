"""Transformer backbone shared by masked diffusion and the AR twin.

Pre-norm blocks (`layers.Block`) with rotary positions, SwiGLU or GELU MLPs,
bidirectional or causal attention, optional adaLN time conditioning, tied or
untied head. The forward pass is split (`embed`, `backbone`, `logits`) so
input layers such as soft-masking can replace the embedding and planners can
read hidden states. `logits_at` gives a plain pass's logits at chosen
positions only (the last block's queries, MLP and the head shrink to them),
which the cached ancestral sampler uses for the positions a step reveals.

Block diffusion (BD3-LM, `block_size > 0`): the input is concat(z_t, x) of
length 2L, attention uses `MaskSpec.block_diffusion` and both halves share
the rotary positions 0..L-1, so one pass gives every block's denoiser
conditioned on the clean blocks before it. For sampling, `init_cache`,
`extend_cache` and `block_logits` run one block at a time against a
key/value cache of the clean blocks (pure functions of the module; `start`
may be traced).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.models import layers
from ddlm_jax.models.attention import (
  ATTENTION_IMPLS,
  AttentionContext,
  LayerCache,
  SelfAttention,
  check_attention_impl,
)
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

# Key/value cache of a whole model: one LayerCache (keys, values) per block.
KVCache = tuple[LayerCache, ...]


def check_block_size(block_size, seq_len: int) -> None:
  """Raises ValueError unless block_size is an int in [1, seq_len] dividing
  seq_len (the length of one half of concat(z_t, x))."""
  if isinstance(block_size, bool) or not isinstance(block_size, int):
    raise ValueError(
      f'block_size must be a static Python int, got {block_size!r}.'
    )
  if block_size < 1:
    raise ValueError(f'block_size must be >= 1, got {block_size}.')
  if block_size > seq_len or seq_len % block_size:
    raise ValueError(
      f'block_size={block_size} does not divide the sequence length '
      f'{seq_len}; choose a block size that divides the length.'
    )


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
  # > 0: block diffusion with blocks of this many tokens; inputs are
  # concat(z_t, x) of length 2L (see the module docstring).
  block_size: int = 0

  def __post_init__(self):
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f'attention_impl={self.attention_impl!r}; choose one of '
        f'{ATTENTION_IMPLS}.'
      )
    check_attention_impl(
      self.attention_impl, ('block_diffusion',) if self.block_size else ()
    )
    if self.dtype not in DTYPES:
      raise ValueError(f'dtype={self.dtype!r}; choose one of {list(DTYPES)}.')
    if self.input_vocab_size < self.vocab_size:
      raise ValueError('input_vocab_size must be >= vocab_size.')
    if not isinstance(self.block_size, int) or self.block_size < 0:
      raise ValueError(
        f'block_size={self.block_size!r}; use 0 (no block diffusion) or '
        'the block length, an int >= 1.'
      )
    if self.block_size and self.causal:
      raise ValueError(
        'block_size > 0 (block diffusion) needs causal=False: its own mask '
        'replaces the causal one.'
      )

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

  def cached(
    self, x_BxNxD: jax.Array, c_BxC, cache: LayerCache, start, visible=None
  ) -> tuple[jax.Array, LayerCache]:
    """The block on N inputs at start.. against its attention's cache.

    Same residual arithmetic as `layers.Block.__call__` with the attention
    replaced by `SelfAttention.cached` (which also returns the cache);
    tests/test_block_diffusion.py checks it against the full 2L pass.
    """
    mix = lambda h: self.attn.cached(h, cache, start, visible)
    return self.residual(x_BxNxD, c_BxC, mix)

  def _mix_at(self, h_BxLxD: jax.Array, idx_BxN: jax.Array) -> jax.Array:
    """Attention with queries only at the N positions."""
    return self.attn.at(h_BxLxD, idx_BxN)

  def from_tokens(self, tokens_BxL: jax.Array, table_VxD: jax.Array):
    """A time-free block applied to the embeddings table_VxD[tokens_BxL].

    The input norm and the Q/K/V projection act on each position alone, so
    they run on the V rows of the table and are gathered, instead of on
    all B * L positions (worth it when V < B * L): the first block of a
    sampling pass, whose inputs are token embeddings.
    """
    if self.modulation is not None:
      raise ValueError('from_tokens needs a time-free block.')
    qkv_VxTxHxK = self.attn.qkv(self.norm1(table_VxD))
    qkv_BxLxTxHxK = jnp.take(qkv_VxTxHxK, tokens_BxL, axis=0)
    # The residual's own norm1(x) is unused here, and compiled away.
    mix = lambda _: (self.attn.from_projection(qkv_BxLxTxHxK), None)
    x_BxLxD = jnp.take(table_VxD, tokens_BxL, axis=0)
    return self.residual(x_BxLxD, None, mix)[0]


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
    """Token ids [B, L], or soft inputs [B, L, V_in] (rows on the simplex,
    e.g. Duo's tempered-softmax latent), to embeddings [B, L, D]."""
    dtype = DTYPES[self.cfg.dtype]
    table_VxD = self.embedding[...].astype(dtype)
    if tokens_BxL.ndim == 3:
      if tokens_BxL.shape[-1] != table_VxD.shape[0]:
        raise ValueError(
          f'soft inputs have {tokens_BxL.shape[-1]} classes; the embedding '
          f'has {table_VxD.shape[0]} rows.'
        )
      return tokens_BxL.astype(dtype) @ table_VxD
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

  def backbone(
    self,
    x_BxLxD: jax.Array,
    t_B=None,
    *,
    ctx: AttentionContext | None = None,
  ) -> jax.Array:
    """Blocks and final norm over input embeddings: hidden states.

    `ctx` (a static attention mask and rotary positions, see
    `block_diffusion_context`) reaches every attention layer; the backbone
    must then be attention-only.
    """
    c_BxC = self.condition(t_B)
    call = lambda block, x, c: block(x, c, ctx)
    if self.cfg.remat:
      call = layers.remat_call(call)
    for block in self.blocks:
      x_BxLxD = call(block, x_BxLxD, c_BxC)
    return self.final_norm(x_BxLxD)

  def _check_attention_only(self):
    if not all(isinstance(block, Block) for block in self.blocks):
      raise ValueError(
        'block diffusion needs an attention-only backbone: a state-space '
        'layer would mix the clean half into the noisy one. Use '
        "model.backbone='transformer'."
      )
    if self.cfg.causal:
      raise ValueError('block diffusion needs a model built with causal=False.')

  def block_diffusion_context(
    self, total_len: int, block_size: int
  ) -> AttentionContext:
    """Mask and rotary positions of concat(z_t, x), total_len = 2L."""
    import pallas_kernels  # Lazily, as attention.attend does.

    self._check_attention_only()
    if total_len % 2:
      raise ValueError(
        f'block diffusion takes concat(z_t, x) of even length 2L; got '
        f'{total_len} tokens.'
      )
    seq_len = total_len // 2
    check_block_size(block_size, seq_len)
    return AttentionContext(
      mask=pallas_kernels.MaskSpec.block_diffusion(block_size, seq_len),
      positions_L=np.arange(total_len) % seq_len,
    )

  def logits(self, h_BxLxD: jax.Array) -> jax.Array:
    if self.head is None:
      table_VxD = self.embedding[: self.cfg.vocab_size].astype(h_BxLxD.dtype)
      out = jnp.einsum(
        'bld,vd->blv', h_BxLxD, table_VxD, preferred_element_type=jnp.float32
      )
      out = out * self.cfg.width**-0.5
    else:
      out = self.head(h_BxLxD)
    return out.astype(jnp.float32)

  def __call__(
    self, tokens_BxL: jax.Array, t_B=None, *, block_size: int | None = None
  ) -> jax.Array:
    """Logits [B, L, V]; with block diffusion L = 2L' over concat(z_t, x).

    `block_size` (a static int) overrides cfg.block_size for this call, so
    one network can train on several block sizes; 0 is a plain pass.
    """
    size = self.cfg.block_size if block_size is None else block_size
    if size == 0:
      return self.logits(self.backbone(self.embed(tokens_BxL), t_B))
    ctx = self.block_diffusion_context(tokens_BxL.shape[1], size)
    return self.logits(self.backbone(self.embed(tokens_BxL), t_B, ctx=ctx))

  def supports_logits_at(self) -> bool:
    """Whether `logits_at` applies: a bidirectional plain (not BD3) model."""
    return not (self.cfg.block_size or self.cfg.causal)

  def logits_at(
    self, tokens_BxL: jax.Array, t_B, idx_BxN: jax.Array
  ) -> jax.Array:
    """The logits of a plain pass at N positions per row, [B, N, V].

    Only the last block's queries, MLP, final norm and head shrink to the N
    positions; every earlier block runs on all L (their outputs are the
    last block's keys and values). A time-free first block gets its input
    norm and Q/K/V per token (`Block.from_tokens`). Samplers that know
    which positions they will read (the ancestral reveal set) call this
    instead of __call__.
    """
    if not self.supports_logits_at():
      raise ValueError(
        'logits_at is for bidirectional plain passes (block_size = 0, '
        'causal=False).'
      )
    c_BxC = self.condition(t_B)
    blocks = list(self.blocks[:-1])
    if (
      c_BxC is None
      and tokens_BxL.ndim == 2
      and blocks
      and isinstance(blocks[0], Block)
      and self.cfg.input_vocab_size < tokens_BxL.size
    ):
      table_VxD = self.embedding[...].astype(DTYPES[self.cfg.dtype])
      x_BxLxD = blocks.pop(0).from_tokens(tokens_BxL, table_VxD)
    else:
      x_BxLxD = self.embed(tokens_BxL)
    for block in blocks:
      x_BxLxD = block(x_BxLxD, c_BxC)
    x_BxNxD = self.blocks[-1].at(x_BxLxD, c_BxC, idx_BxN)
    return self.logits(self.final_norm(x_BxNxD))

  # ------------------------------------------------- block-diffusion cache --

  def init_cache(self, batch: int, max_len: int) -> KVCache:
    """Zero keys/values [B, H, max_len, K] per layer, in the compute dtype.

    max_len may exceed the training length (rotary extrapolates).
    """
    self._check_attention_only()
    heads = self.cfg.num_heads
    shape = (batch, heads, max_len, self.cfg.width // heads)
    zeros = jnp.zeros(shape, DTYPES[self.cfg.dtype])
    return tuple((zeros, zeros) for _ in self.blocks)

  def _cached(self, tokens_BxN, cache: KVCache, start, t_B, visible=None):
    """Hidden states of a block at start.. and the cache with its K/V."""
    self._check_attention_only()
    if len(cache) != len(self.blocks):
      raise ValueError(
        f'cache has {len(cache)} layers, the model {len(self.blocks)}; '
        'build it with model.init_cache.'
      )
    n, max_len = tokens_BxN.shape[1], cache[0][0].shape[2]
    if isinstance(start, int) and not 0 <= start <= max_len - n:
      raise ValueError(
        f'a block of {n} tokens at start={start} does not fit the cache of '
        f'max_len={max_len}; build a longer cache with init_cache.'
      )
    x_BxNxD = self.embed(tokens_BxN)
    c_BxC = self.condition(t_B)
    new = []
    for block, layer_cache in zip(self.blocks, cache):
      x_BxNxD, layer_cache = block.cached(
        x_BxNxD, c_BxC, layer_cache, start, visible
      )
      new.append(layer_cache)
    return self.final_norm(x_BxNxD), tuple(new)

  def block_logits(
    self, z_BxN: jax.Array, cache: KVCache, start, t_B=None
  ) -> jax.Array:
    """Logits [B, N, V] of a (noisy) block at positions start..start+N-1.

    It attends to the cached clean positions < start and to itself,
    bidirectionally; the cache is not changed.
    """
    h_BxNxD, _ = self._cached(z_BxN, cache, start, t_B)
    return self.logits(h_BxNxD)

  def extend_cache(
    self, x_BxN: jax.Array, cache: KVCache, start, t_B=None
  ) -> KVCache:
    """The cache with a clean block's keys/values written at start...

    The block attends to the cache before `start` and to itself, as a clean
    block does in the 2L training pass (block-causal).
    """
    return self._cached(x_BxN, cache, start, t_B)[1]

  # ------------------------------------- approximate caches (plain models) --

  def kv_pass(self, tokens_BxL: jax.Array, t_B=None):
    """A plain bidirectional pass that also returns every layer's keys and
    values: (logits [B, L, V], KVCache of length L).

    The refresh of the approximate prefix and dual caches
    (sampling.approx_cache); the logits are those of __call__.
    """
    self._check_plain()
    batch, length = tokens_BxL.shape
    h_BxLxD, cache = self._cached(
      tokens_BxL, self.init_cache(batch, length), 0, t_B
    )
    return self.logits(h_BxLxD), cache

  def window_logits(
    self, z_BxN: jax.Array, cache: KVCache, start, t_B=None
  ) -> jax.Array:
    """Logits [B, N, V] of positions start..start+N-1 of a plain model,
    attending to their own fresh keys/values and to the cached ones of
    every other position (before and after the window).

    Exact when the cache holds the current keys/values of the other
    positions; after those positions change it is the approximation of
    Fast-dLLM's prefix (window = everything from start) and dual caches.
    """
    self._check_plain()
    max_len = cache[0][0].shape[2]
    h_BxNxD, _ = self._cached(z_BxN, cache, start, t_B, visible=max_len)
    return self.logits(h_BxNxD)

  def _check_plain(self):
    if self.cfg.causal or not all(isinstance(b, Block) for b in self.blocks):
      raise ValueError(
        'approximate KV caches need a bidirectional attention-only model; '
        'this one is causal or has state-space layers (use the threshold '
        'sampler, which needs no cache).'
      )
    if self.cfg.block_size:
      raise ValueError(
        'approximate caches are for plain bidirectional models; a block-'
        "diffusion model has its exact block cache (sampler 'block')."
      )
