"""DiffusionGemma's training recipe: uniform-state block diffusion with an
encoder/decoder split and self-conditioning.

A sequence of L tokens is cut into L / C blocks (canvases) of C tokens.
Each block is noised by uniform-state diffusion (UDLM: a token stays itself
with probability alpha(t) and is otherwise redrawn uniformly over the V
data tokens; no mask token), with its own time t_b. The network sees the
clean blocks before b through a KV cache and denoises block b:

- the encoder runs causally over the clean sequence x once and writes the
  keys and values of every position into the cache;
- the decoder runs bidirectionally over the noisy canvas z_b, reading the
  cache cut to the first b C positions (the clean earlier blocks);
- with probability `self_conditioning` per sequence, a first decoder pass
  (no self-conditioning signal, gradient stopped) gives logits that enter
  the second pass through the model's self-conditioning input; otherwise
  the signal is zero. The loss is taken on the second pass.

The network must offer `init_cache(batch, capacity)`, `encode(tokens,
cache)` and `decode(canvas, cache, sc_logits, sc_mask)` as
`ddlm_jax.models.diffusion_gemma.DiffusionGemma` does (the run backbone
'diffusion_gemma' wraps one).

The bound (nats per sequence) is the uniform-state continuous-time NELBO
of UDLM per block, conditioned on the clean earlier blocks, summed over
blocks:

  -log p(x) = -sum_b log p(x_b | x_<b)
           <= sum_b [ C (recon(t_min) + prior)
                      + int_{t_min}^1 -alpha'(t) E_{z_b ~ q(. | x_b, t)}
                          sum_{i in b} rate(r_theta(z_b, x_<b)^i, x^i, z_b^i)
                        dt ],

with `ddlm_jax.diffusion.uniform.uniform_nelbo_rate` as the rate (a
generalised KL between the true and the model's jump rates out of z_t),
r_theta the leave-one-out probabilities converted from the decoder's
denoiser logits, recon the closed-form reconstruction term at t_min with
the Bayes decoder and prior KL(q(z_1 | x) || uniform) per token. Each
block's term is a valid bound on -log p(x_b | x_<b) for any denoiser that
is a function of (z_b, x_<b); the self-conditioned denoiser is one (its
first pass reads the same z_b), drawn at random per sequence, so the
expected bound is a mixture of bounds and still a bound. With the tight
schedule (alpha(0) = 1, alpha(1) = 0), t_min = 0 and the exact posterior
as denoiser, every block's term equals -log p(x_b | x_<b) for every x, so
the bound is -log p(x) exactly (tests/test_dgemma_recipe.py checks this
by enumeration on V = 3). Times are stratified over (sequence, block)
pairs as in block diffusion; the network is time-free (the canvas shows
its noise level), as DiffusionGemma is.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import (
  Backbone,
  BlockProcess,
  ProcessConfig,
  ScheduledConfig,
)
from ddlm_jax.diffusion.masked import antithetic_uniform, check_loss_and_times
from ddlm_jax.diffusion.schedules import Schedule
from ddlm_jax.diffusion.uniform import (
  UniformDiffusion,
  as_float,
  denoiser_to_loo_logits,
  log_prob_cross_entropy,
  mixture_constants,
  schedule_alpha,
  uniform_nelbo_rate,
)

FAMILY = 'dgemma'
BACKBONE = 'diffusion_gemma'


def encode_clean(net, x_BxL: jax.Array):
  """The cache of one causal encoder pass over the clean sequence (L
  positions). A causal encoder's keys of a prefix do not depend on what
  follows it, so cut to b * C positions it is the cache the sampler builds
  canvas by canvas."""
  cache = net.init_cache(x_BxL.shape[0], x_BxL.shape[1])
  return net.encode(x_BxL.astype(jnp.int32), cache)[1]


def decode_blocks(
  net,
  cache,
  z_BxL: jax.Array,
  block_size: int,
  sc_logits_BxLxV: jax.Array | None = None,
  sc_mask_B: jax.Array | None = None,
) -> jax.Array:
  """Decoder logits [B, L, V] of every block, block b reading the cache cut
  to its clean prefix (b * block_size positions); one vectorised call."""
  batch, length = z_BxL.shape
  num_blocks = length // block_size

  def per_block(a_BxL):  # [B, L, ...] -> [Nb, B, C, ...]
    shape = (batch, num_blocks, block_size) + a_BxL.shape[2:]
    return jnp.swapaxes(a_BxL.reshape(shape), 0, 1)

  starts_Nb = jnp.arange(num_blocks, dtype=jnp.int32) * block_size
  z_NbxBxC = per_block(z_BxL.astype(jnp.int32))

  def decode(start, z_BxC, sc_BxCxV):
    return net.decode(z_BxC, cache._replace(length=start), sc_BxCxV, sc_mask_B)

  if sc_logits_BxLxV is None:
    logits = jax.vmap(lambda s, z: decode(s, z, None))(starts_Nb, z_NbxBxC)
  else:
    sc_NbxBxCxV = per_block(sc_logits_BxLxV)
    logits = jax.vmap(decode)(starts_Nb, z_NbxBxC, sc_NbxBxCxV)
  return jnp.swapaxes(logits, 0, 1).reshape(batch, length, -1)


def block_logits(
  net,
  z_BxL: jax.Array,
  x_BxL: jax.Array,
  block_size: int,
  sc_logits_BxLxV: jax.Array | None = None,
  sc_mask_B: jax.Array | None = None,
) -> jax.Array:
  """Denoiser logits [B, L, V] of every block, each reading its clean
  prefix: `encode_clean` then `decode_blocks`."""
  cache = encode_clean(net, x_BxL)
  return decode_blocks(
    net, cache, z_BxL, block_size, sc_logits_BxLxV, sc_mask_B
  )


@dataclasses.dataclass(frozen=True)
class DGemmaDiffusion(BlockProcess):
  """Uniform-state block diffusion with self-conditioning (module docstring).

  Attributes:
    schedule: keep-probability alpha(t) inside every block.
    vocab_size: V data tokens (no mask token).
    block_size: C, tokens per canvas; it must divide the sequence length.
    t_min: block times are drawn from [t_min, 1].
    antithetic: stratify the times over (sequence, block) pairs.
    loss_type: 'elbo' trains on the NELBO, 'simple_ce' on the denoiser's
      cross-entropy at every position; both report the NELBO.
    self_conditioning: p, the probability per sequence that the first
      pass's logits feed the second pass (0 runs one pass, no signal).
  """

  schedule: Schedule
  vocab_size: int
  block_size: int
  t_min: float = 1e-3
  antithetic: bool = True
  loss_type: str = 'elbo'
  self_conditioning: float = 0.5

  causal: ClassVar[bool] = False
  family: ClassVar[str] = FAMILY
  requires_time_conditioning: ClassVar[bool] = False

  def __post_init__(self):
    for name in ('vocab_size', 'block_size'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be an int >= 1, got {value!r}.')
    if self.vocab_size < 2:
      raise ValueError(
        f'vocab_size must be >= 2 (one token cannot be noised), got '
        f'{self.vocab_size}.'
      )
    check_loss_and_times(self.loss_type, self.t_min)
    p = self.self_conditioning
    if (
      isinstance(p, bool)
      or not isinstance(p, (int, float))
      or not (0.0 <= p <= 1.0)
    ):
      raise ValueError(
        f'self_conditioning={p!r} is a probability; use a value in [0, 1] '
        '(0 switches self-conditioning off).'
      )
    object.__setattr__(self, 'self_conditioning', float(p))

  @property
  def input_vocab_size(self) -> int:
    """Embedding rows the network needs: the V data tokens only."""
    return self.vocab_size

  @property
  def masked_process(self) -> UniformDiffusion:
    """The process inside one block: uniform-state diffusion (continuous
    time, denoiser logits), what a per-block sampler runs."""
    return UniformDiffusion(
      self.schedule,
      self.vocab_size,
      t_min=self.t_min,
      antithetic=self.antithetic,
      loss_type=self.loss_type,
    )

  def check_length(self, seq_len: int) -> None:
    """ValueError unless block_size divides seq_len."""
    if self.block_size > seq_len or seq_len % self.block_size:
      raise ValueError(
        f'block_size={self.block_size} does not divide the sequence length '
        f'{seq_len}; choose a block size that divides the length.'
      )

  def num_blocks(self, seq_len: int) -> int:
    self.check_length(seq_len)
    return seq_len // self.block_size

  def constant_nats(self) -> tuple[float, float]:
    """(reconstruction at t_min, prior) nats per token (UDLM's terms)."""
    recon, _ = mixture_constants(
      schedule_alpha(self.schedule, self.t_min), self.vocab_size, 1.0
    )
    _, prior = mixture_constants(
      schedule_alpha(self.schedule, 1.0), self.vocab_size, 1.0
    )
    return recon, prior

  # -- forward process -------------------------------------------------------

  def sample_times(self, key: jax.Array, batch: int, num_blocks: int):
    """(t_BxNb, weight_BxNb): block times in [t_min, 1] and their bound
    weights (1 - t_min)(-alpha'(t)), stratified over batch x blocks."""
    count = batch * num_blocks
    if self.antithetic:
      u = antithetic_uniform(key, count)
    else:
      u = jax.random.uniform(key, (count,))
    u_BxNb = u.reshape(num_blocks, batch).T
    t_BxNb = self.t_min + (1.0 - self.t_min) * u_BxNb
    return t_BxNb, -(1.0 - self.t_min) * self.schedule.dalpha(t_BxNb)

  def position_alpha(self, t_BxNb: jax.Array) -> jax.Array:
    """alpha of each position's block time, [B, L]."""
    return jnp.repeat(self.schedule.alpha(t_BxNb), self.block_size, axis=1)

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_BxNb: jax.Array):
    """z_t: each token kept w.p. alpha(t_b), else uniform over V."""
    keep_BxL = jax.random.uniform(key, x_BxL.shape) < self.position_alpha(
      t_BxNb
    )
    noise_BxL = jax.random.randint(
      jax.random.fold_in(key, 1), x_BxL.shape, 0, self.vocab_size,
      dtype=x_BxL.dtype,
    )  # fmt: skip
    return jnp.where(keep_BxL, x_BxL, noise_BxL)

  def draw(self, key: jax.Array, x_BxL: jax.Array):
    """(t_BxNb, weight_BxNb, z_BxL)."""
    batch, length = x_BxL.shape
    t_key, noise_key = jax.random.split(key)
    t_BxNb, weight_BxNb = self.sample_times(
      t_key, batch, self.num_blocks(length)
    )
    return t_BxNb, weight_BxNb, self.corrupt(noise_key, x_BxL, t_BxNb)

  def prior_sample(self, key: jax.Array, shape) -> jax.Array:
    """z_1: uniform tokens (a fresh canvas)."""
    return jax.random.randint(key, shape, 0, self.vocab_size, dtype=jnp.int32)

  def forward_marginal(self, x_probs_BxLxV, alpha) -> jax.Array:
    """q(z | x) = alpha x + (1 - alpha) / V (uniform-state)."""
    return self.masked_process.forward_marginal(x_probs_BxLxV, alpha)

  # -- network and bound -----------------------------------------------------

  def network_logits(self, apply, z_BxL, x_BxL, t_BxNb, key=None):
    """The decoder's logits at z_t, self-conditioned w.p. p per sequence.

    With p = 0 there is one pass and no signal. Otherwise the first pass's
    logits (gradient stopped) feed the second pass of the rows whose
    Bernoulli(p) draw (from `key`) is on; the others get a zero signal.
    """
    del t_BxNb  # Time-free: the canvas shows its noise level.
    cache = encode_clean(apply, x_BxL)  # One encoder pass serves both.
    p = self.self_conditioning
    if p == 0.0:
      return decode_blocks(apply, cache, z_BxL, self.block_size)
    if key is None:
      raise ValueError('self-conditioning draws which rows use it: pass key.')
    first = decode_blocks(apply, jax.lax.stop_gradient(cache), z_BxL,
                          self.block_size)  # fmt: skip
    use_B = jax.random.bernoulli(key, p, (x_BxL.shape[0],))
    return decode_blocks(
      apply, cache, z_BxL, self.block_size, jax.lax.stop_gradient(first),
      use_B.astype(jnp.float32),
    )  # fmt: skip

  def _check_inputs(self, x_BxL, loss_mask_BxL):
    if x_BxL.ndim != 2:
      raise ValueError(f'x_BxL must be [B, L] tokens, got {x_BxL.shape}.')
    self.check_length(x_BxL.shape[1])
    if loss_mask_BxL is not None and loss_mask_BxL.shape != x_BxL.shape:
      raise ValueError(
        f'loss_mask_BxL has shape {loss_mask_BxL.shape}; it must match the '
        f'tokens {x_BxL.shape}.'
      )

  def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
    """One Monte-Carlo sample: draw, (two) decoder passes, bound.

    The draw uses the same key whatever p is, so p = 0 and p > 0 see the
    same times and noisy canvases.
    """
    del step
    self._check_inputs(x_BxL, loss_mask_BxL)
    draw_key, sc_key = jax.random.split(key)
    t_BxNb, weight_BxNb, z_BxL = self.draw(draw_key, x_BxL)
    logits_BxLxV = self.network_logits(apply, z_BxL, x_BxL, t_BxNb, sc_key)
    return self.bound(
      logits_BxLxV, x_BxL, z_BxL, t_BxNb, weight_BxNb, loss_mask_BxL
    )

  def denoiser_log_probs(self, logits_BxLxV, z_BxL, t_B) -> jax.Array:
    """log p(x^i | z_t, clean prefix): the decoder's logits, normalised."""
    del z_BxL, t_B
    return jax.nn.log_softmax(as_float(logits_BxLxV), axis=-1)

  def bound(
    self, logits_BxLxV, x_BxL, z_BxL, t_BxNb, weight_BxNb, loss_mask_BxL=None
  ):
    """(objective_B, nelbo_B, aux) of the decoder's logits at z_t.

    weight_BxNb is sample_times' (1 - t_min)(-alpha'(t_b)); each position's
    rate takes its block's alpha and weight.
    """
    batch, length = x_BxL.shape
    valid_BxL = jnp.ones((batch, length), jnp.float32)
    if loss_mask_BxL is not None:
      valid_BxL = as_float(loss_mask_BxL)
    alpha_BxL = self.position_alpha(t_BxNb)
    loo_BxLxV = jax.nn.log_softmax(
      denoiser_to_loo_logits(logits_BxLxV, z_BxL, alpha_BxL), axis=-1
    )
    rate_BxL = uniform_nelbo_rate(loo_BxLxV, x_BxL, z_BxL, alpha_BxL)
    weight_BxL = jnp.repeat(weight_BxNb, self.block_size, axis=1)
    recon, prior = self.constant_nats()
    valid_B = valid_BxL.sum(-1)
    nelbo_B = (weight_BxL * rate_BxL * valid_BxL).sum(-1) + (
      recon + prior
    ) * valid_B
    if self.loss_type == 'elbo':
      objective_B = nelbo_B
    else:
      logp_BxLxV = self.denoiser_log_probs(logits_BxLxV, z_BxL, None)
      ce_BxL = log_prob_cross_entropy(logp_BxLxV, x_BxL)
      objective_B = (ce_BxL * valid_BxL).sum(-1)
    changed_BxL = (z_BxL != x_BxL).astype(jnp.float32) * valid_BxL
    aux = {
      'changed_fraction': changed_BxL.sum(-1) / jnp.maximum(valid_B, 1.0),
      't': t_BxNb.mean(-1),
    }
    return objective_B, nelbo_B, aux


@ProcessConfig.register(FAMILY)
@dataclasses.dataclass(frozen=True)
class DGemmaConfig(ScheduledConfig):
  """config.process of the DiffusionGemma recipe.

  block_size: canvas length C (divides data.seq_len); self_conditioning:
  the probability p that a sequence's second decoder pass reads the first
  pass's logits (0 = off); the shared settings as in ScheduledConfig.
  """

  block_size: int = 16
  self_conditioning: float = 0.5

  family: ClassVar[str] = FAMILY

  def check(self, backbone: Backbone, seq_len: int) -> None:
    super().check(backbone, seq_len)
    if backbone.name != BACKBONE:
      raise ValueError(
        f'process.kind={self.kind!r} runs an encoder/decoder pair over a KV '
        f'cache; model.backbone={backbone.name!r} has none. Set '
        f"--config.model.backbone='{BACKBONE}'."
      )
    if backbone.time_conditioning:
      raise ValueError(
        f'process.kind={self.kind!r} trains a time-free network (the canvas '
        'shows its noise level); set --config.model.time_conditioning=False.'
      )
    if self.block_size < 1 or seq_len % self.block_size:
      raise ValueError(
        f'block_size={self.block_size} does not divide data.seq_len='
        f'{seq_len}; choose a block size that divides the length.'
      )

  def build(self, vocab_size: int) -> DGemmaDiffusion:
    kwargs = self.scheduled_kwargs(vocab_size)
    return DGemmaDiffusion(
      schedule=kwargs['schedule'],
      vocab_size=vocab_size,
      block_size=self.block_size,
      t_min=self.t_min,
      antithetic=self.antithetic,
      loss_type=self.loss_type,
      self_conditioning=self.self_conditioning,
    )
