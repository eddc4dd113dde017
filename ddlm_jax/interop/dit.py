"""MDLM / Duo / BD3-LM DiT checkpoints: state-dict names -> ours, and a pass.

The three projects share one diffusion transformer (MDLM's `models/dit.py`,
`DIT`). Its state dict, per block i (`blocks.{i}.`):

  norm1.weight [D]                  LayerNorm scale (no bias)
  attn_qkv.weight [3D, D]           fused Q/K/V, output laid out (3, H, K)
  attn_out.weight [D, D]            no bias
  norm2.weight [D]
  mlp.0.weight [4D, D], mlp.0.bias  GELU (tanh) MLP, biased
  mlp.2.weight [D, 4D], mlp.2.bias
  adaLN_modulation.weight [6D, C], .bias [6D]
                                    shift/scale/gate of attention and MLP

and once: `vocab_embed.embedding` [V, D] (a raw table), `sigma_map.mlp.0`
[C, 256] and `sigma_map.mlp.2` [C, C] (biased; the time MLP on 256
sinusoidal features of sigma), `output_layer.norm_final.weight`,
`output_layer.adaLN_modulation` [2D, C] (shift, scale) and
`output_layer.linear` [V, D] (biased). Checkpoints saved from a training
module prefix every name with `backbone.`; both spellings load.

How it differs from `models.Transformer`: LayerNorm instead of RMSNorm,
biased GELU MLP, a biased modulation whose gates multiply the branch
(`x + gate * f(...)`, ours `x + (1 + gate) * f(...)`), a modulated final
norm and a biased head, and a time MLP of width 256 -> C on sigma. The
attention (fused (3, H, K) projection, rotate-half rotary with base 1e4 on
head features, bidirectional) is ours, so `attn_qkv` / `attn_out` map onto
our `SelfAttention` parameter shapes unchanged. `dit_logits` is the
forward pass of that layout over our parameter names, written as plain
functions; `models.dit.DiT` is the same layout as a run backbone ('dit'),
whose parameter paths are these, and `convert_dir` writes a run directory
of it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.interop import safetensors_io
from ddlm_jax.models.attention import attend, rotary
from ddlm_jax.training.config import ConfigError

FREQ_DIM = 256  # Sinusoidal features the time MLP reads.
_PREFIXES = ('backbone.', 'model.backbone.', 'module.')

# Block tensors: DiT name -> (our path inside blocks/{i}, torch Linear?).
_BLOCK = {
  'norm1.weight': (('norm1', 'scale'), False),
  'attn_qkv.weight': (('attn', 'qkv', 'kernel'), True),
  'attn_out.weight': (('attn', 'out', 'kernel'), True),
  'norm2.weight': (('norm2', 'scale'), False),
  'mlp.0.weight': (('mlp', 'up', 'kernel'), True),
  'mlp.0.bias': (('mlp', 'up', 'bias'), False),
  'mlp.2.weight': (('mlp', 'down', 'kernel'), True),
  'mlp.2.bias': (('mlp', 'down', 'bias'), False),
  'adaLN_modulation.weight': (('modulation', 'kernel'), True),
  'adaLN_modulation.bias': (('modulation', 'bias'), False),
}
_TOP = {
  'vocab_embed.embedding': (('embedding',), False),
  'sigma_map.mlp.0.weight': (('time_mlp', 0, 'kernel'), True),
  'sigma_map.mlp.0.bias': (('time_mlp', 0, 'bias'), False),
  'sigma_map.mlp.2.weight': (('time_mlp', 1, 'kernel'), True),
  'sigma_map.mlp.2.bias': (('time_mlp', 1, 'bias'), False),
  'output_layer.norm_final.weight': (('final_norm', 'scale'), False),
  'output_layer.adaLN_modulation.weight': (
    ('final_modulation', 'kernel'),
    True,
  ),
  'output_layer.adaLN_modulation.bias': (('final_modulation', 'bias'), False),
  'output_layer.linear.weight': (('head', 'kernel'), True),
  'output_layer.linear.bias': (('head', 'bias'), False),
}
_BLOCK_RE = re.compile(r'blocks\.(\d+)\.(.+)')
# Buffers, not parameters: recomputed here.
_IGNORED = ('rotary_emb.inv_freq',)


def strip_prefix(name: str) -> str:
  for p in _PREFIXES:
    if name.startswith(p):
      return name[len(p) :]
  return name


def our_path(name: str) -> tuple[tuple, bool] | None:
  """(our parameter path, is a torch Linear weight) of a DiT tensor name;
  None for buffers. Unknown names raise KeyError."""
  name = strip_prefix(name)
  if name in _IGNORED:
    return None
  if name in _TOP:
    return _TOP[name]
  m = _BLOCK_RE.fullmatch(name)
  if m and m.group(2) in _BLOCK:
    path, linear = _BLOCK[m.group(2)]
    return ('blocks', int(m.group(1))) + path, linear
  raise KeyError(
    f'{name!r} is not a tensor of the MDLM/Duo/BD3-LM DiT layout; check '
    '--arch (llada and dream checkpoints use --arch=llada|dream).'
  )


def _target_shape(path: tuple, w: np.ndarray, heads: int) -> tuple:
  """Our shape of a tensor: heads split out of attention, modulation
  split into its (6 or 2) parts."""
  leaf, owner = path[-1], path[-2] if len(path) > 1 else None
  if owner == 'qkv':  # [D, 3D] -> [D, 3, H, K]
    d = w.shape[0]
    return (d, 3, heads, d // heads)
  if owner == 'out' and path[-3] == 'attn':  # [D, D] -> [H, K, D]
    d = w.shape[1]
    return (heads, d // heads, d)
  if owner in ('modulation', 'final_modulation'):
    parts = 6 if owner == 'modulation' else 2
    if leaf == 'kernel':  # [C, parts * D] -> [C, parts, D]
      return (w.shape[0], parts, w.shape[1] // parts)
    return (parts, w.shape[0] // parts)
  return w.shape


def from_state_dict(
  state: Mapping[str, np.ndarray], num_heads: int
) -> dict[tuple, np.ndarray]:
  """{our path: array} from a DiT state dict (torch layout, numpy arrays)."""
  out = {}
  for name, w in state.items():
    hit = our_path(name)
    if hit is None:
      continue
    path, linear = hit
    w = np.asarray(w, np.float32)
    if linear:
      w = w.T
    out[path] = np.ascontiguousarray(w).reshape(
      _target_shape(path, w, num_heads)
    )
  depth = 1 + max((p[1] for p in out if p[0] == 'blocks'), default=-1)
  need = [p for p, _ in _TOP.values()] + [
    ('blocks', i) + p for i in range(depth) for p, _ in _BLOCK.values()
  ]
  missing = [p for p in need if p not in out]
  if missing or not depth:
    raise KeyError(
      f'the DiT state dict lacks {missing[:3] or "every block"}; is it '
      'complete (all shards present)?'
    )
  return out


def config_from_hf(hf: Mapping) -> dict:
  """DiT shape from a checkpoint's config.json (MDLM's own key names)."""
  model = hf.get('model', hf)

  def get(*keys):
    for k in keys:
      if model.get(k) is not None:
        return int(model[k])
    raise ConfigError(f'config.json has none of {keys}; is this a DiT?')

  return dict(
    width=get('hidden_dim', 'hidden_size'),
    depth=get('n_blocks', 'num_hidden_layers'),
    num_heads=get('n_heads', 'num_attention_heads'),
    cond_dim=get('cond_dim'),
    vocab_size=get('vocab_size'),
    time_conditioning=bool(model.get('time_conditioning', False)),
  )


def load_dir(src: str) -> tuple[dict, dict[tuple, np.ndarray]]:
  """(config, params) from a local DiT checkpoint directory (safetensors)."""
  with open(os.path.join(src, 'config.json')) as f:
    cfg = config_from_hf(json.load(f))
  files = safetensors_io.tensor_files(src)
  from safetensors import safe_open

  state = {}
  for path in sorted(set(files.values())):
    with safe_open(path, framework='numpy') as f:
      for name in f.keys():
        state[name] = f.get_tensor(name)
  return cfg, from_state_dict(state, cfg['num_heads'])


def as_tree(params: Mapping[tuple, np.ndarray]) -> dict:
  """{our path: array} as the nested parameter dict of `models.dit.DiT`
  (`nnx.to_pure_dict` layout: list entries keyed by int)."""
  tree: dict = {}
  for path, value in params.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def run_params(params: Mapping[tuple, np.ndarray]) -> dict:
  """The converted parameters as a run's `dit` backbone holds them.

  The layout's last id is its mask (MDLM appends it to the tokenizer), so
  a run's masked process (data vocabulary V - 1, mask id V - 1) embeds V
  ids and emits V - 1 logits: the head's mask column is dropped. Under
  MDLM's SUBS parameterisation that logit is -inf, so the distribution
  over the data tokens is unchanged.
  """
  out = dict(params)
  out[('head', 'kernel')] = params[('head', 'kernel')][:, :-1]
  out[('head', 'bias')] = params[('head', 'bias')][:-1]
  return as_tree(out)


def model_block(cfg: Mapping) -> dict:
  """The run config's `model` block of a converted DiT."""
  keys = ('width', 'depth', 'num_heads', 'cond_dim', 'time_conditioning')
  return {'backbone': 'dit', **{k: cfg[k] for k in keys}}


def convert_dir(src: str, out_dir: str, run_config: Mapping) -> dict:
  """Writes a run directory at step 0 from a local DiT checkpoint.

  Like `interop.workdir.convert_hf`: `config.json` is `run_config` with
  the model block `{'backbone': 'dit', ...}`, `checkpoints/0` the
  parameters (`run_params`), `tokenizer/` the tokenizer files found in
  src, `imported.json` the source. So `--mode=eval|sample` (with
  `--config=experiments/configs/imported.py:DIR`) load it like any run.
  Returns the DiT's shape (`config_from_hf`).
  """
  from ddlm_jax import paths
  from ddlm_jax.data import pretrained
  from ddlm_jax.interop import workdir as workdir_lib
  from ddlm_jax.training import state as state_lib
  from ddlm_jax.training.checkpoint import Checkpointer

  ckpt_dir = paths.join(out_dir, workdir_lib.CHECKPOINTS_DIR)
  if paths.exists(ckpt_dir):
    raise FileExistsError(
      f'{ckpt_dir} exists; convert into an empty directory.'
    )
  cfg, params = load_dir(src)
  paths.makedirs(out_dir)
  tok_dir = paths.join(out_dir, workdir_lib.TOKENIZER_DIR)
  tok = workdir_lib.copy_tokenizer(src, tok_dir)
  if 'tokenizer.json' in tok:
    tokenizer = pretrained.load_hf_tokenizer(tok_dir)
    if tokenizer.vocab_size != cfg['vocab_size'] - 1:
      raise ConfigError(
        f'the tokenizer has {tokenizer.vocab_size} tokens, the DiT '
        f'{cfg["vocab_size"]} ids; the layout needs the tokenizer plus one '
        'mask id (give the tokenizer the checkpoint was trained with).'
      )
    tokenizer.save(tok_dir)  # The suite's own file, what a run's data reads.
  tree = jax.tree.map(jnp.asarray, run_params(params))
  ckpt = Checkpointer(ckpt_dir)
  try:
    # Parameters only: a run restoring it starts its optimizer fresh.
    state = state_lib.TrainState(
      step=jnp.zeros((), jnp.int32), params=tree, opt_state={},
      ema_params=None, rng=jax.random.key(0),
      bad_step=jnp.full((), -1, jnp.int32),
    )  # fmt: skip
    ckpt.save(0, state, None, force=True)
    ckpt.wait()
  finally:
    ckpt.close()
  config = {**run_config, 'model': model_block(cfg)}
  paths.write_text(
    paths.join(out_dir, 'config.json'), json.dumps(config, indent=2)
  )
  source = dict(format='hf', arch='dit', param_dtype='float32',
                tokenizer_files=tok)  # fmt: skip
  paths.write_text(
    paths.join(out_dir, workdir_lib.SOURCE_FILE), json.dumps(source, indent=2)
  )
  return cfg


# ------------------------------------------------------------------ forward


def _layer_norm(x, scale, eps=1e-5):
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  return (x32 - mean) * jax.lax.rsqrt(var + eps) * scale


def time_features(sigma_B: jax.Array, dim: int = FREQ_DIM) -> jax.Array:
  """[cos, sin] of sigma * 1e4^(-j / half): the DiT's time input."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(half) / half)
  args_BxF = sigma_B[:, None].astype(jnp.float32) * freqs[None]
  return jnp.concatenate([jnp.cos(args_BxF), jnp.sin(args_BxF)], -1)


def dit_logits(params, tokens_BxL: jax.Array, sigma_B: jax.Array):
  """The DiT's output [B, L, V] (raw; MDLM's parameterisation is applied
  by its process) for ids and noise levels sigma_B."""
  p = lambda *path: params[path]
  depth = 1 + max(k[1] for k in params if k[0] == 'blocks')
  x_BxLxD = jnp.take(p('embedding'), tokens_BxL, axis=0)
  h_BxC = time_features(sigma_B) @ p('time_mlp', 0, 'kernel')
  h_BxC = jax.nn.silu(h_BxC + p('time_mlp', 0, 'bias'))
  c_BxC = h_BxC @ p('time_mlp', 1, 'kernel') + p('time_mlp', 1, 'bias')
  c_BxC = jax.nn.silu(c_BxC)
  for i in range(depth):
    b = lambda *path, i=i: p('blocks', i, *path)
    mod_Bx6xD = jnp.einsum('bc,cpd->bpd', c_BxC, b('modulation', 'kernel'))
    mod_Bx6xD = mod_Bx6xD + b('modulation', 'bias')
    shift1, scale1, gate1, shift2, scale2, gate2 = [
      mod_Bx6xD[:, j, None] for j in range(6)
    ]
    h = _layer_norm(x_BxLxD, b('norm1', 'scale')) * (1 + scale1) + shift1
    qkv_BxLx3xHxK = jnp.einsum('bld,dphk->blphk', h, b('attn', 'qkv', 'kernel'))
    q, k, v = jnp.transpose(qkv_BxLx3xHxK, (2, 0, 3, 1, 4))
    o_BxHxLxK = attend(rotary(q), rotary(k), v, causal=False)
    o_BxLxD = jnp.einsum('bhlk,hkd->bld', o_BxHxLxK, b('attn', 'out', 'kernel'))
    x_BxLxD = x_BxLxD + gate1 * o_BxLxD
    h = _layer_norm(x_BxLxD, b('norm2', 'scale')) * (1 + scale2) + shift2
    h = jax.nn.gelu(h @ b('mlp', 'up', 'kernel') + b('mlp', 'up', 'bias'))
    h = h @ b('mlp', 'down', 'kernel') + b('mlp', 'down', 'bias')
    x_BxLxD = x_BxLxD + gate2 * h
  mod_Bx2xD = jnp.einsum(
    'bc,cpd->bpd', c_BxC, p('final_modulation', 'kernel')
  ) + p('final_modulation', 'bias')
  shift, scale = mod_Bx2xD[:, 0, None], mod_Bx2xD[:, 1, None]
  h = _layer_norm(x_BxLxD, p('final_norm', 'scale')) * (1 + scale) + shift
  return h @ p('head', 'kernel') + p('head', 'bias')


def mdlm_nelbo_per_token(
  params, x_BxL: jax.Array, key: jax.Array, *, eps: float = 1e-3,
  time_conditioning: bool = False,
) -> jax.Array:  # fmt: skip
  """One-sample continuous-time MDLM bound per token (nats), [B].

  Log-linear schedule sigma(t) = -log(1 - (1 - eps) t), mask id V - 1
  (MDLM appends the mask to the tokenizer's vocabulary), the SUBS
  parameterisation (mask logit removed, unmasked positions copied), and
  the weight sigma'(t) / expm1(sigma(t)) on the masked positions.
  """
  vocab = params[('embedding',)].shape[0]
  mask_id = vocab - 1
  k_t, k_m = jax.random.split(key)
  batch = x_BxL.shape[0]
  t_B = jax.random.uniform(k_t, (batch,), minval=eps, maxval=1.0)
  sigma_B = -jnp.log1p(-(1 - eps) * t_B)
  dsigma_B = (1 - eps) / (1 - (1 - eps) * t_B)
  move_B = -jnp.expm1(-sigma_B)
  masked_BxL = jax.random.uniform(k_m, x_BxL.shape) < move_B[:, None]
  z_BxL = jnp.where(masked_BxL, mask_id, x_BxL)
  sigma_in = sigma_B if time_conditioning else jnp.zeros_like(sigma_B)
  logits = dit_logits(params, z_BxL, sigma_in).astype(jnp.float32)
  logits = logits.at[..., mask_id].set(-jnp.inf)
  logp_BxL = jnp.take_along_axis(
    jax.nn.log_softmax(logits, -1), x_BxL[..., None], -1
  )[..., 0]
  weight_B = dsigma_B / jnp.expm1(sigma_B)
  nll_BxL = jnp.where(masked_BxL, -logp_BxL, 0.0) * weight_B[:, None]
  return nll_BxL.mean(-1)
