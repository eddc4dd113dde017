"""DDPD's planner: which positions of a sequence are noise.

Discrete Diffusion with Planned Denoising (Liu et al., arXiv 2410.06264)
splits generation between two networks: a planner that says which
positions are still noise, and a mask denoiser (an ordinary masked
diffusion run) that fills the positions the planner points at. This
module is the planner's process; `ddlm_jax.sampling.ddpd` is the planned
sampler that runs both.

Corruption. Uniform noise at rate r ~ U[0, 1] (the paper's 1 - t):
every position is independently *replaced* with probability r by a
uniform draw over the V data tokens. A uniform draw can equal the clean
token; the target is still "was replaced" (the latent noise indicator of
the paper's forward process and of its public training code), not
"differs from the clean token". The planner thus estimates the posterior
P(z^i = noise | x_r), which is what the sampler's mask draw and its
choice of position need: a replaced position that happens to hold the
clean token is still one the reverse process has not yet denoised.

Network. Bidirectional and time-free (the number of noise positions
carries the noise level), reading the V data tokens (no mask token) and
emitting ONE logit per position (`output_size = 1`), the log-odds that
the position is noise. The loss is the binary cross-entropy of those
logits against the replaced indicator, summed over the valid positions;
it is reported in the slot of the bound (`nelbo_B`, nats per sequence),
although it is not a likelihood bound: the planner has no likelihood.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import Backbone, Process, ProcessConfig
from ddlm_jax.diffusion.masked import antithetic_uniform

FAMILY = 'ddpd_planner'


def uniform_corrupt(key: jax.Array, x_BxL: jax.Array, rate_B, vocab_size):
  """(x_r, replaced_BxL): each token replaced w.p. rate_B by a uniform draw.

  The draw may equal the clean token; `replaced_BxL` is the latent
  indicator (True where a draw was made), the planner's target.
  """
  replace_key, draw_key = jax.random.split(key)
  rate_Bx1 = jnp.asarray(rate_B, jnp.float32).reshape(-1, 1)
  replaced_BxL = jax.random.uniform(replace_key, x_BxL.shape) < rate_Bx1
  noise_BxL = jax.random.randint(draw_key, x_BxL.shape, 0, vocab_size)
  z_BxL = jnp.where(replaced_BxL, noise_BxL, x_BxL).astype(x_BxL.dtype)
  return z_BxL, replaced_BxL


def planner_bce(logits_BxL: jax.Array, target_BxL: jax.Array) -> jax.Array:
  """Per-position binary cross-entropy of noise logits, float32 [B, L]."""
  logits_BxL = logits_BxL.astype(jnp.float32)
  target_BxL = target_BxL.astype(jnp.float32)
  return -(
    target_BxL * jax.nn.log_sigmoid(logits_BxL)
    + (1.0 - target_BxL) * jax.nn.log_sigmoid(-logits_BxL)
  )


@dataclasses.dataclass(frozen=True)
class PlannerProcess(Process):
  """The planner's training process (module docstring).

  Attributes:
    vocab_size: V data tokens (uniform draws range over them).
    antithetic: stratify the batch's noise rates (as masked diffusion
      stratifies its times).
  """

  vocab_size: int
  antithetic: bool = True

  causal: ClassVar[bool] = False
  family: ClassVar[str] = FAMILY
  requires_time_conditioning: ClassVar[bool] = False
  loss_is_bound: ClassVar[bool] = False

  def __post_init__(self):
    if isinstance(self.vocab_size, bool) or not isinstance(
      self.vocab_size, int
    ):
      raise ValueError(f'vocab_size must be an int, got {self.vocab_size!r}.')
    if self.vocab_size < 2:
      raise ValueError(f'vocab_size must be >= 2, got {self.vocab_size}.')

  @property
  def input_vocab_size(self) -> int:
    """The planner reads data tokens only (noise is a data token)."""
    return int(self.vocab_size)

  @property
  def output_size(self) -> int:
    """One logit per position: the log-odds that it is noise."""
    return 1

  def sample_rates(self, key: jax.Array, batch: int) -> jax.Array:
    """Noise rates r_B ~ U[0, 1], stratified if antithetic."""
    if self.antithetic:
      return antithetic_uniform(key, batch)
    return jax.random.uniform(key, (batch,))

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, rate_B):
    """(z_BxL, replaced_BxL) at noise rate rate_B (uniform_corrupt)."""
    return uniform_corrupt(key, x_BxL, rate_B, self.vocab_size)

  def noise_logits(self, apply, z_BxL: jax.Array) -> jax.Array:
    """[B, L] float32: the planner's noise log-odds (time-free call)."""
    t_B = jnp.zeros((z_BxL.shape[0],), jnp.float32)
    out = apply(z_BxL, t_B)
    if out.ndim != 3 or out.shape[-1] != 1:
      raise ValueError(
        f'the planner network must return [B, L, 1] logits; got shape '
        f'{tuple(out.shape)}. Build it from a ddpd_planner run (its process '
        'declares output_size = 1).'
      )
    return out[..., 0].astype(jnp.float32)

  def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
    """(bce_B, bce_B, aux): one draw of the planner's cross-entropy."""
    del step
    rate_key, noise_key = jax.random.split(key)
    rate_B = self.sample_rates(rate_key, x_BxL.shape[0])
    z_BxL, replaced_BxL = self.corrupt(noise_key, x_BxL, rate_B)
    logits_BxL = self.noise_logits(apply, z_BxL)
    valid_BxL = jnp.ones(x_BxL.shape, jnp.float32)
    if loss_mask_BxL is not None:
      valid_BxL = loss_mask_BxL.astype(jnp.float32)
    bce_B = jnp.sum(planner_bce(logits_BxL, replaced_BxL) * valid_BxL, -1)
    predicted_BxL = logits_BxL > 0
    correct_B = jnp.sum((predicted_BxL == replaced_BxL) * valid_BxL, -1)
    valid_B = jnp.maximum(valid_BxL.sum(-1), 1.0)
    aux = {
      'noise_fraction': jnp.sum(replaced_BxL * valid_BxL, -1) / valid_B,
      'planner_accuracy': correct_B / valid_B,
    }
    return bce_B, bce_B, aux


@ProcessConfig.register(FAMILY)
@dataclasses.dataclass(frozen=True)
class PlannerConfig(ProcessConfig):
  """config.process of DDPD's planner: antithetic noise rates or not."""

  antithetic: bool = True

  family: ClassVar[str] = FAMILY

  def check(self, backbone: Backbone, seq_len: int) -> None:
    super().check(backbone, seq_len)
    if backbone.time_conditioning:
      raise ValueError(
        f'process.kind={self.kind!r} trains a time-free planner (the '
        'number of noise positions carries the noise level); set '
        '--config.model.time_conditioning=False.'
      )
    if backbone.name not in ('transformer', 'hybrid'):
      raise ValueError(
        f'process.kind={self.kind!r} needs a backbone with a one-logit '
        f'head; model.backbone={backbone.name!r} has a vocabulary head. '
        "Use model.backbone='transformer'."
      )

  def build(self, vocab_size: int) -> PlannerProcess:
    return PlannerProcess(vocab_size=vocab_size, antithetic=self.antithetic)
