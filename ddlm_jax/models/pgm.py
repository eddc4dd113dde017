"""The partition network of PGM (backbone 'pgm'): masked modelling without
mask tokens.

Partition Generative Modeling (Deschenaux, Tran and Gulcehre, arXiv
2505.18883) splits a sequence into two groups and predicts every token
from the other group. The network has three parts, and no part ever reads
a mask token or a time:

- the encoder: transformer blocks over the token embeddings whose
  self-attention stays within a group (`MaskSpec.segments` on the group
  ids), so a position's encoder output is a function of its own group's
  tokens and positions only;
- the group swap (`GroupSwap`): one query per position built from the
  position alone (a learned bias plus a projection of sinusoidal features
  of the position index; no token enters), the start of the decoder's
  residual stream;
- the decoder: blocks whose mixer is cross-attention from the queries to
  the encoder outputs of the OTHER group (and to a learned sink key that
  every query sees, so a query whose other group is empty, as at the
  first sampling step, attends to something defined), then an MLP. The
  decoder has no self-attention: a query's output does not depend on
  which other queries are asked, so the sampler can ask only the next
  few positions and get what training optimised.

Positions enter through rotary embeddings (queries at their own position,
keys at theirs) and the group swap's features; both take per-row
positions, so the sampler runs the encoder on the clean tokens in a
random order, gathered, at their true positions.

Entry points: `encode(tokens, positions, segment)` (encoder outputs),
`decode(memory, key_positions, key_groups, query_positions,
query_groups)` (logits at the queries), `partition_logits(tokens,
groups)` (the training pass: both at every position), and `__call__(z,
t)`, the training pass with the fixed split into even and odd positions:
the one-call view that generic tools (the FLOP count, parameter
summaries) use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.errors import ConfigError
from ddlm_jax.models import layers
from ddlm_jax.models.attention import (
  ATTENTION_IMPLS,
  AttentionContext,
  attend,
  rotary,
)
from ddlm_jax.models.backbones import register_backbone
from ddlm_jax.models.layers import MLP, Dense, RMSNorm, param
from ddlm_jax.models.transformer import (
  DTYPES,
  ONE_HOT_EMBED_MAX_VOCAB,
  Block,
  TransformerConfig,
)

NAME = 'pgm'
# Keys every run's model block has and this backbone reads or accepts.
RUN_KEYS = ('backbone', 'time_conditioning', 'attention_impl')
DEFAULTS = {
  'width': 128,
  'depth': 4,  # encoder + decoder blocks
  'decoder_depth': 2,
  'num_heads': 4,
  'mlp_dim': 0,
  'mlp_kind': 'swiglu',
  'rope_theta': 10_000.0,
  'dtype': 'float32',
  'remat': False,
}
# Group id of the sink key in the decoder's group mask (groups are 0, 1).
SINK_GROUP = 2


@dataclasses.dataclass(frozen=True)
class PGMConfig:
  """Shape of the partition network (module docstring).

  depth counts encoder plus decoder blocks, so a PGM and a transformer of
  the same depth and width have nearly the same parameters (a
  cross-attention block has the Q/K/V/O and MLP weights of a
  self-attention block).
  """

  vocab_size: int
  width: int = 128
  depth: int = 4
  decoder_depth: int = 2
  num_heads: int = 4
  mlp_dim: int = 0
  mlp_kind: str = 'swiglu'
  rope_theta: float = 10_000.0
  attention_impl: str = 'xla'
  dtype: str = 'float32'
  remat: bool = False  # Rematerialise each block in the backward pass.

  def __post_init__(self):
    for name in ('vocab_size', 'width', 'depth', 'num_heads'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'model.{name} must be an int >= 1, got {value!r}.')
    if not 1 <= self.decoder_depth < self.depth:
      raise ConfigError(
        f'model.decoder_depth={self.decoder_depth} with model.depth='
        f'{self.depth}: the network needs at least one encoder and one '
        'decoder block; choose 1 <= decoder_depth < depth.'
      )
    if self.width % self.num_heads or (self.width // self.num_heads) % 2:
      raise ConfigError(
        f'model.width={self.width} is not divisible by model.num_heads='
        f'{self.num_heads} into an even head size (rotary embeddings '
        'rotate pairs); change one of them.'
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ConfigError(
        f'model.attention_impl={self.attention_impl!r}; choose one of '
        f'{ATTENTION_IMPLS}.'
      )
    if self.dtype not in DTYPES:
      raise ConfigError(
        f'model.dtype={self.dtype!r}; choose one of {list(DTYPES)}.'
      )

  @property
  def encoder_depth(self) -> int:
    return self.depth - self.decoder_depth

  @property
  def input_vocab_size(self) -> int:
    """The V data tokens: there is no mask token to embed."""
    return self.vocab_size

  def block_config(self) -> TransformerConfig:
    """The transformer settings an encoder block is built from."""
    return TransformerConfig(
      vocab_size=self.vocab_size,
      input_vocab_size=self.vocab_size,
      width=self.width,
      depth=self.encoder_depth,
      num_heads=self.num_heads,
      mlp_dim=self.mlp_dim,
      mlp_kind=self.mlp_kind,
      rope_theta=self.rope_theta,
      attention_impl=self.attention_impl,
      dtype=self.dtype,
    )

  @property
  def hidden_dim(self) -> int:
    return self.block_config().hidden_dim


def position_features(positions: jax.Array, dim: int) -> jax.Array:
  """Sinusoidal features [..., dim] of integer positions (no tokens)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(half) / half)
  angles = jnp.asarray(positions, jnp.float32)[..., None] * freqs
  return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def other_group_mask(query_groups_BxN, key_groups_BxS):
  """The decoder's mask: a query of group g sees keys of group 1 - g and
  the sink (the last key, group SINK_GROUP); padding (group < 0) sees and
  is seen by nothing but the sink."""
  import pallas_kernels  # Lazily, as attention.attend does.

  batch = query_groups_BxN.shape[0]
  sink_Bx1 = jnp.full((batch, 1), SINK_GROUP, jnp.int32)
  keys_BxS1 = jnp.concatenate([key_groups_BxS.astype(jnp.int32), sink_Bx1], 1)
  visible_GxG = np.array([[0, 1, 1], [1, 0, 1], [0, 0, 1]], bool)
  visible_BxGxG = jnp.broadcast_to(jnp.asarray(visible_GxG), (batch, 3, 3))
  queries = jnp.where(query_groups_BxN < 0, SINK_GROUP, query_groups_BxN)
  return pallas_kernels.MaskSpec.groups(
    queries.astype(jnp.int32), visible_BxGxG, keys_BxS1
  )


@dataclasses.dataclass(frozen=True)
class CrossContext:
  """What a decoder block's cross-attention reads besides its queries."""

  memory_BxSxD: jax.Array  # noqa: N815
  key_positions_BxS: jax.Array  # noqa: N815
  query_positions_BxN: jax.Array  # noqa: N815
  mask: Any  # a pallas_kernels.MaskSpec over S + 1 keys (the sink last)


class CrossAttention(nnx.Module):
  """Queries from the decoder stream, keys and values from the encoder
  outputs plus one learned sink; rotary at each side's own positions."""

  def __init__(self, cfg: PGMConfig, *, rngs: nnx.Rngs):
    dtype = DTYPES[cfg.dtype]
    heads, head_dim = cfg.num_heads, cfg.width // cfg.num_heads
    dense = lambda i, o, ia, oa: Dense(i, o, ia, oa, rngs=rngs, dtype=dtype)
    self.query = dense(
      (cfg.width,), (heads, head_dim), ('embed',), ('heads', 'head_dim')
    )
    self.kv = dense(
      (cfg.width,),
      (2, heads, head_dim),
      ('embed',),
      ('qkv', 'heads', 'head_dim'),
    )
    self.out = dense(
      (heads, head_dim), (cfg.width,), ('heads', 'head_dim'), ('embed',)
    )
    self.sink = param(
      rngs, nnx.initializers.normal(1.0), (cfg.width,), ('embed',)
    )
    self.impl, self.rope_theta = cfg.attention_impl, cfg.rope_theta

  def __call__(self, h_BxNxD: jax.Array, ctx: CrossContext) -> jax.Array:
    q_BxHxNxK = jnp.transpose(self.query(h_BxNxD), (0, 2, 1, 3))
    q_BxHxNxK = rotary(q_BxHxNxK, self.rope_theta, ctx.query_positions_BxN)
    kv_2xBxHxSxK = jnp.transpose(self.kv(ctx.memory_BxSxD), (2, 0, 3, 1, 4))
    k = rotary(kv_2xBxHxSxK[0], self.rope_theta, ctx.key_positions_BxS)
    v = kv_2xBxHxSxK[1]
    sink_2xHxK = self.kv(self.sink[...].astype(h_BxNxD.dtype))
    batch = h_BxNxD.shape[0]
    sink = lambda a_HxK: jnp.broadcast_to(
      a_HxK[None, :, None, :].astype(k.dtype), (batch,) + a_HxK.shape[:1]
      + (1,) + a_HxK.shape[1:]
    )  # fmt: skip
    k = jnp.concatenate([k, sink(sink_2xHxK[0])], axis=2)
    v = jnp.concatenate([v, sink(sink_2xHxK[1])], axis=2)
    o_BxHxNxK = attend(q_BxHxNxK, k, v, causal=False, impl=self.impl,
                       mask=ctx.mask)  # fmt: skip
    return self.out(jnp.transpose(o_BxHxNxK, (0, 2, 1, 3)))


class DecoderBlock(layers.Block):
  """Pre-norm residual block with cross-attention as its mixer; the
  mixer's argument is the block's `CrossContext`."""

  def __init__(self, cfg: PGMConfig, *, rngs: nnx.Rngs):
    dtype = DTYPES[cfg.dtype]
    super().__init__(
      cfg.width,
      lambda r: CrossAttention(cfg, rngs=r),
      lambda r: MLP(
        cfg.width, cfg.hidden_dim, cfg.mlp_kind, rngs=r, dtype=dtype
      ),
      rngs=rngs,
      mixer_name='cross',
    )


class GroupSwap(nnx.Module):
  """Position-only queries: bias + W features(position), [B, N, D]."""

  def __init__(self, cfg: PGMConfig, *, rngs: nnx.Rngs):
    self.bias = param(
      rngs, nnx.initializers.normal(1.0), (cfg.width,), ('embed',)
    )
    self.position = Dense(
      (cfg.width,), (cfg.width,), ('embed',), ('embed',), rngs=rngs
    )
    self.dtype = DTYPES[cfg.dtype]

  def __call__(self, positions_BxN: jax.Array) -> jax.Array:
    feats_BxNxD = position_features(positions_BxN, self.bias.shape[0])
    out = self.position(feats_BxNxD) + self.bias[...]
    return out.astype(self.dtype)


class PGM(nnx.Module):
  """The partition network (module docstring)."""

  def __init__(self, cfg: PGMConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedding = param(
      rngs,
      nnx.initializers.normal(stddev=1.0),
      (cfg.vocab_size, cfg.width),
      ('vocab', 'embed'),
    )
    block_cfg = cfg.block_config()
    self.encoder = nnx.List(
      [Block(block_cfg, rngs=rngs) for _ in range(cfg.encoder_depth)]
    )
    self.encoder_norm = RMSNorm(cfg.width, rngs=rngs)
    self.swap = GroupSwap(cfg, rngs=rngs)
    self.decoder = nnx.List(
      [DecoderBlock(cfg, rngs=rngs) for _ in range(cfg.decoder_depth)]
    )
    self.final_norm = RMSNorm(cfg.width, rngs=rngs)
    self.head = Dense(
      (cfg.width,),
      (cfg.vocab_size,),
      ('embed',),
      ('vocab',),
      rngs=rngs,
      init=nnx.initializers.zeros,
    )

  def embed(self, tokens_BxN: jax.Array) -> jax.Array:
    dtype = DTYPES[self.cfg.dtype]
    table_VxD = self.embedding[...].astype(dtype)
    if self.cfg.vocab_size <= ONE_HOT_EMBED_MAX_VOCAB:
      onehot = jax.nn.one_hot(tokens_BxN, table_VxD.shape[0], dtype=dtype)
      return onehot @ table_VxD
    return jnp.take(table_VxD, tokens_BxN, axis=0)

  def encode(
    self,
    tokens_BxN: jax.Array,
    positions_BxN: jax.Array | None,
    segment_BxN: jax.Array,
  ) -> jax.Array:
    """Encoder outputs [B, N, D]: self-attention within equal segment ids.

    positions_BxN: each token's position in the sequence (None: 0..N-1).
    """
    import pallas_kernels  # Lazily, as attention.attend does.

    ctx = AttentionContext(
      mask=pallas_kernels.MaskSpec.segments(segment_BxN.astype(jnp.int32)),
      positions_L=positions_BxN,
    )
    x_BxNxD = self.embed(tokens_BxN.astype(jnp.int32))
    call = self._call_block(ctx)
    for block in self.encoder:
      x_BxNxD = call(block, x_BxNxD)
    return self.encoder_norm(x_BxNxD)

  def _call_block(self, ctx):
    """block(x) with the context closed over (remat traces arrays only)."""
    call = lambda block, x: block(x, None, ctx)
    return layers.remat_call(call) if self.cfg.remat else call

  def decode(
    self,
    memory_BxSxD: jax.Array,
    key_positions_BxS: jax.Array,
    key_groups_BxS: jax.Array,
    query_positions_BxN: jax.Array,
    query_groups_BxN: jax.Array,
  ) -> jax.Array:
    """Logits [B, N, V] at the queries, each reading the encoder outputs
    of the other group (groups 0 / 1; -1 marks padding) and the sink."""
    ctx = CrossContext(
      memory_BxSxD=memory_BxSxD,
      key_positions_BxS=key_positions_BxS,
      query_positions_BxN=query_positions_BxN,
      mask=other_group_mask(query_groups_BxN, key_groups_BxS),
    )
    x_BxNxD = self.swap(query_positions_BxN)
    call = self._call_block(ctx)
    for block in self.decoder:
      x_BxNxD = call(block, x_BxNxD)
    return self.head(self.final_norm(x_BxNxD)).astype(jnp.float32)

  def partition_logits(
    self, tokens_BxL: jax.Array, groups_BxL: jax.Array
  ) -> jax.Array:
    """The training pass: logits [B, L, V] of every position predicted
    from the other group (groups 0 / 1)."""
    batch, length = tokens_BxL.shape
    positions_BxL = jnp.broadcast_to(jnp.arange(length), (batch, length))
    groups_BxL = groups_BxL.astype(jnp.int32)
    memory_BxLxD = self.encode(tokens_BxL, None, groups_BxL)
    return self.decode(
      memory_BxLxD, positions_BxL, groups_BxL, positions_BxL, groups_BxL
    )

  def __call__(self, z_BxL: jax.Array, t_B: jax.Array | None = None):
    """The training pass with groups = position parity (module docstring)."""
    del t_B  # Time-free.
    groups_L = jnp.arange(z_BxL.shape[1]) % 2
    return self.partition_logits(z_BxL, jnp.broadcast_to(groups_L, z_BxL.shape))


def run_model_config(model: Mapping[str, Any], process) -> PGMConfig:
  """The PGMConfig of a run's config.model block."""
  unknown = sorted(set(model) - set(DEFAULTS) - set(RUN_KEYS))
  if unknown:
    raise ConfigError(
      f'config.model has keys the {NAME} backbone does not take: {unknown};'
      f' it takes {sorted(DEFAULTS)} (and {list(RUN_KEYS)}).'
    )
  if process.family != NAME:
    raise ConfigError(
      f"model.backbone='{NAME}' is trained by the partition process; set "
      "--config.process.kind='pgm'."
    )
  if model.get('time_conditioning', False):
    raise ConfigError(
      f"model.backbone='{NAME}' is time-free (the partition shows the "
      'noise level); set --config.model.time_conditioning=False.'
    )
  m = {**DEFAULTS, **{k: v for k, v in model.items() if k in DEFAULTS}}
  return PGMConfig(
    vocab_size=int(process.vocab_size),
    width=int(m['width']),
    depth=int(m['depth']),
    decoder_depth=int(m['decoder_depth']),
    num_heads=int(m['num_heads']),
    mlp_dim=int(m['mlp_dim']),
    mlp_kind=str(m['mlp_kind']),
    rope_theta=float(m['rope_theta']),
    attention_impl=str(model.get('attention_impl', 'xla')),
    dtype=str(m['dtype']),
    remat=bool(m['remat']),
  )


def _build(cfg: PGMConfig, model, rngs) -> PGM:
  del model  # Everything the network needs is in its config.
  return PGM(cfg, rngs=rngs)


register_backbone(NAME, run_model_config, _build)
