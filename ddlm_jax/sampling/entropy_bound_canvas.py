"""DiffusionGemma's sampler: canvases of random tokens refined under an
entropy bound, one canvas after another.

For each canvas (block) the encoder first extends the key/value cache with
the tokens not yet encoded (the prompt, then the previous canvas). The
canvas starts as uniform random tokens. Each denoising step, counting the
remaining steps n = N..1:

1. the decoder reads the canvas (and the previous step's logits, through
   self-conditioning) and gives logits, divided by the temperature
   t_min + (t_max - t_min) * n / N (linear, annealed from t_max);
2. a token is sampled at every position (Gumbel-max on those logits) and
   the argmax canvas is kept as the current draft;
3. acceptance: positions sorted by the entropy of their distribution, the
   longest low-entropy prefix whose sum of entropies minus its largest
   stays within `entropy_bound` (a bound on their joint dependence) takes
   the sampled tokens, all other positions keep the current canvas;
4. renoising: every position not accepted this step is redrawn uniformly;
5. a row stops early once its argmax canvas has been the same for
   `stability_threshold` steps and the mean entropy is below
   `confidence_threshold`; a stopped row is frozen and no longer counted.

The canvas emitted is the last argmax draft. A row that emits the
end-of-sequence token is finished: its tokens after it, and its later
canvases, become padding. All randomness is in `CanvasNoise` (canvas
initialisations, Gumbel noise, renoising draws), drawn from a key or passed
in, so the run can be replayed against another implementation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.training.config import ConfigError


@dataclasses.dataclass(frozen=True)
class EntropyBoundCanvasConfig:
  """Sampler settings (the reference's defaults)."""

  max_new_tokens: int = 256
  max_denoising_steps: int = 48
  entropy_bound: float = 0.1
  t_min: float = 0.4
  t_max: float = 0.8
  stability_threshold: int = 1
  confidence_threshold: float = 0.005

  def __post_init__(self):
    checks = (
      (self.max_new_tokens >= 1, 'max_new_tokens', 'an int >= 1'),
      (self.max_denoising_steps >= 1, 'max_denoising_steps', 'an int >= 1'),
      (self.entropy_bound > 0, 'entropy_bound', 'a float > 0'),
      (0 <= self.t_min < self.t_max, 't_min', 'a value in [0, t_max)'),
      (self.stability_threshold >= 0, 'stability_threshold', 'an int >= 0'),
      (self.confidence_threshold > 0, 'confidence_threshold', 'a float > 0'),
    )
    for ok, key, fix in checks:
      if not ok:
        raise ConfigError(f'{key}={getattr(self, key)!r}; use {fix}.')


class CanvasNoise(NamedTuple):
  """All random draws of a run, indexed [canvas, step, ...].

  init_tokens [K, B, C]: initial canvas tokens; gumbel [K, S, B, C, V]:
  Gumbel noise of the token draws; renoise_tokens [K, S, B, C]: uniform
  tokens for unaccepted positions (K canvases, S steps).
  """

  init_tokens: jax.Array
  gumbel: jax.Array
  renoise_tokens: jax.Array


def draw_noise(
  key: jax.Array, canvases: int, steps: int, batch: int, canvas: int,
  vocab: int,
) -> CanvasNoise:  # fmt: skip
  """Noise for `canvases` canvases of `steps` steps each."""
  k_init, k_gumbel, k_renoise = jax.random.split(key, 3)
  return CanvasNoise(
    jax.random.randint(k_init, (canvases, batch, canvas), 0, vocab),
    jax.random.gumbel(k_gumbel, (canvases, steps, batch, canvas, vocab)),
    jax.random.randint(k_renoise, (canvases, steps, batch, canvas), 0, vocab),
  )


class CanvasResult(NamedTuple):
  """A run's output.

  tokens [B, T]: prompt and canvases; decoder_calls [B]: denoising steps
  each row ran (none after its early stop); tokens_per_call [B]: non-pad
  new tokens per decoder call; accepted: per canvas, a [steps, B, C]
  record of the positions accepted at each step.
  """

  tokens: np.ndarray
  decoder_calls: np.ndarray
  tokens_per_call: np.ndarray
  accepted: list[np.ndarray]


def temperature(steps_left: int | jax.Array, cfg: EntropyBoundCanvasConfig):
  """Linear schedule from t_max (first step) towards t_min."""
  frac = steps_left / cfg.max_denoising_steps
  return cfg.t_min + (cfg.t_max - cfg.t_min) * frac


def token_entropy(logits_BxCxV: jax.Array) -> jax.Array:
  """Entropy of each position's categorical distribution, float32."""
  logp = jax.nn.log_softmax(logits_BxCxV.astype(jnp.float32), axis=-1)
  logp = jnp.maximum(logp, jnp.finfo(jnp.float32).min)  # 0 * -inf -> 0
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def entropy_bound_accept(entropy_BxC: jax.Array, bound: float) -> jax.Array:
  """Positions whose sorted-entropy prefix satisfies
  sum(entropies) - max(entropies) <= bound (the lowest always passes)."""
  order_BxC = jnp.argsort(entropy_BxC, axis=-1)
  sorted_BxC = jnp.take_along_axis(entropy_BxC, order_BxC, axis=-1)
  keep_BxC = jnp.cumsum(sorted_BxC, axis=-1) - sorted_BxC <= bound
  rows = jnp.arange(entropy_BxC.shape[0])[:, None]
  return jnp.zeros_like(keep_BxC).at[rows, order_BxC].set(keep_BxC)


def denoise_step(model, canvas, argmax, sc_logits, history, finished, cache,
          gumbel, renoise, steps_left, cfg, first):  # fmt: skip
  """One denoising step for all rows (see the module docstring)."""
  logits = model.decode(canvas, cache, None if first else sc_logits)
  logits = logits / temperature(steps_left, cfg)
  probs = jax.nn.softmax(logits, axis=-1)
  drawn = jnp.argmax(jnp.log(probs) + gumbel, axis=-1).astype(canvas.dtype)
  new_argmax = jnp.argmax(logits, axis=-1).astype(canvas.dtype)
  entropy = token_entropy(logits)
  accept = entropy_bound_accept(entropy, cfg.entropy_bound)
  new_canvas = jnp.where(accept, drawn, canvas)
  new_canvas = jnp.where(accept, new_canvas, renoise.astype(canvas.dtype))
  frozen = finished[:, None]
  new_argmax = jnp.where(frozen, argmax, new_argmax)
  new_canvas = jnp.where(frozen, canvas, new_canvas)
  if not first:
    logits = jnp.where(frozen[..., None], sc_logits, logits)
  if cfg.stability_threshold == 0:
    stable = jnp.ones(finished.shape, bool)
  else:
    stable = jnp.all(history == new_argmax[None], axis=(0, 2))
    history = jnp.concatenate([history[1:], new_argmax[None]], axis=0)
  confident = jnp.mean(token_entropy(logits), -1) < cfg.confidence_threshold
  finished = finished | (stable & confident)
  sc_logits = logits.astype(model.cfg.jnp_dtype)
  return new_canvas, new_argmax, sc_logits, history, finished, accept


_jit_step = nnx.jit(denoise_step, static_argnames=('cfg', 'first'))
_jit_encode = nnx.jit(lambda model, tokens, cache: model.encode(tokens, cache))


def generate(
  model,
  prompt_BxP,
  cfg: EntropyBoundCanvasConfig = EntropyBoundCanvasConfig(),
  *,
  key: jax.Array | None = None,
  noise: CanvasNoise | None = None,
) -> CanvasResult:
  """Generates canvases after equal-length prompts with a `DiffusionGemma`.

  Give `key` (noise drawn here) or `noise` (replayed, e.g. the draws of
  another implementation). Steps run under jit; the early stop of a canvas
  is decided on the host after each step.
  """
  mcfg = model.cfg
  prompt_BxP = np.asarray(prompt_BxP)
  if prompt_BxP.ndim != 2 or prompt_BxP.shape[1] < 1:
    raise ValueError(
      f'prompt shape {prompt_BxP.shape}; pass [batch, length >= 1] tokens.'
    )
  B, P = prompt_BxP.shape
  C, V, S = mcfg.canvas_length, mcfg.vocab_size, cfg.max_denoising_steps
  n_canvases = math.ceil(cfg.max_new_tokens / C)
  if noise is None:
    if key is None:
      raise ValueError('pass key (to draw the noise) or noise (to replay it).')
    noise = draw_noise(key, n_canvases, S, B, C, V)
  want = ((n_canvases, B, C), (n_canvases, S, B, C, V), (n_canvases, S, B, C))
  got = tuple(tuple(a.shape) for a in noise)
  if got != want:
    raise ValueError(f'noise shapes {got}; this run needs {want}.')
  pad, eos = mcfg.pad_id, mcfg.eos_id
  max_length = P + cfg.max_new_tokens
  cache = model.init_cache(B, P + n_canvases * C)
  tokens = prompt_BxP.copy()
  unencoded = tokens
  finished_seq = np.zeros(B, bool)
  calls = np.zeros(B, np.int64)
  accepted_log = []
  for k in range(n_canvases):
    _, cache = _jit_encode(model, jnp.asarray(unencoded), cache)
    canvas = jnp.asarray(noise.init_tokens[k], jnp.int32)
    argmax = canvas
    sc_logits = jnp.zeros((B, C, V), mcfg.jnp_dtype)
    history = jnp.full((max(cfg.stability_threshold, 1), B, C), -1, jnp.int32)
    finished = jnp.zeros(B, bool)
    steps = []
    for i, steps_left in enumerate(range(S, 0, -1)):
      calls += ~(np.asarray(finished) | finished_seq)
      canvas, argmax, sc_logits, history, finished, accept = _jit_step(
        model, canvas, argmax, sc_logits, history, finished, cache,
        noise.gumbel[k, i], noise.renoise_tokens[k, i],
        jnp.float32(steps_left), cfg, i == 0,
      )  # fmt: skip
      steps.append(np.asarray(accept))
      if bool(jnp.all(finished)):
        break
    accepted_log.append(np.stack(steps))
    new = np.asarray(argmax).copy()
    is_eos = new == eos if eos is not None else np.zeros_like(new, bool)
    done_now = is_eos.any(-1) | (tokens.shape[1] + C >= max_length)
    if pad is not None:
      new[finished_seq] = pad
      first = np.cumsum(is_eos, -1)
      new[(first > 0) & ~((first == 1) & is_eos)] = pad
    finished_seq = finished_seq | done_now
    tokens = np.concatenate([tokens, new], axis=1)
    unencoded = new
    if finished_seq.all():
      break
  new_tokens = tokens[:, P:]
  valid = (
    (new_tokens != pad).sum(-1) if pad is not None else new_tokens.shape[1]
  )
  return CanvasResult(tokens, calls, valid / calls, accepted_log)
