"""DiffusionGemma checkpoints (transformers layout) -> `DiffusionGemma`.

A saved `DiffusionGemmaForBlockDiffusion` holds one copy of each tied text
weight (under `model.decoder.`; the encoder's are tied to them), the
encoder's own per-layer scalars (buffers, not tied) and the vision tower,
which is dropped: the model here is text only. Torch linear weights are
[out, in]; ours are [in, *out] with heads split out, so each is transposed
and reshaped. Weights are read with `safetensors.numpy`; no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.models.diffusion_gemma import (
  FULL,
  DiffusionGemma,
  DiffusionGemmaConfig,
  RopeSpec,
)
from ddlm_jax.training.config import ConfigError

ENCODER = 'model.encoder.language_model.'
DECODER = 'model.decoder.'


def _rope(params: Mapping | None, default: RopeSpec) -> RopeSpec:
  if params is None:
    return default
  return RopeSpec(
    rope_type=params.get('rope_type', 'default'),
    theta=float(params.get('rope_theta', default.theta)),
    partial_rotary_factor=float(params.get('partial_rotary_factor', 1.0)),
    factor=float(params.get('factor', 1.0)),
  )


def config_from_hf(hf: Mapping, dtype: str = 'float32') -> DiffusionGemmaConfig:
  """Our config from a DiffusionGemma `config.json` dict (text part only)."""
  text = hf.get('text_config', hf)
  checks = (
    ('hidden_activation', 'gelu_pytorch_tanh'),
    ('attention_bias', False),
  )
  for key, want in checks:
    if text.get(key, want) != want:
      raise ConfigError(
        f'text_config.{key}={text[key]!r} is not supported; only {want!r}.'
      )
  if text.get('use_bidirectional_attention') == 'all':
    raise ConfigError(
      "text_config.use_bidirectional_attention='all' (a bidirectional "
      'encoder) is not supported; use None or "vision".'
    )
  if not text.get('num_experts'):
    raise ConfigError(
      'text_config.num_experts is unset; DiffusionGemma layers always have '
      'experts, so set num_experts and top_k_experts.'
    )
  layer_types = tuple(text['layer_types'])
  full = [i for i, t in enumerate(layer_types) if t == FULL]
  per_layer = {
    int(k): v for k, v in (text.get('per_layer_config') or {}).items()
  }
  shapes = {
    (per_layer.get(i, {}).get('head_dim'),
     per_layer.get(i, {}).get('num_key_value_heads'))
    for i in full
  }  # fmt: skip
  if len(shapes) > 1:
    raise ConfigError(
      f'full-attention layers have different head settings {shapes}; one '
      'setting for all full layers is supported.'
    )
  global_head_dim, global_kv = shapes.pop() if shapes else (None, None)
  global_head_dim = global_head_dim or text.get('global_head_dim', 512)
  rope = text.get('rope_parameters') or {}
  base = DiffusionGemmaConfig
  return DiffusionGemmaConfig(
    vocab_size=text['vocab_size'],
    hidden_size=text['hidden_size'],
    intermediate_size=text['intermediate_size'],
    num_heads=text['num_attention_heads'],
    num_kv_heads=text['num_key_value_heads'],
    head_dim=text['head_dim'],
    layer_types=layer_types,
    sliding_window=text['sliding_window'],
    global_head_dim=global_head_dim,
    num_global_kv_heads=global_kv,
    sliding_rope=_rope(rope.get('sliding_attention'), base.sliding_rope),
    full_rope=_rope(rope.get(FULL), base.full_rope),
    num_experts=text['num_experts'],
    top_k_experts=text['top_k_experts'],
    moe_intermediate_size=text['moe_intermediate_size'],
    rms_norm_eps=text.get('rms_norm_eps', 1e-6),
    final_logit_softcap=text.get('final_logit_softcapping', 30.0),
    canvas_length=hf.get('canvas_length', 256),
    pad_id=text.get('pad_token_id', 0),
    eos_id=_first(text.get('eos_token_id', 1)),
    bos_id=text.get('bos_token_id', 2),
    dtype=dtype,
  )


def _first(ids):
  return ids[0] if isinstance(ids, list | tuple) else ids


class _Reader:
  """Looks up tied text weights under the decoder or the encoder name."""

  def __init__(self, state: Mapping[str, np.ndarray]):
    self.state = state

  def __call__(self, name: str) -> np.ndarray:
    for key in (DECODER + name, ENCODER + name, name):
      if key in self.state:
        return np.asarray(self.state[key], np.float32)
    raise KeyError(
      f'checkpoint has no {DECODER + name!r}; is it a DiffusionGemma '
      'checkpoint saved by transformers?'
    )


def _linear(w_OxI: np.ndarray, out_shape=None) -> np.ndarray:
  """Torch [out, in] -> ours [in, *out_shape]."""
  w = w_OxI.T
  return w if out_shape is None else w.reshape(w.shape[0], *out_shape)


def _set(variable, value: np.ndarray, dtype):
  want = tuple(variable.value.shape)
  if tuple(value.shape) != want:
    raise ValueError(f'shape {value.shape} from the checkpoint, want {want}.')
  variable.value = jnp.asarray(value, dtype)


def convert(
  state: Mapping[str, np.ndarray], cfg: DiffusionGemmaConfig
) -> DiffusionGemma:
  """A `DiffusionGemma` holding the checkpoint's text weights."""
  model = nnx.eval_shape(lambda: DiffusionGemma(cfg, rngs=nnx.Rngs(0)))
  get, dtype = _Reader(state), cfg.jnp_dtype
  _set(model.embed, get('embed_tokens.weight'), dtype)
  _set(model.final_norm.scale, get('norm.weight'), dtype)
  sc = model.self_conditioning
  _set(sc.pre_norm.scale, get('self_conditioning.pre_norm.weight'), dtype)
  for name in ('gate', 'up', 'down'):
    w = get(f'self_conditioning.{name}_proj.weight')
    _set(getattr(sc.mlp, name).kernel, _linear(w), dtype)
  for i, layer in enumerate(model.layers):
    p = f'layers.{i}.'
    attn = layer.attn
    H, K, G = cfg.num_heads, attn.head_dim, attn.kv_heads
    _set(attn.q.kernel, _linear(get(p + 'self_attn.q_proj.weight'), (H, K)),
         dtype)  # fmt: skip
    _set(attn.k.kernel, _linear(get(p + 'self_attn.k_proj.weight'), (G, K)),
         dtype)  # fmt: skip
    if attn.v is not None:
      w = get(p + 'self_attn.v_proj.weight')
      _set(attn.v.kernel, _linear(w, (G, K)), dtype)
    w_o = get(p + 'self_attn.o_proj.weight').T.reshape(H, K, -1)
    _set(attn.o.kernel, w_o, dtype)
    _set(attn.q_norm.scale, get(p + 'self_attn.q_norm.weight'), dtype)
    _set(attn.k_norm.scale, get(p + 'self_attn.k_norm.weight'), dtype)
    norms = {
      'input_norm': 'input_layernorm',
      'post_attn_norm': 'post_attention_layernorm',
      'pre_mlp_norm': 'pre_feedforward_layernorm',
      'post_mlp_norm': 'post_feedforward_layernorm_1',
      'pre_experts_norm': 'pre_feedforward_layernorm_2',
      'post_experts_norm': 'post_feedforward_layernorm_2',
      'post_ff_norm': 'post_feedforward_layernorm',
    }
    for ours, theirs in norms.items():
      _set(getattr(layer, ours).scale, get(p + theirs + '.weight'), dtype)
    for name in ('gate', 'up', 'down'):
      w = get(p + f'mlp.{name}_proj.weight')
      _set(getattr(layer.mlp, name).kernel, _linear(w), dtype)
    router = layer.router
    _set(router.proj.kernel, _linear(get(p + 'router.proj.weight')), dtype)
    _set(router.scale, get(p + 'router.scale'), dtype)
    _set(router.per_expert_scale, get(p + 'router.per_expert_scale'), dtype)
    gate_up = get(p + 'experts.gate_up_proj').transpose(0, 2, 1)
    _set(layer.experts.gate_up, gate_up, dtype)
    down = get(p + 'experts.down_proj').transpose(0, 2, 1)
    _set(layer.experts.down, down, dtype)
    scalars = [
      state.get(prefix + p + 'layer_scalar', np.ones(1, np.float32))
      for prefix in (ENCODER, DECODER)
    ]
    scalars = np.concatenate([np.asarray(s, np.float32) for s in scalars])
    _set(layer.layer_scalar, scalars, dtype)
  return model


def load_diffusion_gemma(
  directory: str, dtype: str = 'float32'
) -> tuple[DiffusionGemma, DiffusionGemmaConfig]:
  """Model and config from a `save_pretrained` directory (safetensors)."""
  from safetensors.numpy import load_file

  with open(os.path.join(directory, 'config.json')) as f:
    cfg = config_from_hf(json.load(f), dtype)
  files = sorted(n for n in os.listdir(directory) if n.endswith('.safetensors'))
  if not files:
    raise FileNotFoundError(
      f'no .safetensors files in {directory}; save the model with '
      'save_pretrained(safe_serialization=True).'
    )
  state: dict[str, np.ndarray] = {}
  for name in files:
    state.update(load_file(os.path.join(directory, name)))
  text = {k: v for k, v in state.items() if '.vision_tower.' not in k}
  return convert(text, cfg), cfg
