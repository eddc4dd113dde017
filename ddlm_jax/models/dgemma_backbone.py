"""The 'diffusion_gemma' run backbone: a `DiffusionGemma` sized by
config.model, trainable by the one loop.

`config(model, process)` maps the run's model block to a
`DiffusionGemmaConfig`: width, depth, num_heads, mlp_dim (0: 4 x width),
rope_theta (sliding layers) and dtype as for the transformer, plus the
keys of this model: layer_pattern ('S' sliding / 'F' full per layer; ''
is sliding layers with a full last one), kv_heads (0: num_heads),
sliding_window, num_experts, top_k_experts, moe_mlp_dim (0: width) and
logit_softcap (0: none). The canvas length is the process's block size.
Keys of other backbones are refused.

The wrapper keeps the model's `encode` / `decode` / `init_cache` (what the
'dgemma' process and the entropy-bound canvas sampler call) and adds
`__call__(z_BxL, t_B)`: one decoder pass over the whole sequence with an
empty cache, the one-call view the run's FLOP count and generic tools use.
The per-layer output scalars, fixed buffers in a converted checkpoint, are
parameters here (initialised to 1): the trainer keeps parameters only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.errors import ConfigError
from ddlm_jax.models.backbones import register_backbone
from ddlm_jax.models.diffusion_gemma import (
  FULL,
  SLIDING,
  DiffusionGemma,
  DiffusionGemmaConfig,
  KVCache,
  RopeSpec,
)

NAME = 'diffusion_gemma'
# Keys every run's model block has and this backbone reads or accepts.
RUN_KEYS = ('backbone', 'time_conditioning', 'attention_impl')
DEFAULTS = {
  'width': 64,
  'depth': 2,
  'num_heads': 4,
  'mlp_dim': 0,
  'rope_theta': 10_000.0,
  'dtype': 'float32',
  'layer_pattern': '',
  'kv_heads': 0,
  'sliding_window': 16,
  'num_experts': 4,
  'top_k_experts': 2,
  'moe_mlp_dim': 0,
  'logit_softcap': 30.0,
}
LAYER_CODES = {'S': SLIDING, 'F': FULL}


def layer_types(pattern: str, depth: int) -> tuple[str, ...]:
  """'SSF' -> layer types; '' -> depth - 1 sliding layers, then a full one."""
  if not pattern:
    pattern = 'S' * (depth - 1) + 'F'
  bad = sorted(set(pattern) - set(LAYER_CODES))
  if bad or len(pattern) != depth:
    raise ConfigError(
      f'model.layer_pattern={pattern!r}; write one letter per layer (S '
      f'sliding, F full), {depth} letters for model.depth={depth}.'
    )
  return tuple(LAYER_CODES[c] for c in pattern)


def run_model_config(model: Mapping[str, Any], process) -> DiffusionGemmaConfig:
  """The DiffusionGemmaConfig of a run's config.model block."""
  unknown = sorted(set(model) - set(DEFAULTS) - set(RUN_KEYS))
  if unknown:
    raise ConfigError(
      f'config.model has keys the {NAME} backbone does not take: {unknown};'
      f' it takes {sorted(DEFAULTS)} (and {list(RUN_KEYS)}).'
    )
  if process.family != 'dgemma':
    raise ConfigError(
      f"model.backbone='{NAME}' is trained by the DiffusionGemma recipe; set "
      "--config.process.kind='dgemma'."
    )
  m = {**DEFAULTS, **{k: v for k, v in model.items() if k in DEFAULTS}}
  width, heads = int(m['width']), int(m['num_heads'])
  if heads < 1 or width % heads or (width // heads) % 2:
    raise ConfigError(
      f'model.width={width} is not divisible by model.num_heads={heads} '
      'into an even head size (rotary embeddings rotate pairs); change one.'
    )
  head_dim = width // heads
  try:
    return DiffusionGemmaConfig(
      vocab_size=process.vocab_size,
      hidden_size=width,
      intermediate_size=int(m['mlp_dim']) or 4 * width,
      num_heads=heads,
      num_kv_heads=int(m['kv_heads']) or heads,
      head_dim=head_dim,
      layer_types=layer_types(str(m['layer_pattern']), int(m['depth'])),
      sliding_window=int(m['sliding_window']),
      global_head_dim=head_dim,
      sliding_rope=RopeSpec('default', float(m['rope_theta'])),
      num_experts=int(m['num_experts']),
      top_k_experts=int(m['top_k_experts']),
      moe_intermediate_size=int(m['moe_mlp_dim']) or width,
      final_logit_softcap=float(m['logit_softcap']) or None,
      canvas_length=int(process.block_size),
      pad_id=None,
      eos_id=None,
      bos_id=None,
      dtype=str(m['dtype']),
    )
  except ConfigError as err:
    raise ConfigError(f'config.model: {err}') from None


class DGemmaBackbone(nnx.Module):
  """A trainable DiffusionGemma (module docstring)."""

  def __init__(self, cfg: DiffusionGemmaConfig, *, rngs: nnx.Rngs):
    self.net = DiffusionGemma(cfg, rngs=rngs)
    for layer in self.net.layers:
      layer.layer_scalar = nnx.Param(jnp.ones((2,), cfg.jnp_dtype))

  @property
  def cfg(self) -> DiffusionGemmaConfig:
    return self.net.cfg

  def init_cache(self, batch: int, capacity: int) -> KVCache:
    return self.net.init_cache(batch, capacity)

  def encode(self, tokens_BxL: jax.Array, cache: KVCache):
    return self.net.encode(tokens_BxL, cache)

  def decode(self, canvas_BxC, cache, sc_logits_BxCxV=None, sc_mask_B=None):
    return self.net.decode(canvas_BxC, cache, sc_logits_BxCxV, sc_mask_B)

  def __call__(self, z_BxL: jax.Array, t_B: jax.Array | None = None):
    """Decoder logits of the whole sequence as one canvas, no prefix."""
    del t_B  # Time-free.
    cache = self.net.init_cache(z_BxL.shape[0], 0)
    return self.net.decode(z_BxL.astype(jnp.int32), cache)


def _build(mcfg: DiffusionGemmaConfig, model, rngs) -> DGemmaBackbone:
  del model  # Everything the network needs is in its config.
  return DGemmaBackbone(mcfg, rngs=rngs)


register_backbone(NAME, run_model_config, _build)
