"""Hybrid attention / state-space backbone for the diffusion denoiser.

A per-layer ``pattern`` such as 'ASAS' picks, layer by layer, a transformer
block ('A': ``transformer.Block``, rotary attention, bidirectional unless the
process is causal) or an SSM block ('S': ``SSMLayer``, the same
``layers.Block`` around a PD-SSM / complex-diagonal / selective-diagonal
mixer from ``ssm``, run as a forward + reverse scan pair for bidirectional
denoisers and forward-only for causal ones, then the transformer's MLP).
SSM blocks take the same optional adaLN time modulation as attention blocks.
``HybridTransformer`` has the interface of ``transformer.Transformer``:
``__call__(tokens_BxL, t_B=None)`` -> logits_BxLxV, plus ``embed`` /
``backbone`` / ``logits``, so processes, samplers and the trainer use it
unchanged.

Config keys (``config.model``): ``backbone`` ('transformer' | 'hybrid'),
``pattern``, ``ssm_kind``, ``state_size``, ``num_dict``, ``scan_impl``;
``split_model_keys`` separates them from the transformer's keys and
``hybrid_config`` builds a ``HybridConfig``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from ddlm_jax.models import layers, ssm
from ddlm_jax.models.layers import MLP
from ddlm_jax.models.transformer import (
  DTYPES,
  Block,
  Transformer,
  TransformerConfig,
)

BACKBONES = ('transformer', 'hybrid')
# config.model keys that belong to the hybrid, with their defaults.
HYBRID_DEFAULTS = {
  'backbone': 'transformer',
  'pattern': 'ASAS',
  'ssm_kind': 'pdssm',
  'state_size': 64,
  'num_dict': 8,
  'scan_impl': 'auto',
}


@dataclasses.dataclass(frozen=True)
class HybridConfig:
  """TransformerConfig plus the layer pattern and the SSM options.

  ``base.depth`` must equal ``len(pattern)``.
  """

  base: TransformerConfig
  pattern: str = 'ASAS'
  ssm_kind: str = 'pdssm'  # 'pdssm' | 'complex_diag' | 'selective_diag'
  state_size: int = 64
  num_dict: int = 8
  scan_impl: str = 'auto'

  def __post_init__(self):
    if not self.pattern or set(self.pattern) - {'A', 'S'}:
      raise ValueError(
        f"pattern={self.pattern!r}: use a string of 'A' (attention) and 'S' "
        "(SSM) layers, e.g. 'ASAS'."
      )
    if len(self.pattern) != self.base.depth:
      raise ValueError(
        f'pattern {self.pattern!r} has {len(self.pattern)} layers but '
        f'model.depth={self.base.depth}; make them equal.'
      )
    if self.ssm_kind not in ssm.MODES:
      raise ValueError(
        f'ssm_kind={self.ssm_kind!r}; choose one of {ssm.MODES}.'
      )


def split_model_keys(model_cfg: dict) -> tuple[dict, dict]:
  """(transformer keys, hybrid keys with defaults) of a config.model dict."""
  base = {k: v for k, v in model_cfg.items() if k not in HYBRID_DEFAULTS}
  extra = {k: model_cfg.get(k, v) for k, v in HYBRID_DEFAULTS.items()}
  if extra['backbone'] not in BACKBONES:
    raise ValueError(
      f'model.backbone={extra["backbone"]!r}; choose one of {BACKBONES}.'
    )
  return base, extra


def hybrid_config(base: TransformerConfig, model_cfg) -> HybridConfig:
  """HybridConfig from a built TransformerConfig and config.model."""
  _, extra = split_model_keys(dict(model_cfg))
  extra.pop('backbone')
  return HybridConfig(base=base, **extra)


class SSMLayer(layers.Block):
  """`layers.Block` around an SSM mixer, with the config's MLP and adaLN.

  The mixer runs in float32 (complex states); its output is cast back to the
  compute dtype.
  """

  def __init__(self, cfg: HybridConfig, *, rngs: nnx.Rngs):
    b = cfg.base
    dtype = DTYPES[b.dtype]
    super().__init__(
      b.width,
      lambda r: ssm.make_mixer(
        cfg.ssm_kind,
        b.width,
        state_size=cfg.state_size,
        num_dict=cfg.num_dict,
        bidirectional=not b.causal,
        scan_impl=cfg.scan_impl,
        rngs=r,
      ),
      lambda r: MLP(b.width, b.hidden_dim, b.mlp_kind, rngs=r, dtype=dtype),
      rngs=rngs,
      cond_dim=b.cond_dim if b.time_conditioning else 0,
      mixer_dtype=jnp.float32,
    )


class HybridTransformer(Transformer):
  """Transformer whose layers follow ``pattern`` ('A' attention, 'S' SSM).

  Embedding, time conditioning, final norm, head and the forward split are
  inherited from ``Transformer``; only the block list differs.
  """

  def __init__(self, cfg: HybridConfig, *, rngs: nnx.Rngs):
    # The parent builds embedding, time MLP, norm and head; no blocks.
    super().__init__(dataclasses.replace(cfg.base, depth=0), rngs=rngs)
    self.cfg = cfg.base
    self.hybrid_cfg = cfg
    self.blocks = nnx.List(
      [
        Block(cfg.base, rngs=rngs) if kind == 'A' else SSMLayer(cfg, rngs=rngs)
        for kind in cfg.pattern
      ]
    )
