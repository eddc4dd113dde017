"""The MDLM / Duo / BD3-LM DiT layout: name mapping and the published model.

The layout is read from MDLM's public `models/dit.py` (not a package, so
there is no reference to import): the mapping is tested on a random state
dict of that layout, value by value; the forward pass is compared with a
torch transcription of the layout's arithmetic written in this file; the
published OpenWebText checkpoint is used only when it is already in the
local Hugging Face cache.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.interop import dit

D, H, C, V, DEPTH = 32, 4, 16, 50, 2
K = D // H


def _state(prefix='backbone.', seed=0):
  """A random state dict with the DiT's names and torch shapes."""
  rng = np.random.default_rng(seed)
  r = lambda *shape: rng.normal(size=shape).astype(np.float32) * 0.3
  s = {
    'vocab_embed.embedding': r(V, D),
    'sigma_map.mlp.0.weight': r(C, dit.FREQ_DIM),
    'sigma_map.mlp.0.bias': r(C),
    'sigma_map.mlp.2.weight': r(C, C),
    'sigma_map.mlp.2.bias': r(C),
    'rotary_emb.inv_freq': r(K // 2),
    'output_layer.norm_final.weight': 1 + r(D),
    'output_layer.adaLN_modulation.weight': r(2 * D, C),
    'output_layer.adaLN_modulation.bias': r(2 * D),
    'output_layer.linear.weight': r(V, D),
    'output_layer.linear.bias': r(V),
  }
  for i in range(DEPTH):
    b = f'blocks.{i}.'
    s.update({
      b + 'norm1.weight': 1 + r(D),
      b + 'attn_qkv.weight': r(3 * D, D),
      b + 'attn_out.weight': r(D, D),
      b + 'norm2.weight': 1 + r(D),
      b + 'mlp.0.weight': r(4 * D, D),
      b + 'mlp.0.bias': r(4 * D),
      b + 'mlp.2.weight': r(D, 4 * D),
      b + 'mlp.2.bias': r(D),
      b + 'adaLN_modulation.weight': r(6 * D, C),
      b + 'adaLN_modulation.bias': r(6 * D),
    })  # fmt: skip
  return {prefix + k: v for k, v in s.items()}


@pytest.mark.parametrize('prefix', ['', 'backbone.'])
def test_every_tensor_lands_where_the_layout_says(prefix):
  state = _state(prefix)
  ours = dit.from_state_dict(state, H)
  assert len(ours) == len(state) - 1  # All but the rotary buffer.
  g = lambda name: state[prefix + name]
  qkv = g('blocks.1.attn_qkv.weight')  # rows laid out (three, h, d)
  kern = ours[('blocks', 1, 'attn', 'qkv', 'kernel')]
  assert kern.shape == (D, 3, H, K)
  for part, head, j, col in [(0, 0, 0, 3), (1, 2, 5, 7), (2, 3, 7, 31)]:
    assert kern[col, part, head, j] == qkv[part * D + head * K + j, col]
  out = ours[('blocks', 0, 'attn', 'out', 'kernel')]
  assert out.shape == (H, K, D)
  assert out[2, 3, 5] == g('blocks.0.attn_out.weight')[5, 2 * K + 3]
  mod = ours[('blocks', 0, 'modulation', 'kernel')]
  assert mod.shape == (C, 6, D)  # chunks: shift, scale, gate (x2)
  assert mod[4, 2, 9] == g('blocks.0.adaLN_modulation.weight')[2 * D + 9, 4]
  bias = ours[('blocks', 0, 'modulation', 'bias')]
  assert bias[5, 1] == g('blocks.0.adaLN_modulation.bias')[5 * D + 1]
  fin = ours[('final_modulation', 'kernel')]
  assert fin.shape == (C, 2, D)
  head = ours[('head', 'kernel')]
  assert (
    head.shape == (D, V) and head[3, 7] == g('output_layer.linear.weight')[7, 3]
  )
  up = ours[('blocks', 1, 'mlp', 'up', 'kernel')]
  assert up.shape == (D, 4 * D)
  np.testing.assert_array_equal(
    ours[('embedding',)], g('vocab_embed.embedding')
  )


def test_unknown_and_missing_names_refused():
  state = _state('')
  with pytest.raises(KeyError, match='not a tensor of the MDLM'):
    dit.from_state_dict({**state, 'blocks.0.attn.c_attn.weight': 0}, H)
  del state['blocks.1.mlp.2.bias']
  with pytest.raises(KeyError, match='lacks'):
    dit.from_state_dict(state, H)


def _torch_dit(state, tokens, sigma):
  """The DiT's arithmetic, transcribed in torch from the layout's code."""
  torch = pytest.importorskip('torch', reason='needs torch (interop extra)')
  F = torch.nn.functional
  t = {k: torch.tensor(v) for k, v in state.items()}
  x = t['vocab_embed.embedding'][torch.tensor(tokens)]
  half = dit.FREQ_DIM // 2
  freqs = torch.exp(-np.log(10_000.0) * torch.arange(half) / half)
  args = torch.tensor(sigma)[:, None] * freqs[None]
  emb = torch.cat([torch.cos(args), torch.sin(args)], -1)
  lin = lambda h, n, bias=True: F.linear(
    h, t[n + '.weight'], t[n + '.bias'] if bias else None
  )
  c = F.silu(lin(F.silu(lin(emb, 'sigma_map.mlp.0')), 'sigma_map.mlp.2'))
  ln = lambda h, n: F.layer_norm(h, [D]) * t[n]
  inv = 1.0 / (10_000 ** (torch.arange(0, K, 2).float() / K))
  ang = torch.arange(x.shape[1]).float()[:, None] * inv[None]
  cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
  rot = lambda q: q * cos + torch.cat([-q[..., K // 2:], q[..., :K // 2]],
                                      -1) * sin  # fmt: skip
  for i in range(DEPTH):
    b = f'blocks.{i}.'
    m = lin(c, b + 'adaLN_modulation')[:, None].chunk(6, dim=2)
    h = ln(x, b + 'norm1.weight') * (1 + m[1]) + m[0]
    qkv = lin(h, b + 'attn_qkv', False).view(*h.shape[:2], 3, H, K)
    q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
    o = F.scaled_dot_product_attention(rot(q), rot(k), v)
    o = o.transpose(1, 2).reshape(*h.shape[:2], D)
    x = x + m[2] * lin(o, b + 'attn_out', False)
    h = ln(x, b + 'norm2.weight') * (1 + m[4]) + m[3]
    h = lin(F.gelu(lin(h, b + 'mlp.0'), approximate='tanh'), b + 'mlp.2')
    x = x + m[5] * h
  shift, scale = lin(c, 'output_layer.adaLN_modulation')[:, None].chunk(2, 2)
  h = ln(x, 'output_layer.norm_final.weight') * (1 + scale) + shift
  return lin(h, 'output_layer.linear').numpy()


def test_forward_matches_torch_transcription():
  state = _state('')
  tokens = np.random.default_rng(1).integers(0, V, (2, 12))
  sigma = np.array([0.3, 2.0], np.float32)
  want = _torch_dit(state, tokens, sigma)
  params = dit.from_state_dict(state, H)
  got = np.asarray(dit.dit_logits(params, jnp.asarray(tokens), sigma))
  assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_convert_dir_and_bound(tmp_path):
  safetensors_numpy = pytest.importorskip('safetensors.numpy')
  safetensors_numpy.save_file(
    _state('backbone.'), str(tmp_path / 'model.safetensors')
  )
  (tmp_path / 'config.json').write_text(json.dumps(dict(
    hidden_dim=D, n_blocks=DEPTH, n_heads=H, cond_dim=C, vocab_size=V,
  )))  # fmt: skip
  n = dit.convert_dir(str(tmp_path), str(tmp_path / 'out'))
  assert n == len(_state()) - 1
  saved = np.load(tmp_path / 'out' / dit.PARAMS_FILE)
  assert saved['blocks/0/attn/qkv/kernel'].shape == (D, 3, H, K)
  from ddlm_jax.interop import workdir
  from ddlm_jax.training.config import ConfigError

  with pytest.raises(ConfigError, match="'dit' model"):
    workdir.read_config(str(tmp_path / 'out'))
  _, params = dit.load_dir(str(tmp_path))
  x = jnp.asarray(np.random.default_rng(0).integers(0, V - 1, (2, 16)))
  nelbo = dit.mdlm_nelbo_per_token(params, x, jax.random.key(0))
  assert nelbo.shape == (2,) and np.isfinite(np.asarray(nelbo)).all()


def _cached_mdlm_owt():
  hub = pytest.importorskip('huggingface_hub')
  try:
    return hub.snapshot_download('kuleshov-group/mdlm-owt',
                                 local_files_only=True)  # fmt: skip
  except Exception:  # Not cached: nothing is downloaded here.
    pytest.skip('kuleshov-group/mdlm-owt is not in the local HF cache')


@pytest.mark.slow
def test_published_mdlm_owt_loads_with_a_finite_bound():
  src = _cached_mdlm_owt()
  cfg, params = dit.load_dir(src)
  assert cfg['vocab_size'] == 50258 and cfg['width'] == 768
  params = {k: jnp.asarray(v) for k, v in params.items()}
  x = jnp.asarray(
    np.random.default_rng(0).integers(0, 50257, (2, 128)), jnp.int32
  )
  nelbo = dit.mdlm_nelbo_per_token(params, x, jax.random.key(0))
  assert np.isfinite(np.asarray(nelbo)).all()
  assert os.path.isdir(src)
