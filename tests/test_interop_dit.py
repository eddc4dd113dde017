"""The MDLM / Duo / BD3-LM DiT layout: name mapping and the published model.

The layout is read from MDLM's public `models/dit.py` (not a package, so
there is no reference to import): the mapping is tested on a random state
dict of that layout, value by value; the forward pass is compared with a
torch transcription of the layout's arithmetic written in this file; the
run backbone 'dit' (`models.dit.DiT`) is compared with that pass on the
same converted parameters and run through `experiments.run` and
`experiments.convert`; the published OpenWebText checkpoint is used only
when it is already in the local Hugging Face cache.
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


def test_load_dir_and_bound(tmp_path):
  _write_checkpoint(tmp_path)
  cfg, params = dit.load_dir(str(tmp_path))
  assert (cfg['width'], cfg['depth'], cfg['vocab_size']) == (D, DEPTH, V)
  assert params[('blocks', 0, 'attn', 'qkv', 'kernel')].shape == (D, 3, H, K)
  x = jnp.asarray(np.random.default_rng(0).integers(0, V - 1, (2, 16)))
  nelbo = dit.mdlm_nelbo_per_token(params, x, jax.random.key(0))
  assert nelbo.shape == (2,) and np.isfinite(np.asarray(nelbo)).all()


def _write_checkpoint(folder, vocab=V, **config):
  """A DiT checkpoint folder: safetensors of `_state` and config.json."""
  safetensors_numpy = pytest.importorskip('safetensors.numpy')
  state = _state('backbone.')
  if vocab != V:  # Resize the vocabulary tensors (tokenizer + mask).
    rng = np.random.default_rng(3)
    for name in ('vocab_embed.embedding', 'output_layer.linear.weight'):
      state['backbone.' + name] = rng.normal(size=(vocab, D)).astype(np.float32)
    state['backbone.output_layer.linear.bias'] = rng.normal(size=vocab).astype(
      np.float32
    )
  safetensors_numpy.save_file(state, str(folder / 'model.safetensors'))
  (folder / 'config.json').write_text(json.dumps(dict(
    hidden_dim=D, n_blocks=DEPTH, n_heads=H, cond_dim=C, vocab_size=vocab,
    **config,
  )))  # fmt: skip
  return state


# ------------------------------------------------- the 'dit' run backbone


def _dit(params, *, out=V, **kw):
  """A models.dit.DiT of the test's shape holding `params` (our paths)."""
  from flax import nnx

  from ddlm_jax.models.dit import DiT, DiTConfig

  cfg = DiTConfig(vocab_size=out, input_vocab_size=V, width=D, depth=DEPTH,
                  num_heads=H, cond_dim=C, **kw)  # fmt: skip
  model = DiT(cfg, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  tree = jax.tree.map(jnp.asarray, dit.as_tree(params))
  nnx.replace_by_pure_dict(state, tree)
  nnx.update(model, state)
  return model


def _close(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_backbone_matches_the_pass_time_free():
  params = dit.from_state_dict(_state(''), H)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, V, (2, 12)))
  t_B = jnp.array([0.3, 0.9])  # Read by neither: sigma = 0.
  want = dit.dit_logits(params, tokens, jnp.zeros(2))
  _close(_dit(params)(tokens, t_B), want)
  _close(_dit(params)(tokens), want)
  # The time MLP matters: a nonzero sigma gives other logits.
  assert np.abs(np.asarray(want - dit.dit_logits(params, tokens, t_B))).max()


@pytest.mark.parametrize('time_input', ['t', 'loglinear_sigma'])
def test_backbone_matches_the_pass_time_conditioned(time_input):
  params = dit.from_state_dict(_state(''), H)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, V, (3, 10)))
  t_B = jnp.array([0.05, 0.5, 1.0])
  sigma_B = t_B if time_input == 't' else -jnp.log1p(-(1 - 1e-3) * t_B)
  model = _dit(params, time_conditioning=True, time_input=time_input)
  _close(model(tokens, t_B), dit.dit_logits(params, tokens, sigma_B))
  with pytest.raises(ValueError, match='pass t_B'):
    model(tokens)


def test_run_params_drop_the_mask_logit_only():
  params = dit.from_state_dict(_state(''), H)
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, V, (2, 8)))
  want = dit.dit_logits(params, tokens, jnp.zeros(2))[..., :-1]
  from flax import nnx

  from ddlm_jax.models.dit import DiT, DiTConfig

  cfg = DiTConfig(vocab_size=V - 1, input_vocab_size=V, width=D,
                  depth=DEPTH, num_heads=H, cond_dim=C)  # fmt: skip
  model = DiT(cfg, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(
    state, jax.tree.map(jnp.asarray, dit.run_params(params))
  )
  nnx.update(model, state)
  _close(model(tokens), want)


def test_backbone_gradients_are_finite_and_reach_every_parameter():
  from flax import nnx

  params = dit.from_state_dict(_state(''), H)
  model = _dit(params, time_conditioning=True)
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, V, (2, 8)))
  t_B = jnp.array([0.2, 0.7])

  def loss(m):
    logp = jax.nn.log_softmax(m(tokens, t_B), -1)
    return -jnp.take_along_axis(logp, tokens[..., None], -1).mean()

  grads = nnx.grad(loss)(model)
  leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads))
  assert len(leaves) == len(params)
  for path, g in leaves:
    g = np.asarray(g)
    assert np.isfinite(g).all(), path
    assert np.abs(g).max() > 0, path


def test_run_config_refuses_what_the_dit_cannot_run():
  from ddlm_jax.models.backbones import get_backbone
  from ddlm_jax.training import builders
  from ddlm_jax.training.config import ConfigError
  from experiments.configs import common

  def process(kind):
    c = common.base_config()
    common.set_process(c, kind)
    return builders.make_process(builders.process_settings(c.process), 9)

  spec = get_backbone('dit')
  ok = process('mdlm')  # 9 tokens out, 10 in (the mask id).
  mcfg = spec.config({'backbone': 'dit', 'width': 32, 'mlp_kind': 'swiglu'},
                     ok)  # fmt: skip
  assert (mcfg.vocab_size, mcfg.input_vocab_size, mcfg.width) == (9, 10, 32)
  with pytest.raises(ConfigError, match="does not take: \\['head_bias'\\]"):
    spec.config({'backbone': 'dit', 'head_bias': True}, ok)
  with pytest.raises(ConfigError, match='autoregressive'):
    spec.config({}, process('ar'))
  with pytest.raises(ConfigError, match='block-diffusion'):
    spec.config({}, process('bd3'))
  with pytest.raises(ConfigError, match='even head size'):
    spec.config({'width': 36, 'num_heads': 4}, ok)
  with pytest.raises(ConfigError, match='time_input'):
    spec.config({'time_input': 'sigma'}, ok)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_run_trains_evaluates_and_samples_the_dit(tmp_path):
  import subprocess
  import sys

  work = tmp_path / 'run'
  cmd = [sys.executable, '-m', 'experiments.run', f'--workdir={work}',
         '--config=experiments/configs/quickstart.py:smoke',
         '--config.model.backbone=dit']  # fmt: skip
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  saved = json.loads((work / 'config.json').read_text())
  assert saved['model']['backbone'] == 'dit'
  summary = json.loads((work / 'summary.json').read_text())
  assert summary['validation']['bits_per_token'] > 0
  assert (work / 'samples.txt').read_text().count('=== sample') > 0


def _byte_bpe(folder):
  """A small byte-level BPE tokenizer (the `tokenizers` library's own);
  its vocabulary size."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=90,
                                special_tokens=['<|endoftext|>'])  # fmt: skip
  tok.train_from_iterator(['the cat sat on the mat'] * 20, trainer)
  tok.save(str(folder / 'tokenizer.json'))
  return tok.get_vocab_size()


@pytest.mark.slow
def test_converted_dit_is_a_run_of_backbone_dit(tmp_path):
  """experiments.convert --arch=dit writes a run directory: its config
  names backbone 'dit', load_run restores the converted parameters (the
  run's logits are the pass's, less the mask logit), and --mode=sample and
  --mode=eval run it."""
  from ddlm_jax.tasks.language_model import load_config, load_run
  from experiments import convert, modes

  src = tmp_path / 'hf'
  src.mkdir()
  vocab = _byte_bpe(src)
  state = _write_checkpoint(src, vocab=vocab + 1)
  work = tmp_path / 'work'
  args = ['--from=hf', '--arch=dit', str(src), f'--to={work}', '--seq_len=16']
  assert convert.main(args) == 0
  config = json.loads((work / 'config.json').read_text())
  assert config['model']['backbone'] == 'dit'
  text = tmp_path / 'val.txt'
  text.write_text('the cat sat on the mat. ' * 40)
  over = {
    'mesh.shape': (1, 1, 1), 'sample.num_samples': 2, 'sample.batch_size': 2,
    'sample.steps': 4, 'eval.batch_size': 2, 'eval.final_num_batches': 1,
    'eval.final_time_samples': 1, 'train.batch_size': 2,
    'data.corpus': 'text_files', 'data.files.train': str(text),
    'data.files.validation': str(text),
  }  # fmt: skip
  run = load_run(str(work), over)
  assert run.checkpointer.latest_step() == 0
  assert run.process.vocab_size == vocab
  params = dit.from_state_dict(state, H)
  np.testing.assert_array_equal(
    np.asarray(run.params['embedding']), params[('embedding',)]
  )
  tokens = jnp.asarray(np.random.default_rng(6).integers(0, vocab, (2, 16)))
  from flax import nnx

  model = nnx.merge(run.graphdef, run.params)
  got = model(tokens, jnp.array([0.5, 0.5]))
  _close(got, dit.dit_logits(params, tokens, jnp.zeros(2))[..., :-1])
  run.close()
  with pytest.raises(FileExistsError, match='empty directory'):
    convert.main(args)
  config = load_config(str(work), over)
  stats = modes.run(config, str(work), 'sample')
  assert stats['step'] == 0
  assert (work / 'samples.txt').read_text().count('=== sample') == 2
  result = modes.run(config, str(work), 'eval')
  assert result['step'] == 0 and np.isfinite(result['nats_per_token'])


def test_convert_refuses_a_tokenizer_without_room_for_the_mask(tmp_path):
  from ddlm_jax.training.config import ConfigError
  from experiments import convert

  src = tmp_path / 'hf'
  src.mkdir()
  vocab = _byte_bpe(src)
  _write_checkpoint(src, vocab=vocab)  # No extra id for the mask.
  args = ['--from=hf', '--arch=dit', str(src), f'--to={tmp_path / "w"}']
  with pytest.raises(ConfigError, match=f'{vocab} tokens, the DiT {vocab}'):
    convert.main(args)


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
