"""The entropy-bound canvas sampler against transformers' generate.

Both run the same tiny converted model on the same noise: the torch side's
random draws (canvas initialisation and renoising through
`EntropyBoundSampler`, token draws through `torch.multinomial`) are
replaced by replays of the arrays our sampler takes, with Gumbel-max for
the multinomial draw. Tokens, the positions accepted at every step, the
number of denoising steps per canvas and tokens per decoder call must
agree.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from ddlm_jax.sampling.entropy_bound_canvas import (
  EntropyBoundCanvasConfig,
  draw_noise,
  entropy_bound_accept,
  generate,
  temperature,
)
from ddlm_jax.training.config import ConfigError


def test_entropy_bound_accepts_the_low_entropy_prefix():
  entropy = np.array([[0.5, 0.01, 0.3, 0.02, 2.0]], np.float32)
  # Sorted: 0.01, 0.02, 0.3, 0.5, 2.0; prefix sums minus max:
  # 0, 0.01, 0.03, 0.33, 0.83 -> bound 0.1 keeps the first three.
  got = np.asarray(entropy_bound_accept(entropy, 0.1))
  assert got.tolist() == [[False, True, True, True, False]]
  # The lowest-entropy position is always accepted.
  assert np.asarray(entropy_bound_accept(entropy, 1e-6)).sum() == 1


def test_temperature_is_linear_from_t_max():
  cfg = EntropyBoundCanvasConfig(max_denoising_steps=4, t_min=0.4, t_max=0.8)
  assert [float(temperature(n, cfg)) for n in (4, 2, 0)] == pytest.approx(
    [0.8, 0.6, 0.4]
  )


def test_bad_settings_refused():
  with pytest.raises(ConfigError, match='t_min'):
    EntropyBoundCanvasConfig(t_min=0.9, t_max=0.8)
  with pytest.raises(ConfigError, match='entropy_bound'):
    EntropyBoundCanvasConfig(entropy_bound=0.0)


SETTINGS = [
  # (max_new_tokens, steps, bound, stability, confidence, prompt length,
  #  Gumbel scale: 0 makes every draw the argmax, so canvases settle)
  (16, 6, 0.1, 1, 0.005, 5, 1.0),
  (16, 5, 1.0, 0, 5.0, 3, 1.0),  # confident at once: early stop after a step
  pytest.param(
    (20, 8, 0.5, 2, 1.5, 9, 1.0),  # three canvases, a prompt past the window
    marks=pytest.mark.slow,
  ),
  pytest.param(
    (16, 10, 100.0, 1, 4.2, 6, 0.0),  # greedy, every position accepted
    marks=pytest.mark.slow,
  ),
]


class _Replay:
  """Feeds pre-drawn noise to transformers' sampler and multinomial."""

  def __init__(self, noise):
    import torch

    self.torch = torch
    self.noise = [torch.as_tensor(np.array(a)) for a in noise]
    self.canvas, self.step = -1, 0
    self.accepted: list[list[np.ndarray]] = []

  def initialize_canvas(self, sampler, batch_size, device):
    self.canvas, self.step = self.canvas + 1, 0
    self.accepted.append([])
    return self.noise[0][self.canvas].long()

  def multinomial(self, probs, num_samples=1):
    g = self.noise[1][self.canvas, self.step].reshape(probs.shape)
    return (probs.log() + g).argmax(-1, keepdim=True)

  def renoise_canvas(self, sampler, accepted_canvas, cur_step):
    mask = sampler.accepted_token_mask
    self.accepted[-1].append(mask.numpy().copy())
    fresh = self.noise[2][self.canvas, self.step].long()
    self.step += 1
    return self.torch.where(mask, accepted_canvas, fresh)


@pytest.fixture(scope='module')
def models(tmp_path_factory):
  pytest.importorskip('torch', reason='the reference sampler needs torch')
  pytest.importorskip('transformers', reason='the reference needs transformers')
  from test_diffusion_gemma import tiny_torch_model

  from ddlm_jax.interop.diffusion_gemma import load_diffusion_gemma

  # Weights large enough for uneven entropies, small enough that the
  # self-conditioning loop does not amplify float32 rounding step by step.
  torch_model = tiny_torch_model(4, 2, seed=3, init_std=0.05)
  path = tmp_path_factory.mktemp('dgemma_sampler')
  torch_model.save_pretrained(path)
  model, _ = load_diffusion_gemma(str(path))
  return torch_model, model


@pytest.mark.parametrize('setting', SETTINGS)
def test_matches_transformers_generate(models, monkeypatch, setting):
  import torch
  from transformers.models.diffusion_gemma import generation_diffusion_gemma
  from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
  )

  torch_model, model = models
  max_new, steps, bound, stability, confidence, P, gumbel_scale = setting
  cfg = EntropyBoundCanvasConfig(
    max_new_tokens=max_new,
    max_denoising_steps=steps,
    entropy_bound=bound,
    stability_threshold=stability,
    confidence_threshold=confidence,
  )
  B, C, V = 2, model.cfg.canvas_length, model.cfg.vocab_size
  n_canvases = -(-max_new // C)
  noise = draw_noise(jax.random.key(P), n_canvases, steps, B, C, V)
  noise = noise._replace(gumbel=gumbel_scale * noise[1])
  prompt = np.random.default_rng(P).integers(3, V, (B, P))

  replay = _Replay(noise)
  monkeypatch.setattr(
    EntropyBoundSampler,
    'initialize_canvas',
    lambda self, batch_size, device: replay.initialize_canvas(
      self, batch_size, device
    ),
  )
  monkeypatch.setattr(
    EntropyBoundSampler,
    'renoise_canvas',
    lambda self, c, s: replay.renoise_canvas(self, c, s),
  )
  monkeypatch.setattr(
    generation_diffusion_gemma.torch, 'multinomial', replay.multinomial
  )
  out = torch_model.generate(
    torch.as_tensor(prompt),
    max_new_tokens=max_new,
    max_denoising_steps=steps,
    sampler_config=EntropyBoundSamplerConfig(entropy_bound=bound),
    t_min=cfg.t_min,
    t_max=cfg.t_max,
    stability_threshold=stability,
    confidence_threshold=confidence,
    eos_token_id=model.cfg.eos_id,
    pad_token_id=model.cfg.pad_id,
  )
  ours = generate(model, prompt, cfg, noise=noise)

  np.testing.assert_array_equal(ours.tokens, out.sequences.numpy())
  assert [len(a) for a in ours.accepted] == [len(a) for a in replay.accepted]
  for mine, theirs in zip(ours.accepted, replay.accepted, strict=True):
    np.testing.assert_array_equal(mine, np.stack(theirs))
  np.testing.assert_allclose(
    ours.tokens_per_call, out.tokens_per_forward.numpy(), rtol=1e-6
  )
  print(
    f'setting {setting}: steps per canvas {[len(a) for a in ours.accepted]},'
    f' tokens per decoder call {ours.tokens_per_call.tolist()}'
  )


def test_noise_shapes_checked(models):
  _, model = models
  cfg = EntropyBoundCanvasConfig(max_new_tokens=8, max_denoising_steps=2)
  noise = draw_noise(jax.random.key(0), 1, 3, 1, model.cfg.canvas_length, 64)
  with pytest.raises(ValueError, match='noise shapes'):
    generate(model, np.ones((1, 3), int), cfg, noise=noise)
  result = generate(
    model, np.ones((1, 3), int), dataclasses.replace(cfg), key=jax.random.key(1)
  )
  assert result.tokens.shape == (1, 3 + model.cfg.canvas_length)
  assert 1 <= result.decoder_calls[0] <= 2


def test_random_model_runs_without_torch():
  """A freshly initialised model samples: the same key gives the same
  tokens, every step accepts at least its lowest-entropy position, and
  calls per row stay within the step cap (runs where torch is absent)."""
  from flax import nnx

  from ddlm_jax.models.diffusion_gemma import (
    DiffusionGemma,
    DiffusionGemmaConfig,
  )

  mcfg = DiffusionGemmaConfig(
    vocab_size=32, hidden_size=32, intermediate_size=32, num_heads=2,
    num_kv_heads=1, head_dim=8, global_head_dim=16, sliding_window=4,
    num_experts=2, top_k_experts=1, moe_intermediate_size=16,
    canvas_length=4, eos_id=None,
  )  # fmt: skip
  model = DiffusionGemma(mcfg, rngs=nnx.Rngs(0))
  cfg = EntropyBoundCanvasConfig(max_new_tokens=8, max_denoising_steps=3)
  prompt = np.arange(3, 8)[None].repeat(2, 0)
  a = generate(model, prompt, cfg, key=jax.random.key(0))
  b = generate(model, prompt, cfg, key=jax.random.key(0))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert a.tokens.shape == (2, 5 + 8)
  np.testing.assert_array_equal(a.tokens[:, :5], prompt)
  assert all((m.sum(-1) >= 1).all() for m in a.accepted)
  assert ((a.decoder_calls >= 2) & (a.decoder_calls <= 6)).all()
