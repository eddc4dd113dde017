"""DiffusionGemma text model: a causal encoder and a canvas decoder, one set
of weights.

The layers are Gemma-4 text layers. Each is either a sliding-window or a
full-attention layer (`layer_types`); full layers have their own head width
(`global_head_dim`) and key/value head count (`num_global_kv_heads`), use
their keys as values (no value projection), and their own rotary settings
(the 'proportional' rotary rotates only a `partial_rotary_factor` share of
the frequency pairs and leaves the rest unrotated). Queries and keys are
RMS-normalised per head (with a learned scale) and values without one;
attention is unscaled (the norms set the logit scale). Every layer has both
a dense gated-GELU MLP and a top-k mixture of experts, each with its own
norms, summed and normalised before the residual add; the layer output is
multiplied by a fixed per-layer scalar. Logits use the tied embedding and a
tanh soft cap.

Block diffusion splits the work in two passes over the same layers:

- `encode` runs causally over new clean tokens (the prompt, then each
  finished canvas) and writes their keys and values into a fixed-capacity
  cache (`KVCache`); sliding layers see the last `sliding_window` tokens,
  the query's own included.
- `decode` runs bidirectionally over a canvas of noisy tokens, reading the
  cache without writing it: full layers see the whole prefix, sliding layers
  its last `sliding_window - 1` tokens, and every canvas token sees the
  whole canvas.

The decoder input is the canvas embedding plus a self-conditioning signal:
the previous step's logits turned into a soft embedding (softmax times the
embedding table), through a small gated MLP, summed and normalised. With no
previous logits the signal is zero. The per-layer scalars are buffers, not
parameters, and the encoder and decoder keep their own.

Text only: a config asking for the vision tower is refused.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.errors import ConfigError
from ddlm_jax.models.layers import Dense, param
from ddlm_jax.models.moe import Experts, TopKRouter, gelu_tanh, rms_normalize

SLIDING, FULL = 'sliding_attention', 'full_attention'
ROPE_TYPES = ('default', 'proportional')


@dataclasses.dataclass(frozen=True)
class RopeSpec:
  """One layer type's rotary settings (the reference's rope_parameters)."""

  rope_type: str = 'default'
  theta: float = 10_000.0
  partial_rotary_factor: float = 1.0
  factor: float = 1.0


@dataclasses.dataclass(frozen=True)
class DiffusionGemmaConfig:
  """Shape and options of the text model (names follow the reference)."""

  vocab_size: int = 256
  hidden_size: int = 64
  intermediate_size: int = 128
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  layer_types: tuple[str, ...] = (SLIDING, FULL)
  sliding_window: int = 16
  global_head_dim: int = 32
  num_global_kv_heads: int | None = None  # None: num_kv_heads.
  sliding_rope: RopeSpec = RopeSpec('default', 10_000.0)
  full_rope: RopeSpec = RopeSpec('proportional', 1_000_000.0, 0.25)
  num_experts: int = 4
  top_k_experts: int = 2
  moe_intermediate_size: int = 32
  rms_norm_eps: float = 1e-6
  final_logit_softcap: float | None = 30.0
  canvas_length: int = 16
  pad_id: int = 0
  eos_id: int = 1
  bos_id: int = 2
  vision: bool = False
  dtype: str = 'float32'

  def __post_init__(self):
    if self.vision:
      raise ConfigError(
        'DiffusionGemma here is text only; set vision=False (drop the '
        'vision tower).'
      )
    bad = [t for t in self.layer_types if t not in (SLIDING, FULL)]
    if bad or not self.layer_types:
      raise ConfigError(
        f'layer_types={self.layer_types!r}; use a non-empty sequence of '
        f'{SLIDING!r} and {FULL!r}.'
      )
    if self.dtype not in ('float32', 'bfloat16'):
      raise ConfigError(f"dtype={self.dtype!r}; use 'float32' or 'bfloat16'.")
    for name, spec, head_dim in (
      ('sliding_rope', self.sliding_rope, self.head_dim),
      ('full_rope', self.full_rope, self.global_head_dim),
    ):
      if spec.rope_type not in ROPE_TYPES:
        raise ConfigError(
          f'{name}.rope_type={spec.rope_type!r}; use one of {ROPE_TYPES}.'
        )
      if spec.rope_type == 'default' and (
        int(head_dim * spec.partial_rotary_factor) != head_dim
      ):
        raise ConfigError(
          f'{name}: default rotary with partial_rotary_factor='
          f"{spec.partial_rotary_factor}; use rope_type='proportional' for "
          'partial rotation.'
        )
    for heads, what in (
      (self.num_kv_heads, 'num_kv_heads'),
      (self.global_kv_heads, 'num_global_kv_heads'),
    ):
      if heads < 1 or self.num_heads % heads:
        raise ConfigError(
          f'{what}={heads} does not divide num_heads={self.num_heads}; '
          'choose a divisor.'
        )
    if self.sliding_window < 1:
      raise ConfigError(
        f'sliding_window={self.sliding_window}; use a window >= 1.'
      )

  @property
  def num_layers(self) -> int:
    return len(self.layer_types)

  @property
  def global_kv_heads(self) -> int:
    if self.num_global_kv_heads is None:
      return self.num_kv_heads
    return self.num_global_kv_heads

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  def layer_shape(self, layer_type: str) -> tuple[int, int]:
    """(head width, key/value heads) of a layer type."""
    if layer_type == FULL:
      return self.global_head_dim, self.global_kv_heads
    return self.head_dim, self.num_kv_heads

  def rope(self, layer_type: str) -> RopeSpec:
    return self.full_rope if layer_type == FULL else self.sliding_rope


def inverse_frequencies(spec: RopeSpec, head_dim: int) -> np.ndarray:
  """The head_dim // 2 rotary frequencies of a layer type (float32).

  'proportional' keeps the exponent's denominator at the full head width
  and zeroes the frequencies past the rotated share, so those pairs keep
  cos = 1, sin = 0.
  """
  theta = np.float32(spec.theta)
  if spec.rope_type == 'default':
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / theta**exps).astype(np.float32)
  angles = int(spec.partial_rotary_factor * head_dim // 2)
  exps = np.arange(0, 2 * angles, 2, dtype=np.float32) / np.float32(head_dim)
  inv = np.zeros(head_dim // 2, np.float32)
  inv[:angles] = 1.0 / theta**exps
  return (inv / np.float32(spec.factor)).astype(np.float32)


def rotate(x_BxLxHxK: jax.Array, cos_LxK, sin_LxK) -> jax.Array:
  """Rotate-half rotary on axis -1, in x's dtype (as the reference does)."""
  half = x_BxLxHxK.shape[-1] // 2
  cos = cos_LxK[:, None, :].astype(x_BxLxHxK.dtype)
  sin = sin_LxK[:, None, :].astype(x_BxLxHxK.dtype)
  x1, x2 = x_BxLxHxK[..., :half], x_BxLxHxK[..., half:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x_BxLxHxK * cos + rotated * sin


def rotary_tables(positions_L: jax.Array, inv_freq):
  """(cos, sin), each [L, head_dim], at float32 positions."""
  inv_F = jnp.asarray(np.asarray(inv_freq, np.float32))
  freqs_LxF = positions_L.astype(jnp.float32)[:, None] * inv_F
  emb_LxK = jnp.concatenate([freqs_LxF, freqs_LxF], axis=-1)
  return jnp.cos(emb_LxK), jnp.sin(emb_LxK)


class Buffer(nnx.Variable):
  """A fixed, untrained value stored with the model (a layer scalar)."""


class Norm(nnx.Module):
  """RMS norm in float32, with or without a learned (multiplied) scale."""

  def __init__(
    self, dim: int, axis: str, *, rngs: nnx.Rngs, eps: float, dtype,
    with_scale: bool = True,
  ):  # fmt: skip
    self.eps = eps
    self.scale = (
      param(rngs, nnx.initializers.ones, (dim,), (axis,), dtype)
      if with_scale
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.scale is None:
      return rms_normalize(x, self.eps)
    x32 = x.astype(jnp.float32)
    mean_sq = jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps
    y = x32 * jax.lax.rsqrt(mean_sq) * self.scale[...].astype(jnp.float32)
    return y.astype(x.dtype)


class GatedMLP(nnx.Module):
  """down(gelu_tanh(gate(x)) * up(x))."""

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs, dtype, std):
    init = nnx.initializers.normal(stddev=std)
    dense = lambda i, o, ia, oa: Dense(
      (i,), (o,), (ia,), (oa,), rngs=rngs, init=init, dtype=dtype,
      param_dtype=dtype,
    )  # fmt: skip
    self.gate = dense(dim, hidden, 'embed', 'mlp')
    self.up = dense(dim, hidden, 'embed', 'mlp')
    self.down = dense(hidden, dim, 'mlp', 'embed')

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    h = gelu_tanh(self.gate(x_BxLxD)) * self.up(x_BxLxD)
    return self.down(h)


class KVCache(NamedTuple):
  """Per-layer keys and values [B, KV, T, K] (keys rotated) and the number
  of filled positions (a scalar int32 array, so it can be traced)."""

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  length: jax.Array


class Attention(nnx.Module):
  """Grouped-query attention of one layer type (see the module docstring)."""

  def __init__(
    self, cfg: DiffusionGemmaConfig, layer_type: str, *, rngs: nnx.Rngs,
    std: float,
  ):  # fmt: skip
    dtype = cfg.jnp_dtype
    self.layer_type = layer_type
    self.head_dim, self.kv_heads = cfg.layer_shape(layer_type)
    self.num_heads = cfg.num_heads
    self.window = cfg.sliding_window if layer_type == SLIDING else None
    # A tuple, not an array: module attributes that are arrays become state.
    self.inv_freq = tuple(
      float(f) for f in inverse_frequencies(cfg.rope(layer_type), self.head_dim)
    )
    init = nnx.initializers.normal(stddev=std)
    D, K = cfg.hidden_size, self.head_dim
    proj = lambda heads: Dense(
      (D,), (heads, K), ('embed',), ('heads', 'head_dim'), rngs=rngs,
      init=init, dtype=dtype, param_dtype=dtype,
    )  # fmt: skip
    self.q = proj(cfg.num_heads)
    self.k = proj(self.kv_heads)
    # Full layers use their (un-normalised) keys as values.
    self.v = proj(self.kv_heads) if layer_type == SLIDING else None
    self.o = Dense(
      (cfg.num_heads, K), (D,), ('heads', 'head_dim'), ('embed',), rngs=rngs,
      init=init, dtype=dtype, param_dtype=dtype,
    )  # fmt: skip
    norm = lambda s: Norm(
      K, 'head_dim', rngs=rngs, eps=cfg.rms_norm_eps, dtype=dtype,
      with_scale=s,
    )  # fmt: skip
    self.q_norm, self.k_norm, self.v_norm = norm(True), norm(True), norm(False)

  def project(self, x_BxLxD: jax.Array, positions_L: jax.Array):
    """Rotated queries [B, L, H, K] and keys, values [B, KV, L, K]."""
    cos, sin = rotary_tables(positions_L, self.inv_freq)
    q = rotate(self.q_norm(self.q(x_BxLxD)), cos, sin)
    k_raw = self.k(x_BxLxD)
    v = self.v(x_BxLxD) if self.v is not None else k_raw
    k = rotate(self.k_norm(k_raw), cos, sin)
    v = self.v_norm(v)
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

  def attend(self, q_BxLxHxK, k_BxGxTxK, v_BxGxTxK, mask_LxT) -> jax.Array:
    """Unscaled softmax attention (float32 softmax), then the output map."""
    B, L, H, K = q_BxLxHxK.shape
    G = self.kv_heads
    q = q_BxLxHxK.reshape(B, L, G, H // G, K)
    scores = jnp.einsum('blgrk,bgtk->bgrlt', q, k_BxGxTxK)
    scores = jnp.where(mask_LxT, scores.astype(jnp.float32), -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxGxTxK.dtype)
    out = jnp.einsum('bgrlt,bgtk->blgrk', probs, v_BxGxTxK)
    return self.o(out.reshape(B, L, H, K))


class Layer(nnx.Module):
  """One Gemma-4 text layer; `mix` is the attention part, supplied by the
  encoder (cache writes) or the decoder (cache reads)."""

  def __init__(self, cfg: DiffusionGemmaConfig, layer_type: str, *, rngs):
    dtype, D, std = cfg.jnp_dtype, cfg.hidden_size, 0.02
    norm = lambda: Norm(
      D, 'embed', rngs=rngs, eps=cfg.rms_norm_eps, dtype=dtype
    )
    self.input_norm = norm()
    self.attn = Attention(cfg, layer_type, rngs=rngs, std=std)
    self.post_attn_norm = norm()
    self.pre_mlp_norm = norm()
    self.mlp = GatedMLP(D, cfg.intermediate_size, rngs=rngs, dtype=dtype,
                        std=std)  # fmt: skip
    self.post_mlp_norm = norm()
    self.router = TopKRouter(
      D, cfg.num_experts, cfg.top_k_experts, rngs=rngs,
      eps=cfg.rms_norm_eps, dtype=dtype,
    )  # fmt: skip
    self.pre_experts_norm = norm()
    self.experts = Experts(
      D, cfg.moe_intermediate_size, cfg.num_experts, rngs=rngs, dtype=dtype,
      init_std=std,
    )  # fmt: skip
    self.post_experts_norm = norm()
    self.post_ff_norm = norm()
    # Scalars of the encoder and decoder passes: [2] (encoder, decoder).
    self.layer_scalar = Buffer(jnp.ones((2,), dtype))

  def __call__(self, x_BxLxD, mix, which: int) -> jax.Array:
    """which: 0 for the encoder pass, 1 for the decoder pass."""
    x = x_BxLxD + self.post_attn_norm(mix(self.input_norm(x_BxLxD)))
    dense = self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
    flat_NxD = x.reshape(-1, x.shape[-1])
    weights, idx = self.router(flat_NxD)
    moe = self.experts(self.pre_experts_norm(flat_NxD), weights, idx)
    moe = self.post_experts_norm(moe.reshape(x.shape))
    x = x + self.post_ff_norm(dense + moe)
    return x * self.layer_scalar[...][which].astype(x.dtype)


class SelfConditioning(nnx.Module):
  """post_norm(embeds + mlp(pre_norm(soft_embeds))); post_norm unscaled."""

  def __init__(self, cfg: DiffusionGemmaConfig, *, rngs: nnx.Rngs):
    dtype = cfg.jnp_dtype
    self.pre_norm = Norm(
      cfg.hidden_size, 'embed', rngs=rngs, eps=cfg.rms_norm_eps, dtype=dtype
    )
    self.mlp = GatedMLP(
      cfg.hidden_size, cfg.intermediate_size, rngs=rngs, dtype=dtype,
      std=0.02,
    )  # fmt: skip
    self.eps = cfg.rms_norm_eps

  def __call__(self, embeds_BxLxD, soft_BxLxD) -> jax.Array:
    signal = self.mlp(self.pre_norm(soft_BxLxD))
    return rms_normalize(embeds_BxLxD + signal, self.eps)


class DiffusionGemma(nnx.Module):
  """The text model: `encode` (causal, writes the cache) and `decode`
  (bidirectional over a canvas, reads it), sharing every weight."""

  def __init__(self, cfg: DiffusionGemmaConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dtype = cfg.jnp_dtype
    self.embed = param(
      rngs, nnx.initializers.normal(stddev=0.02),
      (cfg.vocab_size, cfg.hidden_size), ('vocab', 'embed'), dtype,
    )  # fmt: skip
    self.layers = nnx.List([Layer(cfg, t, rngs=rngs) for t in cfg.layer_types])
    self.final_norm = Norm(
      cfg.hidden_size, 'embed', rngs=rngs, eps=cfg.rms_norm_eps, dtype=dtype
    )
    self.self_conditioning = SelfConditioning(cfg, rngs=rngs)

  # -- shared pieces ---------------------------------------------------------

  def _embed_scale(self):
    # The reference rounds sqrt(width) to the table's dtype first.
    return jnp.asarray(math.sqrt(self.cfg.hidden_size), self.embed.dtype)

  def embed_tokens(self, tokens_BxL: jax.Array) -> jax.Array:
    table = self.embed[...]
    return jnp.take(table, tokens_BxL, axis=0) * self._embed_scale()

  def logits(self, hidden_BxLxD: jax.Array) -> jax.Array:
    """Tied-embedding logits in float32, soft-capped."""
    table = self.embed[...]
    logits = jnp.einsum('bld,vd->blv', hidden_BxLxD.astype(table.dtype), table)
    logits = logits.astype(jnp.float32)
    cap = self.cfg.final_logit_softcap
    if cap:
      logits = jnp.tanh(logits / cap) * cap
    return logits

  def init_cache(self, batch: int, capacity: int) -> KVCache:
    """An empty cache for `capacity` positions (prompt plus all canvases)."""
    keys, values = [], []
    for layer in self.layers:
      shape = (batch, layer.attn.kv_heads, capacity, layer.attn.head_dim)
      keys.append(jnp.zeros(shape, self.cfg.jnp_dtype))
      values.append(jnp.zeros(shape, self.cfg.jnp_dtype))
    return KVCache(tuple(keys), tuple(values), jnp.zeros((), jnp.int32))

  # -- the two passes --------------------------------------------------------

  def encode(
    self, tokens_BxL: jax.Array, cache: KVCache
  ) -> tuple[jax.Array, KVCache]:
    """Causal pass over new clean tokens at positions length.. of the cache.

    Returns the final-norm hidden states [B, L, D] and the cache with the
    tokens' keys and values written.
    """
    start = cache.length
    L = tokens_BxL.shape[1]
    capacity = cache.keys[0].shape[2]
    q_pos_L = start + jnp.arange(L, dtype=jnp.int32)
    k_pos_T = jnp.arange(capacity, dtype=jnp.int32)
    causal_LxT = k_pos_T[None, :] <= q_pos_L[:, None]
    x = self.embed_tokens(tokens_BxL)
    keys, values = list(cache.keys), list(cache.values)
    for i, layer in enumerate(self.layers):
      attn = layer.attn
      mask = causal_LxT
      if attn.window is not None:
        mask = mask & (k_pos_T[None, :] > q_pos_L[:, None] - attn.window)

      def mix(h, attn=attn, i=i, mask=mask):
        q, k, v = attn.project(h, q_pos_L)
        at = (0, 0, start, 0)
        keys[i] = jax.lax.dynamic_update_slice(keys[i], k, at)
        values[i] = jax.lax.dynamic_update_slice(values[i], v, at)
        return attn.attend(q, keys[i], values[i], mask)

      x = layer(x, mix, 0)
    hidden = self.final_norm(x)
    return hidden, KVCache(tuple(keys), tuple(values), start + L)

  def soft_embedding(
    self, sc_logits_BxLxV: jax.Array, sc_mask_B: jax.Array | None = None
  ) -> jax.Array:
    """softmax(logits) @ embedding table * sqrt(width), rows masked."""
    table = self.embed[...]
    probs = jax.nn.softmax(sc_logits_BxLxV.astype(jnp.float32), axis=-1)
    soft = jnp.einsum('blv,vd->bld', probs.astype(table.dtype), table)
    soft = soft * self._embed_scale()
    if sc_mask_B is not None:
      soft = soft * sc_mask_B.astype(soft.dtype)[:, None, None]
    return soft

  def decode(
    self,
    canvas_BxC: jax.Array,
    cache: KVCache,
    sc_logits_BxCxV: jax.Array | None = None,
    sc_mask_B: jax.Array | None = None,
  ) -> jax.Array:
    """Bidirectional pass over a canvas after the cached prefix: logits
    [B, C, V] (float32). `sc_logits_BxCxV` are the previous step's logits
    (None: a zero self-conditioning signal); `sc_mask_B` zeroes the signal
    of some rows (training's per-example self-conditioning dropout)."""
    prefix = cache.length
    C = canvas_BxC.shape[1]
    capacity = cache.keys[0].shape[2]
    q_pos_C = prefix + jnp.arange(C, dtype=jnp.int32)
    k_pos_T = jnp.arange(capacity, dtype=jnp.int32)
    embeds = self.embed_tokens(canvas_BxC)
    if sc_logits_BxCxV is None:
      soft = jnp.zeros_like(embeds)
    else:
      soft = self.soft_embedding(sc_logits_BxCxV, sc_mask_B)
    x = self.self_conditioning(embeds, soft)
    canvas_1xC = jnp.ones((1, C), bool)
    for i, layer in enumerate(self.layers):
      attn = layer.attn
      seen_T = k_pos_T < prefix
      if attn.window is not None:
        seen_T = seen_T & (k_pos_T >= prefix - (attn.window - 1))
      mask = jnp.concatenate(
        [
          jnp.broadcast_to(seen_T[None], (C, capacity)),
          canvas_1xC.repeat(C, 0),
        ],
        axis=1,
      )

      def mix(h, attn=attn, i=i, mask=mask):
        q, k, v = attn.project(h, q_pos_C)
        k_all = jnp.concatenate([cache.keys[i], k], axis=2)
        v_all = jnp.concatenate([cache.values[i], v], axis=2)
        return attn.attend(q, k_all, v_all, mask)

      x = layer(x, mix, 1)
    return self.logits(self.final_norm(x))
