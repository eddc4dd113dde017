"""HF LLaMA / LLaDA and Qwen2 / Dream checkpoints <-> `LlamaFamily` params.

Names. `transformers`' LLaMA and Qwen2 classes (and Dream, whose modeling
code keeps Qwen2's names) store, per layer i,
`model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}`, plus
`model.embed_tokens`, `model.norm` and `lm_head` (absent when tied).
LLaDA's own modeling code (an OLMo derivative) names the same tensors
`model.transformer.{wte, ln_f, ff_out}` and, per block,
`model.transformer.blocks.{i}.{attn_norm, q_proj, k_proj, v_proj, attn_out,
ff_norm, ff_proj (the SwiGLU gate), up_proj, ff_out}`; `llada_to_hf_name`
renames them, so both layouts load.

Layout. A torch Linear weight is [out, in]; ours is [in, *out] with heads
split out (`q`: [D, H, K], `out`: [H, K, D]), so weights are transposed
and reshaped; both models use the rotate-half rotary form on the same
feature order, so no permutation is needed.

Configs. `config_from_hf` reads LLaMA / Qwen2 `config.json` keys (and
LLaDA's own `d_model`, `n_layers`, ... keys); `config_to_hf` writes a
LlamaConfig or Qwen2Config dict that `transformers` loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.interop import safetensors_io
from ddlm_jax.models.backbones import register_backbone
from ddlm_jax.models.llama_family import LlamaFamily, LlamaFamilyConfig
from ddlm_jax.parallel import rules as rules_lib
from ddlm_jax.training import state as state_lib
from ddlm_jax.training.config import ConfigError

ARCHS = ('llada', 'dream')
# Published mask tokens, used when a config.json does not name one.
DEFAULT_MASK_IDS = {'llada': 126336, 'dream': 151666}

# LLaDA's own names -> transformers' LLaMA names.
_LLADA_BLOCK = {
  'attn_norm': 'input_layernorm',
  'q_proj': 'self_attn.q_proj',
  'k_proj': 'self_attn.k_proj',
  'v_proj': 'self_attn.v_proj',
  'attn_out': 'self_attn.o_proj',
  'ff_norm': 'post_attention_layernorm',
  'ff_proj': 'mlp.gate_proj',
  'up_proj': 'mlp.up_proj',
  'ff_out': 'mlp.down_proj',
}
_LLADA_TOP = {
  'model.transformer.wte.weight': 'model.embed_tokens.weight',
  'model.transformer.ln_f.weight': 'model.norm.weight',
  'model.transformer.ff_out.weight': 'lm_head.weight',
}
_LLADA_BLOCK_RE = re.compile(r'model\.transformer\.blocks\.(\d+)\.(\w+)\.(\w+)')

# Our per-block parameter paths -> the HF name inside `model.layers.{i}.`.
_BLOCK_NAMES = {
  ('norm1', 'scale'): 'input_layernorm.weight',
  ('attn', 'q', 'kernel'): 'self_attn.q_proj.weight',
  ('attn', 'q', 'bias'): 'self_attn.q_proj.bias',
  ('attn', 'k', 'kernel'): 'self_attn.k_proj.weight',
  ('attn', 'k', 'bias'): 'self_attn.k_proj.bias',
  ('attn', 'v', 'kernel'): 'self_attn.v_proj.weight',
  ('attn', 'v', 'bias'): 'self_attn.v_proj.bias',
  ('attn', 'out', 'kernel'): 'self_attn.o_proj.weight',
  ('norm2', 'scale'): 'post_attention_layernorm.weight',
  ('mlp', 'gate', 'kernel'): 'mlp.gate_proj.weight',
  ('mlp', 'up', 'kernel'): 'mlp.up_proj.weight',
  ('mlp', 'down', 'kernel'): 'mlp.down_proj.weight',
}


def llada_to_hf_name(name: str) -> str:
  """A LLaDA-native tensor name as transformers' LLaMA name (else as is)."""
  if name in _LLADA_TOP:
    return _LLADA_TOP[name]
  m = _LLADA_BLOCK_RE.fullmatch(name)
  if m and m.group(2) in _LLADA_BLOCK:
    i, part, leaf = m.groups()
    return f'model.layers.{i}.{_LLADA_BLOCK[part]}.{leaf}'
  return name


def hf_names(files: Mapping[str, str]) -> dict[str, str]:
  """Checkpoint tensor names keyed by their transformers LLaMA/Qwen2 name."""
  return {llada_to_hf_name(name): name for name in files}


def param_names(cfg: LlamaFamilyConfig) -> Iterator[tuple[tuple, str]]:
  """(our parameter path, HF tensor name) for every parameter of cfg."""
  yield ('embedding',), 'model.embed_tokens.weight'
  for i in range(cfg.depth):
    for path, name in _BLOCK_NAMES.items():
      if path[-1] == 'bias' and not cfg.qkv_bias:
        continue
      yield ('blocks', i) + path, f'model.layers.{i}.{name}'
  yield ('final_norm', 'scale'), 'model.norm.weight'
  if not cfg.tied_embeddings:
    yield ('head', 'kernel'), 'lm_head.weight'


def _is_linear(path: tuple) -> bool:
  return path[-1] == 'kernel'


def to_ours(path: tuple, w: np.ndarray, shape: tuple, dtype) -> np.ndarray:
  """A torch-layout tensor as our parameter of `shape` (host array)."""
  if _is_linear(path):
    if w.ndim != 2:
      raise ValueError(f'{path}: expected a 2-D Linear weight, got {w.shape}.')
    w = w.T
  if w.size != int(np.prod(shape)):
    raise ValueError(
      f'{"/".join(map(str, path))}: checkpoint tensor of shape {w.shape} '
      f'does not fit the model parameter {shape}; check the config.json '
      'that came with the weights.'
    )
  # One host copy: transposed, converted and made contiguous together.
  return np.array(w, dtype=dtype, order='C').reshape(shape)


def to_hf(path: tuple, x: np.ndarray) -> np.ndarray:
  """Our parameter as the torch-layout tensor (inverse of `to_ours`)."""
  if not _is_linear(path):
    return x.reshape(-1) if path[-1] == 'bias' else x
  if path[-1] == 'kernel' and path[-2] == 'out':
    d_in = int(np.prod(x.shape[:-1]))  # attention output: [H, K, D]
  else:
    d_in = x.shape[0]
  return np.ascontiguousarray(x.reshape(d_in, -1).T)


def _get(hf: Mapping, *keys, default=None):
  for k in keys:
    if hf.get(k) is not None:
      return hf[k]
  return default


def _rope_theta(hf: Mapping, default: float) -> float:
  rope = hf.get('rope_parameters') or {}
  scaling = hf.get('rope_scaling') or {}
  kind = rope.get('rope_type') or scaling.get('rope_type') or 'default'
  if kind != 'default':
    raise ConfigError(
      f'config.json asks for rope_type={kind!r}; only plain rotary '
      "positions ('default') are supported. Remove the rope scaling."
    )
  return float(_get(rope, 'rope_theta', default=None) or
               _get(hf, 'rope_theta', default=default))  # fmt: skip


def config_from_hf(hf: Mapping[str, Any], arch: str, **overrides):
  """A LlamaFamilyConfig from a checkpoint's config.json dict.

  `overrides` set config fields (e.g. dtype, attention_impl, mask_token_id).
  Settings the model cannot reproduce are refused in one line.
  """
  if arch not in ARCHS:
    raise ConfigError(f'--arch={arch!r}; choose one of {ARCHS}.')
  act = _get(hf, 'hidden_act', 'activation_type', default='silu')
  if act not in ('silu', 'swiglu'):
    raise ConfigError(f'hidden_act={act!r}; only SwiGLU (silu) is supported.')
  if hf.get('mlp_bias') or hf.get('include_bias'):
    raise ConfigError('config.json sets MLP biases; the model has none.')
  width = _get(hf, 'hidden_size', 'd_model')
  heads = _get(hf, 'num_attention_heads', 'n_heads')
  kw = dict(
    family=arch,
    width=int(width),
    depth=int(_get(hf, 'num_hidden_layers', 'n_layers')),
    num_heads=int(heads),
    num_kv_heads=int(_get(hf, 'num_key_value_heads', 'n_kv_heads',
                          default=heads)),
    mlp_dim=int(_get(hf, 'intermediate_size', 'mlp_hidden_size')),
    vocab_size=int(_get(hf, 'embedding_size', 'vocab_size')),
    head_dim=int(_get(hf, 'head_dim', default=0) or 0),
    norm_eps=float(_get(hf, 'rms_norm_eps', default=1e-6)),
    rope_theta=_rope_theta(hf, 1e6 if arch == 'dream' else 1e4),
    tied_embeddings=bool(_get(hf, 'tie_word_embeddings', 'weight_tying',
                              default=False)),
    qkv_bias=arch == 'dream' or bool(hf.get('attention_bias')),
    shift_logits=arch == 'dream',
    mask_token_id=int(_get(hf, 'mask_token_id',
                           default=DEFAULT_MASK_IDS[arch])),
  )  # fmt: skip
  if kw['head_dim'] == kw['width'] // kw['num_heads']:
    kw['head_dim'] = 0
  if kw['mask_token_id'] >= kw['vocab_size']:
    kw['mask_token_id'] = -1  # A small or unrelated model: no mask token.
  kw.update(overrides)
  try:
    return LlamaFamilyConfig(**kw)
  except ValueError as e:
    raise ConfigError(f'config.json does not give a valid model: {e}') from e


def config_to_hf(cfg: LlamaFamilyConfig, dtype: str = 'float32') -> dict:
  """A transformers config.json dict (LLaMA or Qwen2) for cfg."""
  base = dict(
    hidden_size=cfg.width,
    num_hidden_layers=cfg.depth,
    num_attention_heads=cfg.num_heads,
    num_key_value_heads=cfg.num_kv_heads,
    intermediate_size=cfg.mlp_dim,
    head_dim=cfg.head_size,
    vocab_size=cfg.vocab_size,
    rms_norm_eps=cfg.norm_eps,
    rope_theta=cfg.rope_theta,
    rope_parameters={'rope_type': 'default', 'rope_theta': cfg.rope_theta},
    tie_word_embeddings=cfg.tied_embeddings,
    hidden_act='silu',
    dtype=dtype,
    max_position_embeddings=4096,
  )
  if cfg.mask_token_id >= 0:
    base['mask_token_id'] = cfg.mask_token_id
  if cfg.family == 'dream':
    if not cfg.qkv_bias:
      raise ConfigError('a Dream-family export needs qkv_bias=True (Qwen2).')
    return dict(
      base,
      model_type='qwen2',
      architectures=['Qwen2ForCausalLM'],
      use_sliding_window=False,
    )
  return dict(
    base,
    model_type='llama',
    architectures=['LlamaForCausalLM'],
    attention_bias=cfg.qkv_bias,
    mlp_bias=False,
  )


def _set(tree: dict, path: tuple, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _at(tree, path: tuple):
  for key in path:
    tree = tree[key]
  return tree


def abstract_params(cfg: LlamaFamilyConfig):
  """The model's abstract nnx State of Params (nothing allocated)."""
  build = lambda rngs: LlamaFamily(cfg, rngs=rngs)
  return state_lib.split_model(build)[1]


def load_params(
  src: str,
  cfg: LlamaFamilyConfig,
  *,
  mesh: jax.sharding.Mesh | None = None,
  param_dtype=np.float32,
) -> dict:
  """The pure parameter dict of `LlamaFamily(cfg)` read from `src`.

  Streams tensor by tensor onto each parameter's sharding on `mesh` (from
  its logical axis names; default: one device, replicated).
  """
  if mesh is None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  abstract = abstract_params(cfg)
  shardings = state_lib.param_shardings(abstract, mesh, rules_for(mesh))
  shapes = {
    path: variable.shape for path, variable in nnx.to_flat_state(abstract)
  }
  files = safetensors_io.tensor_files(src)
  by_hf = hf_names(files)
  wanted = []
  for path, hf_name in param_names(cfg):
    wanted.append((by_hf.get(hf_name, hf_name), path))
  flat = safetensors_io.load_tree(
    files,
    wanted,
    lambda path, w: to_ours(path, w, shapes[path], param_dtype),
    lambda path: _at(shardings, path),
  )
  params: dict = {}
  for path, value in flat.items():
    _set(params, path, value)
  return params


def rules_for(mesh) -> dict:
  """The default rules, restricted to the mesh's axes."""
  out = {}
  for name, axes in rules_lib.DEFAULT_RULES.items():
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
    kept = tuple(a for a in flat if a in mesh.shape)
    out[name] = kept or None
  return out


def export_params(
  cfg: LlamaFamilyConfig, params: Mapping, out_dir: str, dtype='float32'
) -> list[str]:
  """Writes params as transformers safetensors + config.json in out_dir."""
  np_dtype = {'float32': np.float32, 'bfloat16': jnp.bfloat16}[dtype]

  def tensors():
    for path, hf_name in param_names(cfg):
      host = np.asarray(jax.device_get(_at(params, path)))
      yield hf_name, to_hf(path, host).astype(np_dtype)

  files = safetensors_io.save_tree(tensors(), out_dir)
  with open(os.path.join(out_dir, 'config.json'), 'w') as f:
    json.dump(config_to_hf(cfg, dtype), f, indent=2)
  return files


# config.model keys of a run that LlamaFamilyConfig does not hold: the
# backbone name and the suite-wide time-conditioning switch (must be off).
_RUN_ONLY_KEYS = ('backbone', 'time_conditioning')


def run_model_config(model: Mapping[str, Any], process) -> LlamaFamilyConfig:
  """The LlamaFamilyConfig of a run's config.model (backbone llada|dream).

  The run's tokenizer gives the process vocabulary V_data; the model's
  logits cover those ids and reads V_data (the process's mask id) as the
  published mask token, which it never emits.
  """
  fields = {f.name for f in dataclasses.fields(LlamaFamilyConfig)}
  unknown = sorted(set(model) - fields - set(_RUN_ONLY_KEYS))
  if unknown:
    raise ConfigError(
      f'config.model has keys a {model.get("backbone")} model does not '
      f'take: {unknown}; it takes {sorted(fields)}.'
    )
  if model.get('time_conditioning'):
    raise ConfigError(
      'LLaDA/Dream models are time-free; set '
      '--config.model.time_conditioning=False.'
    )
  if process.family != 'masked':
    raise ConfigError(
      f'a {model.get("backbone")} model runs masked processes; set '
      "--config.process.kind='mdlm' (or 'md4')."
    )
  if process.vocab_size > model['vocab_size']:
    raise ConfigError(
      f'the tokenizer has {process.vocab_size} ids, the model only '
      f'{model["vocab_size"]} embedding rows; use the tokenizer that came '
      'with the weights.'
    )
  kw = {k: v for k, v in model.items() if k in fields}
  kw.update(data_vocab_size=process.vocab_size, forbid_mask_output=True)
  try:
    return LlamaFamilyConfig(**kw)
  except ValueError as e:
    raise ConfigError(f'config.model: {e}') from e


def _build(mcfg: LlamaFamilyConfig, model, rngs) -> LlamaFamily:
  del model  # Everything the network needs is in its config.
  return LlamaFamily(mcfg, rngs=rngs)


for _arch in ARCHS:  # A run's config.model.backbone names these.
  register_backbone(_arch, run_model_config, _build)
