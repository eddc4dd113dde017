"""Logit parity of the JAX DiffusionGemma with transformers' own model.

A tiny random `DiffusionGemmaForBlockDiffusion` (a layer pattern with both
layer types, a sliding window shorter than the sequence, separate head
settings and proportional rotary on full layers) is saved with
`save_pretrained`, converted with `ddlm_jax.interop.diffusion_gemma`, and
both models' encoder and decoder logits are compared. Norm scales, router
scales and layer scalars are randomised first: at their init value (one)
a wrong mapping of them would go unnoticed.
"""

from __future__ import annotations

import copy

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch', reason='parity needs torch')
transformers = pytest.importorskip(
  'transformers', reason='parity needs transformers'
)

from ddlm_jax.interop.diffusion_gemma import (  # noqa: E402
  config_from_hf,
  load_diffusion_gemma,
)
from ddlm_jax.models.diffusion_gemma import DiffusionGemmaConfig  # noqa: E402
from ddlm_jax.training.config import ConfigError  # noqa: E402

# Jitted once per model structure: far faster than op-by-op dispatch.
_encode_fn = lambda model, tokens, cache: model.encode(tokens, cache)
_decode_fn = lambda model, canvas, cache, sc, mask: model.decode(
  canvas, cache, sc, mask
)
_encode, _decode = nnx.jit(_encode_fn), nnx.jit(_decode_fn)

ATTN = 'eager'
TINY_VISION = {
  'model_type': 'gemma4_vision',
  'hidden_size': 16,
  'intermediate_size': 16,
  'num_hidden_layers': 1,
  'num_attention_heads': 2,
  'num_key_value_heads': 2,
  'head_dim': 8,
  'position_embedding_size': 8,
}


def tiny_torch_model(
  num_experts: int, top_k: int, seed: int = 0, init_std: float = 0.02,
  canvas_length: int = 8,
):  # fmt: skip
  """A random tiny torch DiffusionGemma in eval mode."""
  from transformers import DiffusionGemmaConfig as HFConfig
  from transformers import DiffusionGemmaForBlockDiffusion
  from transformers.models.diffusion_gemma import (
    configuration_diffusion_gemma as hf_config,
  )

  torch.manual_seed(seed)
  text = hf_config.DiffusionGemmaTextConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    sliding_window=4,
    layer_types=['sliding_attention', 'full_attention', 'full_attention'],
    num_experts=num_experts,
    top_k_experts=top_k,
    moe_intermediate_size=16,
    global_head_dim=16,
    num_global_key_value_heads=1,
    max_position_embeddings=256,
    initializer_range=init_std,
  )
  cfg = HFConfig(
    text_config=text,
    vision_config=TINY_VISION,
    canvas_length=canvas_length,
    initializer_range=init_std,
  )
  cfg._attn_implementation = ATTN
  model = DiffusionGemmaForBlockDiffusion(cfg).eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, tensor in model.named_parameters():
      if tensor.ndim == 1 and 'vision' not in name:
        tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
      elif name.endswith('router.proj.weight'):
        # Decisive routing: near-uniform router scores (the init's) make
        # top-k a coin toss that any rounding difference can flip.
        tensor.copy_(torch.randn(tensor.shape, generator=gen))
    for name, buf in model.named_buffers():
      if name.endswith('layer_scalar'):
        buf.copy_(0.5 + torch.rand(buf.shape, generator=gen))
  return model


def _torch_logits(model, prompt, canvas, sc_logits, sc_mask):
  with torch.no_grad():
    out = model(
      input_ids=torch.as_tensor(prompt),
      decoder_input_ids=torch.as_tensor(canvas),
      self_conditioning_logits=None
      if sc_logits is None
      else torch.tensor(np.array(sc_logits)).to(model.dtype),
      self_conditioning_mask=None
      if sc_mask is None
      else torch.as_tensor(sc_mask),
    )
    enc_hidden = out.encoder_last_hidden_state
    enc_logits = model.lm_head(enc_hidden).float()
    cap = model.final_logit_softcapping
    enc_logits = torch.tanh(enc_logits / cap) * cap
  return enc_logits.numpy(), out.logits.float().numpy()


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """{variant: (torch model, checkpoint dir)} for dense-like and MoE."""
  out = {}
  for variant, (experts, k) in {'single_expert': (1, 1), 'moe': (4, 2)}.items():
    model = tiny_torch_model(experts, k)
    path = tmp_path_factory.mktemp(variant)
    model.save_pretrained(path)
    out[variant] = (model, str(path))
  return out


def _cases():
  """(variant, dtype, tol, self_cond); the fast subset covers each path
  once, the rest is marked slow."""
  fast = {
    ('moe', 'float32', 'none'),
    ('moe', 'float32', 'all'),
    ('moe', 'bfloat16', 'masked'),
    ('single_expert', 'float32', 'masked'),
  }
  for variant in ('single_expert', 'moe'):
    for dtype, tol in (('float32', 1e-4), ('bfloat16', 2e-2)):
      for self_cond in ('none', 'all', 'masked'):
        marks = () if (variant, dtype, self_cond) in fast else pytest.mark.slow
        yield pytest.param(variant, dtype, tol, self_cond, marks=marks)


@pytest.mark.parametrize('variant,dtype,tol,self_cond', list(_cases()))
def test_logits_match_transformers(saved, variant, dtype, tol, self_cond):
  torch_model, path = saved[variant]
  torch_model = copy.deepcopy(torch_model).to(getattr(torch, dtype))
  model, cfg = load_diffusion_gemma(path, dtype=dtype)
  rng = np.random.default_rng(0)
  B, P, C = 2, 7, cfg.canvas_length  # prompt longer than the window (4)
  prompt = rng.integers(0, cfg.vocab_size, (B, P))
  canvas = rng.integers(0, cfg.vocab_size, (B, C))
  sc_logits = sc_mask = None
  if self_cond != 'none':
    sc_logits = (3.0 * rng.standard_normal((B, C, cfg.vocab_size))).astype(
      np.float32
    )
  if self_cond == 'masked':
    sc_mask = np.array([True, False])
  want_enc, want_dec = _torch_logits(
    torch_model, prompt, canvas, sc_logits, sc_mask
  )
  # bfloat16 runs op by op: each op then rounds to bfloat16, as torch's
  # eager ops do. Under jit XLA keeps fused intermediates in float32
  # (excess precision), which on this model moves logits by up to ~0.1.
  encode, decode = (
    (_encode, _decode) if dtype == 'float32' else (_encode_fn, _decode_fn)
  )
  cache = model.init_cache(B, P + C)
  hidden, cache = encode(model, jnp.asarray(prompt), cache)
  got_enc = np.asarray(model.logits(hidden))
  got_dec = np.asarray(
    decode(
      model,
      jnp.asarray(canvas),
      cache,
      None if sc_logits is None else jnp.asarray(sc_logits, dtype),
      None if sc_mask is None else jnp.asarray(sc_mask),
    )
  )
  err_enc = np.abs(got_enc - want_enc).max()
  err_dec = np.abs(got_dec - want_dec).max()
  assert err_enc <= tol
  assert err_dec <= tol
  # Not vacuous: the logits spread well beyond the bfloat16 bound (and the
  # float32 one by three orders of magnitude).
  assert want_enc.std() > 0.05 and want_dec.std() > 0.05


def test_encoder_cache_extends_in_pieces(saved):
  """Encoding a prompt in two pieces gives the cache of encoding it once
  (the sliding window reaches back into the earlier piece)."""
  _, path = saved['moe']
  model, cfg = load_diffusion_gemma(path)
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 11))
  whole = _encode(model, jnp.asarray(tokens), model.init_cache(2, 16))[1]
  cache = model.init_cache(2, 16)
  _, cache = _encode(model, jnp.asarray(tokens[:, :6]), cache)
  _, cache = _encode(model, jnp.asarray(tokens[:, 6:]), cache)
  assert int(cache.length) == 11
  for a, b in zip(whole.keys + whole.values, cache.keys + cache.values):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_vision_and_unsupported_configs_refused(saved):
  with pytest.raises(ConfigError, match='text only'):
    DiffusionGemmaConfig(vision=True)
  _, path = saved['moe']
  import json
  import os

  with open(os.path.join(path, 'config.json')) as f:
    hf = json.load(f)
  hf['text_config']['use_bidirectional_attention'] = 'all'
  with pytest.raises(ConfigError, match='use_bidirectional_attention'):
    config_from_hf(hf)


@pytest.mark.parametrize('variant', ['single_expert', 'moe'])
def test_jitted_bfloat16_as_close_to_float32_as_torch(saved, variant):
  """Under jit XLA rounds fewer intermediates than torch's eager bfloat16,
  so it is held to the float32 reference instead: within twice the error
  of torch's own bfloat16 model (the same order of rounding error)."""
  torch_model, path = saved[variant]
  rng = np.random.default_rng(2)
  prompt = rng.integers(0, 64, (2, 7))
  canvas = rng.integers(0, 64, (2, 8))
  sc = jnp.asarray(3.0 * rng.standard_normal((2, 8, 64)), jnp.bfloat16)
  sc32 = np.asarray(sc.astype(jnp.float32))
  _, ref = _torch_logits(torch_model, prompt, canvas, sc32, None)
  bf16 = copy.deepcopy(torch_model).to(torch.bfloat16)
  _, theirs = _torch_logits(bf16, prompt, canvas, sc32, None)
  model, _ = load_diffusion_gemma(path, dtype='bfloat16')
  _, cache = _encode(model, jnp.asarray(prompt), model.init_cache(2, 15))
  ours = np.asarray(_decode(model, jnp.asarray(canvas), cache, sc, None))
  torch_err = np.abs(theirs - ref).max()
  assert 0 < torch_err and np.abs(ours - ref).max() <= 2 * torch_err
