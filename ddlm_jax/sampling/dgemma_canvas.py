"""The entropy-bound canvas sampler in the registry, for 'dgemma' processes.

`ddlm_jax.sampling.entropy_bound_canvas.generate` is DiffusionGemma's
sampler with a host loop (early stops decided on the host, end-of-sequence
padding), checked token for token against the reference. This is the same
step (`entropy_bound_canvas.denoise_step`: temperature schedule, Gumbel draw,
entropy-bound acceptance, renoising, stable-and-confident stop) run
entirely under jit, so a run samples it through the registry like every
other sampler:

- the sequence is cut into canvases of the process's block size and
  filled left to right; each canvas's decoder steps run in a
  `lax.while_loop` until every row has stopped or the step cap is hit,
  and the encoder then writes the finished canvas into the KV cache;
- positions the caller fixed (a prompt) stay fixed: they start the canvas
  and are restored after every step, and a canvas with every position
  fixed runs no decoder step;
- the sequence has a fixed length, so there is no end-of-sequence padding.

NFE counts decoder calls of the batch (a step counts while any row is
still denoising); the encoder's one pass per canvas is not counted.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.dgemma import FAMILY, DGemmaDiffusion
from ddlm_jax.sampling.base import Sampler, require_int
from ddlm_jax.sampling.entropy_bound_canvas import (
  CanvasNoise,
  EntropyBoundCanvasConfig,
  denoise_step,
  draw_noise,
)


def fill_canvases(
  model, z_BxL, given_BxL, noise: CanvasNoise, cfg: EntropyBoundCanvasConfig
):
  """(tokens_BxL, nfe): every canvas denoised under the entropy bound.

  `model` offers init_cache / encode / decode / cfg (DiffusionGemma or the
  run backbone); z_BxL holds the fixed tokens where given_BxL is True;
  noise is indexed [canvas, step, ...] as `draw_noise` makes it.
  """
  batch, length = z_BxL.shape
  num_canvases, _, canvas_len = noise.init_tokens.shape
  steps = cfg.max_denoising_steps
  vocab = noise.gumbel.shape[-1]

  def per_canvas(a_BxL):
    return jnp.swapaxes(a_BxL.reshape(batch, num_canvases, canvas_len), 0, 1)

  z_KxBxC = per_canvas(z_BxL.astype(jnp.int32))
  given_KxBxC = per_canvas(given_BxL)
  dtype = model.cfg.jnp_dtype

  def denoise(cache, z_BxC, given_BxC, k):
    fix = lambda a: jnp.where(given_BxC, z_BxC, a)
    canvas = fix(noise.init_tokens[k].astype(jnp.int32))
    sc = jnp.zeros((batch, canvas_len, vocab), dtype)
    history = jnp.full(
      (max(cfg.stability_threshold, 1), batch, canvas_len), -1, jnp.int32
    )
    finished = jnp.zeros((batch,), bool)

    def step(i, canvas, argmax, sc, history, finished, first):
      canvas, argmax, sc, history, finished, _ = denoise_step(
        model, canvas, argmax, sc, history, finished, cache,
        noise.gumbel[k, i], noise.renoise_tokens[k, i],
        jnp.float32(steps) - i, cfg, first,
      )  # fmt: skip
      return fix(canvas), fix(argmax), sc, history, finished

    state = step(0, canvas, canvas, sc, history, finished, True)

    def cond(carry):
      i, *_, finished = carry
      return (i < steps) & ~jnp.all(finished)

    def body(carry):
      i, *state = carry
      return (i + 1, *step(i, *state, False))

    i, _, argmax, *_ = jax.lax.while_loop(cond, body, (jnp.int32(1), *state))
    return argmax, i

  def canvas_step(carry, inputs):
    cache, nfe = carry
    z_BxC, given_BxC, k = inputs
    tokens_BxC, calls = jax.lax.cond(
      jnp.all(given_BxC),
      lambda: (z_BxC, jnp.int32(0)),
      lambda: denoise(cache, z_BxC, given_BxC, k),
    )
    _, cache = model.encode(tokens_BxC, cache)
    return (cache, nfe + calls), tokens_BxC

  cache = model.init_cache(batch, length)
  inputs = (z_KxBxC, given_KxBxC, jnp.arange(num_canvases))
  (_, nfe), tokens_KxBxC = jax.lax.scan(
    canvas_step, (cache, jnp.int32(0)), inputs
  )
  tokens_BxL = jnp.swapaxes(tokens_KxBxC, 0, 1).reshape(batch, length)
  return tokens_BxL, nfe


@dataclasses.dataclass(frozen=True, kw_only=True)
class EntropyBoundCanvasSampler(Sampler):
  """DiffusionGemma's sampler over the canvases of a 'dgemma' process.

  Attributes:
    num_steps: the step cap per canvas (the reference's
      max_denoising_steps, 48).
    entropy_bound: bound on the accepted positions' summed entropies
      minus their largest.
    t_min, t_max: the temperature is annealed linearly from t_max to t_min.
    stability_threshold: steps the argmax canvas must stay unchanged
      before a row may stop (0: no stability condition).
    confidence_threshold: mean entropy below which a stable row stops.
  temperature, top_k and top_p of the base are not used (the schedule is
  the temperature); they must stay at their neutral values.
  """

  name: ClassVar[str] = 'entropy_bound_canvas'
  families: ClassVar[tuple[str, ...]] = (FAMILY,)

  # The host sampler's defaults (the reference's), in one place.
  num_steps: int = EntropyBoundCanvasConfig.max_denoising_steps
  entropy_bound: float = EntropyBoundCanvasConfig.entropy_bound
  t_min: float = EntropyBoundCanvasConfig.t_min
  t_max: float = EntropyBoundCanvasConfig.t_max
  stability_threshold: int = EntropyBoundCanvasConfig.stability_threshold
  confidence_threshold: float = EntropyBoundCanvasConfig.confidence_threshold

  def __post_init__(self):
    super().__post_init__()
    if (self.temperature, self.top_k, self.top_p) != (1.0, 0, 1.0):
      raise ValueError(
        f'{self.name} anneals its own temperature and filters nothing; '
        'leave temperature=1, top_k=0, top_p=1 and set t_max / t_min.'
      )
    require_int('num_steps', self.num_steps, 1)
    require_int('stability_threshold', self.stability_threshold, 0)
    _ = self.canvas_config  # Checks the remaining ranges.

  @property
  def canvas_config(self) -> EntropyBoundCanvasConfig:
    """The settings in the host sampler's form."""
    return EntropyBoundCanvasConfig(
      max_denoising_steps=int(self.num_steps),
      entropy_bound=float(self.entropy_bound),
      t_min=float(self.t_min),
      t_max=float(self.t_max),
      stability_threshold=int(self.stability_threshold),
      confidence_threshold=float(self.confidence_threshold),
    )

  def check_applies(self, process) -> None:
    super().check_applies(process)
    if not isinstance(process, DGemmaDiffusion):
      raise TypeError(
        f'{self.name} needs a ddlm_jax.diffusion.dgemma.DGemmaDiffusion; '
        f'got {type(process).__name__}.'
      )

  def fill(self, apply, key, process: DGemmaDiffusion, z_BxL, window_BxL):
    """Fills the generate-id positions inside the window: (z_BxL, nfe)."""
    (model,) = self._applies(apply)
    batch, length = z_BxL.shape
    num_canvases = process.num_blocks(length)
    given_BxL = (z_BxL != process.generate_id) | ~window_BxL
    noise = draw_noise(
      key, num_canvases, int(self.num_steps), batch, process.block_size,
      process.vocab_size,
    )  # fmt: skip
    return fill_canvases(model, z_BxL, given_BxL, noise, self.canvas_config)
