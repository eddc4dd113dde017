"""LLaDA-family and Dream-family transformers (bidirectional LLaMA / Qwen2).

Both published families are decoder stacks run without a causal mask:

- LLaDA (`family='llada'`): LLaMA layout. RMSNorm, SwiGLU, rotary positions
  (rotate-half form), grouped-query attention, no biases, untied head.
- Dream (`family='dream'`): Qwen2 layout, i.e. the same plus biases on the
  Q/K/V projections and rotary base 1e6; and, because Dream was adapted
  from an autoregressive model, its logits are shifted one position: the
  prediction for token i is the network's output at i - 1. Dream's own
  generation code forms `concat(out[:, :1], out[:, :-1])` along the length
  axis (position 0 keeps its own output; the first token of a Dream input
  is never masked), and `LlamaFamily.__call__` returns exactly that when
  `cfg.shift_logits` is set.

The blocks are the suite's `layers.Block` (pre-norm residual, no time
conditioning) with a grouped-query attention mixer written here (separate
Q, K, V projections because the K/V head count differs from the query's)
and the suite's SwiGLU `MLP`. Parameters carry the logical axis names of
the transformer (`vocab`, `embed`, `heads`, `head_dim`, `mlp`); K/V heads
use `heads` too, and a mesh axis that does not divide their count leaves
them replicated (`parallel.rules`).

Call contract: `model(tokens_BxL, t_B=None)` -> float32 logits [B, L, V], the
contract of a time-free `Transformer`, so the suite's masked samplers run
an imported model. Token ids are in the published vocabulary; the suite's
mask id (= V, one past the vocabulary, what `MaskedDiffusion.mask_id` is;
V = `cfg.data_vocab_size` in a run, whose tokenizer may have fewer ids
than the model has rows) is read as the published mask token
`cfg.mask_token_id`, and with `cfg.forbid_mask_output` that token's logit
is pushed to -1e9 so a sampler never draws it as content.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.models import layers
from ddlm_jax.models.attention import (
  ATTENTION_IMPLS,
  attend,
  check_attention_impl,
  rotary,
)
from ddlm_jax.models.layers import MLP, Dense, RMSNorm, param

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
FAMILIES = ('llada', 'dream')
# Logit given to the published mask token when it must not be drawn.
FORBIDDEN_LOGIT = -1e9


@dataclasses.dataclass(frozen=True)
class LlamaFamilyConfig:
  """Shape and options of a LLaDA- or Dream-family model."""

  vocab_size: int  # V: rows of the embedding and columns of the head.
  width: int
  depth: int
  num_heads: int
  num_kv_heads: int
  mlp_dim: int
  family: str = 'llada'
  head_dim: int = 0  # 0 means width // num_heads.
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-5
  qkv_bias: bool = False
  shift_logits: bool = False
  tied_embeddings: bool = False
  mask_token_id: int = -1  # The published mask token; -1: none.
  forbid_mask_output: bool = False
  # > 0: a run's data vocabulary V_data <= vocab_size (its tokenizer's):
  # the logits cover ids < V_data and id V_data reads as the mask token.
  data_vocab_size: int = 0
  attention_impl: str = 'xla'
  dtype: str = 'float32'  # Compute dtype; parameters stay float32.
  remat: bool = False

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f'family={self.family!r}; choose one of {FAMILIES}.')
    if self.dtype not in DTYPES:
      raise ValueError(f'dtype={self.dtype!r}; choose one of {list(DTYPES)}.')
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f'attention_impl={self.attention_impl!r}; choose one of '
        f'{ATTENTION_IMPLS}.'
      )
    check_attention_impl(self.attention_impl)
    for name in ('vocab_size', 'width', 'depth', 'num_heads', 'mlp_dim'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}.')
    if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
      raise ValueError(
        f'num_kv_heads={self.num_kv_heads} must divide num_heads='
        f'{self.num_heads} (grouped-query attention).'
      )
    if not self.head_dim and self.width % self.num_heads:
      raise ValueError(
        f'width {self.width} is not divisible by {self.num_heads} heads; '
        'set head_dim explicitly.'
      )
    if self.head_size % 2:
      raise ValueError(
        f'head size {self.head_size} is odd; rotary positions rotate pairs.'
      )
    if not -1 <= self.mask_token_id < self.vocab_size:
      raise ValueError(
        f'mask_token_id={self.mask_token_id} is outside the vocabulary of '
        f'{self.vocab_size}; use -1 for a model without a mask token.'
      )
    if self.forbid_mask_output and self.mask_token_id < 0:
      raise ValueError('forbid_mask_output needs a mask_token_id >= 0.')
    if not 0 <= self.data_vocab_size <= self.vocab_size:
      raise ValueError(
        f'data_vocab_size={self.data_vocab_size} must lie in [0, '
        f'vocab_size={self.vocab_size}]: the tokenizer has more ids than '
        'the model has embedding rows.'
      )
    if self.data_vocab_size and self.mask_token_id < 0:
      raise ValueError('data_vocab_size needs a mask_token_id >= 0.')

  @property
  def head_size(self) -> int:
    return self.head_dim or self.width // self.num_heads

  @property
  def output_vocab_size(self) -> int:
    """Classes of the logits: the run's data vocabulary, else all."""
    return self.data_vocab_size or self.vocab_size

  @property
  def input_vocab_size(self) -> int:
    """Ids the model reads: the output classes plus the suite's mask id."""
    return self.output_vocab_size + 1


@dataclasses.dataclass(frozen=True)
class RowContext:
  """Per-row inputs of every attention layer, for one call.

  Attributes:
    valid_BxL: bool keys that may be read (False: padding, never content).
    positions_BxL: rotary positions per row (default 0..L-1); a
      left-padded row gives its content positions 0.. so it computes what
      the same row does alone.
  """

  valid_BxL: jax.Array | None = None  # noqa: N815
  positions_BxL: jax.Array | None = None  # noqa: N815


class GroupedQueryAttention(nnx.Module):
  """Bidirectional rotary attention with fewer K/V heads than query heads.

  Query head h reads K/V head h // (H / G), the grouping of `transformers`'
  `repeat_kv`. Optional biases on Q, K, V (Qwen2); never on the output.
  """

  def __init__(self, cfg: LlamaFamilyConfig, *, rngs: nnx.Rngs):
    dtype = DTYPES[cfg.dtype]
    d, k = cfg.width, cfg.head_size
    proj = lambda heads: Dense(
      (d,), (heads, k), ('embed',), ('heads', 'head_dim'), rngs=rngs,
      use_bias=cfg.qkv_bias, dtype=dtype,
    )  # fmt: skip
    self.q = proj(cfg.num_heads)
    self.k = proj(cfg.num_kv_heads)
    self.v = proj(cfg.num_kv_heads)
    self.out = Dense(
      (cfg.num_heads, k),
      (d,),
      ('heads', 'head_dim'),
      ('embed',),
      rngs=rngs,
      dtype=dtype,
    )
    self.groups = cfg.num_heads // cfg.num_kv_heads
    self.rope_theta, self.impl = cfg.rope_theta, cfg.attention_impl

  def __call__(
    self, x_BxLxD: jax.Array, rows: RowContext | None = None
  ) -> jax.Array:
    """`rows` (optional): which keys may be read and per-row positions."""
    rows = RowContext() if rows is None else rows
    valid_BxL, positions = rows.valid_BxL, rows.positions_BxL
    heads_first = lambda y: jnp.transpose(y, (0, 2, 1, 3))
    rope = lambda y: rotary(heads_first(y), self.rope_theta, positions)
    q_BxHxLxK = rope(self.q(x_BxLxD))
    k_BxGxLxK = rope(self.k(x_BxLxD))
    v_BxGxLxK = heads_first(self.v(x_BxLxD))
    k_BxHxLxK = jnp.repeat(k_BxGxLxK, self.groups, axis=1)
    v_BxHxLxK = jnp.repeat(v_BxGxLxK, self.groups, axis=1)
    mask = None
    if valid_BxL is not None:
      import pallas_kernels  # Lazily, as attention.attend does.

      mask = pallas_kernels.MaskSpec.full(valid_BxL.astype(bool))
    o_BxHxLxK = attend(
      q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, causal=False, impl=self.impl, mask=mask
    )
    return self.out(heads_first(o_BxHxLxK))


class LlamaFamilyBlock(layers.Block):
  """`layers.Block` with grouped-query attention (`attn`) and SwiGLU."""

  def __init__(self, cfg: LlamaFamilyConfig, *, rngs: nnx.Rngs):
    dtype = DTYPES[cfg.dtype]
    super().__init__(
      cfg.width,
      lambda r: GroupedQueryAttention(cfg, rngs=r),
      lambda r: MLP(cfg.width, cfg.mlp_dim, 'swiglu', rngs=r, dtype=dtype),
      rngs=rngs,
      mixer_name='attn',
    )
    # layers.Block builds its norms with the default epsilon; the published
    # models each declare their own (1e-5 LLaDA, 1e-6 Qwen2).
    self.norm1.eps = self.norm2.eps = cfg.norm_eps


class LlamaFamily(nnx.Module):
  """tokens_BxL (+ an ignored t_B) -> logits_BxLxV; see the module doc."""

  def __init__(self, cfg: LlamaFamilyConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedding = param(
      rngs,
      nnx.initializers.normal(stddev=0.02),
      (cfg.vocab_size, cfg.width),
      ('vocab', 'embed'),
    )
    self.blocks = nnx.List(
      [LlamaFamilyBlock(cfg, rngs=rngs) for _ in range(cfg.depth)]
    )
    self.final_norm = RMSNorm(cfg.width, rngs=rngs, eps=cfg.norm_eps)
    self.head = (
      None
      if cfg.tied_embeddings
      else Dense(
        (cfg.width,),
        (cfg.vocab_size,),
        ('embed',),
        ('vocab',),
        rngs=rngs,
        dtype=DTYPES[cfg.dtype],
        out_dtype=jnp.float32,
      )
    )

  def embed(self, tokens_BxL: jax.Array) -> jax.Array:
    """Ids (published vocabulary, or the suite's mask id V) to [B, L, D]."""
    cfg = self.cfg
    if cfg.mask_token_id >= 0:
      tokens_BxL = jnp.where(
        tokens_BxL == cfg.output_vocab_size, cfg.mask_token_id, tokens_BxL
      )
    table_VxD = self.embedding[...].astype(DTYPES[cfg.dtype])
    return jnp.take(table_VxD, tokens_BxL, axis=0)

  def backbone(
    self, x_BxLxD: jax.Array, rows: RowContext | None = None
  ) -> jax.Array:
    """Blocks and final norm; `rows` reaches every attention layer (through
    the mixer argument of `layers.Block`, as the transformer's context)."""
    call = lambda block, x: block(x, None, rows)
    if self.cfg.remat:
      call = layers.remat_call(call)
    for block in self.blocks:
      x_BxLxD = call(block, x_BxLxD)
    return self.final_norm(x_BxLxD)

  def logits(self, h_BxLxD: jax.Array) -> jax.Array:
    """The head's raw output (no shift), float32."""
    if self.head is None:
      table_VxD = self.embedding[...].astype(h_BxLxD.dtype)
      return jnp.einsum(
        'bld,vd->blv', h_BxLxD, table_VxD, preferred_element_type=jnp.float32
      )
    return self.head(h_BxLxD).astype(jnp.float32)

  def __call__(
    self,
    tokens_BxL: jax.Array,
    t_B=None,
    *,
    valid_BxL: jax.Array | None = None,
    positions_BxL: jax.Array | None = None,
  ) -> jax.Array:
    """Logits [B, L, V] predicting the token at each position.

    `t_B` is accepted and ignored (the published models are time-free).
    `valid_BxL` (optional, bool) marks the keys every query may attend to:
    padding set False is never read as content. `positions_BxL` (optional)
    are rotary positions per row, e.g. cumsum(valid) - 1 for left padding,
    as Dream's generation code does. With `cfg.shift_logits` (Dream)
    position i gets the network's output at i - 1 and position 0 its own.
    """
    del t_B
    rows = None
    if valid_BxL is not None or positions_BxL is not None:
      valid_BxL = None if valid_BxL is None else jnp.asarray(valid_BxL)
      rows = RowContext(valid_BxL, positions_BxL)
    out_BxLxV = self.logits(self.backbone(self.embed(tokens_BxL), rows))
    if self.cfg.shift_logits:
      out_BxLxV = jnp.concatenate([out_BxLxV[:, :1], out_BxLxV[:, :-1]], 1)
    if self.cfg.forbid_mask_output:
      out_BxLxV = out_BxLxV.at[..., self.cfg.mask_token_id].set(FORBIDDEN_LOGIT)
    return out_BxLxV[..., : self.cfg.output_vocab_size]

  def supports_logits_at(self) -> bool:
    """No positional shortcut: samplers call the full pass."""
    return False
