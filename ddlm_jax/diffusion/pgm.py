"""PGM: masked diffusion's bound, trained on partitions instead of masks.

Partition Generative Modeling (Deschenaux, Tran and Gulcehre, arXiv
2505.18883) keeps MDLM's generative model and bound but never shows the
network a mask token. A draw of MDLM's forward process at time t masks
each token independently with probability r(t) = 1 - alpha(t); read as a
partition, the masked tokens are group 1 and the kept ones group 0. The
partition network (`ddlm_jax.models.pgm`, backbone 'pgm') predicts every
token of one group from the tokens of the other, both groups in one pass:

- group 1 from group 0 is MDLM's term at t: the masked tokens predicted
  from the kept ones, weight w(t) = -alpha'(t) / (1 - alpha(t));
- group 0 from group 1 is MDLM's term at the complementary time t*,
  whose masking rate is r(t*) = 1 - r(t): group 0 is distributed as a
  masked set at rate alpha(t). Changing variables in the diffusion
  integral (it reads int dr / r E_{M ~ Bern(r)}[...] over the masking
  rate) turns the weight into -alpha'(t) / alpha(t) at the drawn t.

Each term alone is an unbiased one-sample estimate of MDLM's diffusion
integral, provided the range of masking rates is symmetric under r -> 1 -
r; their mean (the "halved" sum) is too, with half the variance of
neither. So the process draws t uniformly on [t_lo, t_hi], the widest
sub-range of [t_min, 1] with r(t_hi) = 1 - r(t_lo) (for the log-linear
schedule with eps = 1e-3 and t_min = 1e-3: t_lo = eps / (1 - eps) =
1.001e-3, t_hi = 1), and reports

  nelbo = (t_hi - t_lo) / 2 [ w(t) sum_{g_i = 1} CE_i
                             + (-alpha'(t) / alpha(t)) sum_{g_i = 0} CE_i ]
          + (recon + prior) per token,

recon = r(t_lo) log V and prior = alpha(t_hi) log V as in MDLM's full
bound (`MaskedDiffusion` with t_min = t_lo), whose value it equals in
expectation for the same denoiser (tests/test_pgm.py checks this by exact
enumeration). The denoiser is time-free: the exact posterior of a masked
token given the kept ones does not depend on t, and the group sizes show
the noise level.

Generation (`ddlm_jax.sampling.pgm`) draws a random order and decodes the
next positions as queries from the encoder run on the clean tokens so
far: the uniform-order chain rule that MDLM's bound averages.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import (
  Backbone,
  DiffusionProcess,
  ProcessConfig,
  ScheduledConfig,
)
from ddlm_jax.diffusion.masked import (
  antithetic_uniform,
  check_loss_and_times,
  token_cross_entropy,
)
from ddlm_jax.diffusion.schedules import Schedule

FAMILY = 'pgm'
BACKBONE = 'pgm'


def _alpha(schedule: Schedule, t: float) -> float:
  with jax.ensure_compile_time_eval():
    return float(schedule.alpha(float(t)))


def time_for_rate(schedule: Schedule, rate: float, iters: int = 80) -> float:
  """t in [0, 1] with masking rate 1 - alpha(t) = rate (bisection; the
  schedules are monotone)."""
  lo, hi = 0.0, 1.0
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    if 1.0 - _alpha(schedule, mid) < rate:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=64)
def symmetric_range(schedule: Schedule, t_min: float) -> tuple[float, float]:
  """(t_lo, t_hi): the widest sub-range of [t_min, 1] whose masking rates
  are symmetric, r(t_hi) = 1 - r(t_lo) (module docstring)."""
  r_min = 1.0 - _alpha(schedule, t_min)
  r_max = 1.0 - _alpha(schedule, 1.0)
  if not r_min < 0.5 < r_max:
    raise ValueError(
      f'the schedule masks rates [{r_min:.4g}, {r_max:.4g}] over [t_min, '
      '1]; PGM pairs each rate r with 1 - r, so the range must contain '
      '1/2 on both sides. Lower process.t_min or use a schedule that '
      'masks (nearly) everything at t = 1.'
    )
  r_lo = max(r_min, 1.0 - r_max)
  t_lo = t_min if r_lo == r_min else time_for_rate(schedule, r_lo)
  t_hi = 1.0 if 1.0 - r_lo == r_max else time_for_rate(schedule, 1.0 - r_lo)
  return t_lo, t_hi


@dataclasses.dataclass(frozen=True)
class PGMDiffusion(DiffusionProcess):
  """MDLM's bound over partitions (module docstring).

  Attributes:
    schedule: keep-probability alpha(t) (the partition's group-0 rate).
    vocab_size: V data tokens; the network embeds no other id.
    t_min: the lower end of the times before symmetrisation.
    antithetic: stratify the batch's times (MD4).
    loss_type: 'elbo' trains on the bound, 'simple_ce' on the unweighted
      cross-entropy of every token; both report the bound.

  The state z of `draw` / `bound` is the group of each position, [B, L]
  int32 in {0, 1} (1: MDLM's masked set at t).
  """

  schedule: Schedule
  vocab_size: int
  t_min: float = 1e-3
  antithetic: bool = True
  loss_type: str = 'elbo'

  causal: ClassVar[bool] = False
  family: ClassVar[str] = FAMILY
  requires_time_conditioning: ClassVar[bool] = False

  def __post_init__(self):
    v = self.vocab_size
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
      raise ValueError(f'vocab_size must be an int >= 2, got {v!r}.')
    check_loss_and_times(self.loss_type, self.t_min)
    symmetric_range(self.schedule, self.t_min)  # Refuses a one-sided one.

  @property
  def input_vocab_size(self) -> int:
    """The V data tokens only: no mask token ever enters the network."""
    return int(self.vocab_size)

  @property
  def time_range(self) -> tuple[float, float]:
    """(t_lo, t_hi) of the drawn times (`symmetric_range`)."""
    return symmetric_range(self.schedule, self.t_min)

  def constant_nats(self) -> tuple[float, float]:
    """(reconstruction, prior) nats per token: (r(t_lo) log V, alpha(t_hi)
    log V), MDLM's full-bound terms on the symmetric range (equal)."""
    t_lo, t_hi = self.time_range
    log_v = math.log(self.vocab_size)
    return (1.0 - _alpha(self.schedule, t_lo)) * log_v, _alpha(
      self.schedule, t_hi
    ) * log_v

  def group_weights(self, t_B: jax.Array) -> jax.Array:
    """[B, 2]: the estimator weights of groups 0 and 1 at t, halved."""
    t_lo, t_hi = self.time_range
    alpha_B = self.schedule.alpha(t_B)
    rate_B = -self.schedule.dalpha(t_B)
    half = 0.5 * (t_hi - t_lo)
    return half * jnp.stack([rate_B / alpha_B, rate_B / (1.0 - alpha_B)], -1)

  def sample_times(self, key: jax.Array, batch: int):
    """(t_B, weights_Bx2): t ~ U[t_lo, t_hi], stratified if antithetic."""
    if self.antithetic:
      u_B = antithetic_uniform(key, batch)
    else:
      u_B = jax.random.uniform(key, (batch,))
    t_lo, t_hi = self.time_range
    t_B = t_lo + (t_hi - t_lo) * u_B
    return t_B, self.group_weights(t_B)

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_B) -> jax.Array:
    """Groups [B, L]: 1 w.p. 1 - alpha(t) (MDLM's masked set), else 0."""
    alpha_Bx1 = jnp.asarray(self.schedule.alpha(t_B))[:, None]
    keep_BxL = jax.random.uniform(key, x_BxL.shape) < alpha_Bx1
    return jnp.where(keep_BxL, 0, 1).astype(jnp.int32)

  def draw(self, key: jax.Array, x_BxL: jax.Array):
    t_key, group_key = jax.random.split(key)
    t_B, weights_Bx2 = self.sample_times(t_key, x_BxL.shape[0])
    return t_B, weights_Bx2, self.corrupt(group_key, x_BxL, t_B)

  def network_logits(self, apply, groups_BxL, x_BxL, t_B) -> jax.Array:
    """One pass of the partition network: every token from the other
    group (the network never sees t or a mask)."""
    del t_B
    return apply.partition_logits(x_BxL, groups_BxL)

  def forward_marginal(self, x_probs_BxLxV, alpha):
    """Refused: PGM's network never reads a masked state, so the absorbing
    marginal over V + 1 ids has no use here."""
    del x_probs_BxLxV, alpha
    raise TypeError(
      'PGMDiffusion has no mask state: its network reads a partition of '
      "clean tokens; samplers of family 'pgm' do not need q(z_t | x)."
    )

  def bound(self, logits_BxLxV, x_BxL, groups_BxL, t_B, weights_Bx2,
            loss_mask_BxL):  # fmt: skip
    """(objective_B, nelbo_B, aux) of one partition (module docstring)."""
    batch, length = x_BxL.shape
    valid_BxL = jnp.ones((batch, length), jnp.float32)
    if loss_mask_BxL is not None:
      valid_BxL = loss_mask_BxL.astype(jnp.float32)
    ce_BxL = token_cross_entropy(logits_BxLxV, x_BxL) * valid_BxL
    in1_BxL = (groups_BxL == 1).astype(jnp.float32)
    ce1_B = jnp.sum(ce_BxL * in1_BxL, -1)
    ce0_B = jnp.sum(ce_BxL * (1.0 - in1_BxL), -1)
    valid_B = valid_BxL.sum(-1)
    recon, prior = self.constant_nats()
    nelbo_B = (
      weights_Bx2[:, 0] * ce0_B
      + weights_Bx2[:, 1] * ce1_B
      + (recon + prior) * valid_B
    )
    objective_B = nelbo_B if self.loss_type == 'elbo' else ce0_B + ce1_B
    aux = {
      'masked_fraction': jnp.sum(in1_BxL * valid_BxL, -1)
      / jnp.maximum(valid_B, 1.0),
      't': t_B,
    }
    return objective_B, nelbo_B, aux


@ProcessConfig.register(FAMILY)
@dataclasses.dataclass(frozen=True)
class PartitionConfig(ScheduledConfig):
  """config.process of PGM: the shared settings of ScheduledConfig (the
  log-linear schedule and t_min = 1e-3, as MDLM); the drawn times are the
  symmetric part of [t_min, 1] (PGMDiffusion)."""

  family: ClassVar[str] = FAMILY
  attention_masks: ClassVar[tuple[str, ...]] = ('segments', 'groups')

  def check(self, backbone: Backbone, seq_len: int) -> None:
    super().check(backbone, seq_len)
    if backbone.name != BACKBONE:
      raise ValueError(
        f'process.kind={self.kind!r} trains a partition network (an '
        'encoder within groups, position-only queries, a decoder across '
        f'groups); model.backbone={backbone.name!r} is not one. Set '
        f"--config.model.backbone='{BACKBONE}'."
      )
    if backbone.time_conditioning:
      raise ValueError(
        f'process.kind={self.kind!r} trains a time-free network (the '
        'partition shows the noise level); set '
        '--config.model.time_conditioning=False.'
      )

  def build(self, vocab_size: int) -> PGMDiffusion:
    kwargs = self.scheduled_kwargs(vocab_size)
    return PGMDiffusion(
      schedule=kwargs['schedule'],
      vocab_size=vocab_size,
      t_min=self.t_min,
      antithetic=self.antithetic,
      loss_type=self.loss_type,
    )
