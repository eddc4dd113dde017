"""Interpolating diffusion: a constant mixture of masked and uniform noise.

q(z_t | x) = alpha_t x + (1 - alpha_t) pi over K = V + 1 states (mask id V),
pi = (1 - p_u) e_m + p_u / V on the data tokens, with transitions
q(z_t | z_s) = a_ts delta_{z_s} + (1 - a_ts) pi, a_ts = alpha_t / alpha_s.
p_u = 0 is masked diffusion (MDLM/MD4), p_u = 1 uniform-state diffusion.
GIDD (von Ruette et al. 2025) proper uses a time-varying pi_t; this is its
constant-mixing special case, in which a masked token may later turn into a
uniform one. Formulas: GIDD and Duo (arXiv 2506.10892).

As for the uniform process (see diffusion.uniform), the plug-in NELBO is
minimised by the leave-one-out posterior r = p(x^i | z_t^{-i}), related to
the denoiser by p(x^i = y | z_t) ~ r_y q(z_t^i | y); the bound plugs r into
the posterior, the samplers mix the exact posterior linearly with the
denoiser. Where q(z_t^i | y) = 0 for every y but one (p_u = 0 at an unmasked
position) the LOO is not identified and the posterior is a point mass
whatever r is.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import Backbone, ProcessConfig
from ddlm_jax.diffusion.schedules import Schedule
from ddlm_jax.diffusion.uniform import (
  PluginConfig,
  PluginNELBO,
  as_float,
  broadcast_alpha,
  check_common,
  mixture_constants,
  schedule_alpha,
)


def _pi(vocab: int, mixing: float, dtype=jnp.float32) -> jax.Array:
  """The noise distribution pi over V + 1 states (mask last)."""
  return jnp.concatenate(
    [
      jnp.full((vocab,), mixing / vocab, dtype),
      jnp.array([1.0 - mixing], dtype),
    ]
  )


def _pad_mask(x_BxLxV: jax.Array) -> jax.Array:
  """Appends a zero mask column: clean tokens are never the mask."""
  return jnp.concatenate([x_BxLxV, jnp.zeros_like(x_BxLxV[..., :1])], -1)


def interpolating_marginal(x_probs_BxLxV: jax.Array, alpha, mixing: float):
  """q(z_t | x) [B, L, V + 1] = alpha x + (1 - alpha) pi."""
  vocab = x_probs_BxLxV.shape[-1]
  alpha = broadcast_alpha(alpha, x_probs_BxLxV.ndim)
  pi_K = _pi(vocab, mixing, x_probs_BxLxV.dtype)
  return alpha * _pad_mask(x_probs_BxLxV) + (1.0 - alpha) * pi_K


def _likelihood(z_BxL: jax.Array, vocab: int, alpha_t, mixing: float):
  """q(z_t | y) [B, L, V] for every clean token y, and pi_{z_t} [B, L, 1]."""
  a_t = broadcast_alpha(alpha_t, 3)
  pi_z_BxLx1 = _pi(vocab, mixing, a_t.dtype)[z_BxL][..., None]
  is_z_BxLxV = jax.nn.one_hot(z_BxL, vocab, dtype=a_t.dtype)
  return a_t * is_z_BxLxV + (1.0 - a_t) * pi_z_BxLx1, pi_z_BxLx1


def interpolating_posterior(
  x_probs_BxLxV: jax.Array, z_BxL: jax.Array, alpha_s, alpha_t, mixing: float
) -> jax.Array:
  """q(z_s | z_t, x) [B, L, V + 1] for s < t by Bayes, linear in x.

  q(z_s = w | z_t, y) = q(z_t | w) q(w | y) / q(z_t | y); for a probability
  vector x (a denoiser) the mixture sum_y x_y q(z_s | z_t, y) over the
  clean tokens consistent with z_t, renormalised (a no-op unless x puts
  mass on tokens that could not have produced z_t, which only happens at
  p_u = 0 on unmasked positions).
  """
  vocab = x_probs_BxLxV.shape[-1]
  x_BxLxV = as_float(x_probs_BxLxV)
  a_s = broadcast_alpha(alpha_s, 3)
  a_t = broadcast_alpha(alpha_t, 3)
  a_ts = a_t / a_s
  lik_BxLxV, pi_z_BxLx1 = _likelihood(z_BxL, vocab, a_t, mixing)
  ok_BxLxV = lik_BxLxV > 0
  c_BxLxV = jnp.where(
    ok_BxLxV, x_BxLxV / jnp.where(ok_BxLxV, lik_BxLxV, 1.0), 0
  )
  total_BxLx1 = jnp.sum(c_BxLxV, -1, keepdims=True)
  pi_K = _pi(vocab, mixing, c_BxLxV.dtype)
  # q(w | c) for all w, unnormalised in c: alpha_s c_w + (1 - alpha_s) pi_w S.
  prior_BxLxK = a_s * _pad_mask(c_BxLxV) + (1.0 - a_s) * pi_K * total_BxLx1
  is_z_BxLxK = jax.nn.one_hot(z_BxL, vocab + 1, dtype=c_BxLxV.dtype)
  trans_BxLxK = a_ts * is_z_BxLxK + (1.0 - a_ts) * pi_z_BxLx1
  out_BxLxK = trans_BxLxK * prior_BxLxK
  norm_BxLx1 = jnp.sum(out_BxLxK, -1, keepdims=True)
  return out_BxLxK / jnp.where(norm_BxLx1 > 0, norm_BxLx1, 1.0)


def _log_likelihood(z_BxL, vocab, alpha_t, mixing):
  """log q(z_t | y) [B, L, V]; -inf where z_t cannot come from y."""
  lik_BxLxV, _ = _likelihood(z_BxL, vocab, alpha_t, mixing)
  return jnp.where(
    lik_BxLxV > 0, jnp.log(jnp.where(lik_BxLxV > 0, lik_BxLxV, 1.0)), -jnp.inf
  )


def interp_loo_to_denoiser_logits(loo_logits_BxLxV, z_BxL, alpha_t, mixing):
  """Denoiser logits: LOO logits + log q(z_t^i | y) (-inf if impossible)."""
  vocab = loo_logits_BxLxV.shape[-1]
  return as_float(loo_logits_BxLxV) + _log_likelihood(
    z_BxL, vocab, alpha_t, mixing
  )


def interp_denoiser_to_loo_logits(logits_BxLxV, z_BxL, alpha_t, mixing):
  """LOO logits: denoiser logits - log q(z_t^i | y).

  Where the likelihood vanishes the LOO is not identified (any value gives
  the same posterior and denoiser); the logits are left unchanged there.
  """
  vocab = logits_BxLxV.shape[-1]
  log_lik_BxLxV = _log_likelihood(z_BxL, vocab, alpha_t, mixing)
  any_zero_BxLx1 = jnp.any(jnp.isinf(log_lik_BxLxV), -1, keepdims=True)
  return as_float(logits_BxLxV) - jnp.where(any_zero_BxLx1, 0.0, log_lik_BxLxV)


def _data_log_marginals(logr_BxLxV, x_BxL, alpha, mixing):
  """(log q(v | r), q(v | x)) over the V data states, at keep-prob alpha."""
  vocab = logr_BxLxV.shape[-1]
  a = broadcast_alpha(alpha, 3)
  floor = (1.0 - a) * mixing / vocab  # pi_v (1 - alpha), v a data token
  log_floor = jnp.log(floor) if mixing > 0 else jnp.full_like(a, -jnp.inf)
  log_r_BxLxV = jnp.logaddexp(jnp.log(a) + logr_BxLxV, log_floor)
  q_x_BxLxV = a * jax.nn.one_hot(x_BxL, vocab, dtype=logr_BxLxV.dtype) + floor
  return log_r_BxLxV, q_x_BxLxV


def _xlogratio(q_BxLxV, log_q_BxLxV_model):
  """q log(q / p), 0 where q = 0 (no NaN from 0 log 0 or 0 * -inf)."""
  ok = q_BxLxV > 0
  log_q = jnp.log(jnp.where(ok, q_BxLxV, 1.0))
  return jnp.where(ok, q_BxLxV * (log_q - log_q_BxLxV_model), 0.0)


def interpolating_nelbo_rate(
  loo_log_probs_BxLxV, x_BxL, z_BxL, alpha_t, mixing: float
) -> jax.Array:
  """Continuous-time NELBO integrand per position, per unit of -alpha'(t).

  The s -> t limit of the step KL: the reverse jump rate to w != z_t is
  -alpha' b_w with b_w = pi_z Q_w / (alpha Q_z), Q = q(. | x) at time t,
  and the integrand is sum_{w != z} b_w log(b_w / bhat_w) - b_w + bhat_w
  (bhat with Q(. | r)). The mask state's Q does not depend on x, so
    z = m:     (1 / (alpha (1 - alpha))) sum_v Q_v(x) log(Q_v(x) / Q_v(r)),
    z data:    (pi_z / alpha) [ (1 / Q_z(x)) sum_{v != z} Q_v(x) log(Q_v(x) /
               Q_v(r)) + (1 / Q_z(x) - 1) log(Q_z(r) / Q_z(x))
               + 1 / Q_z(r) - 1 / Q_z(x) ]  (0 when pi_z = 0),
  v over the V data tokens. p_u = 0 gives MDLM's -log r_x / (1 - alpha) on
  masked tokens, p_u = 1 the uniform closed form.
  """
  vocab = loo_log_probs_BxLxV.shape[-1]
  logr_BxLxV = as_float(loo_log_probs_BxLxV)
  a_t = broadcast_alpha(alpha_t, 3)[..., 0]
  log_qr_BxLxV, q_x_BxLxV = _data_log_marginals(
    logr_BxLxV, x_BxL, alpha_t, mixing
  )
  terms_BxLxV = _xlogratio(q_x_BxLxV, log_qr_BxLxV)
  masked_BxL = z_BxL == vocab
  rate_mask_BxL = jnp.sum(terms_BxLxV, -1) / (a_t * (1.0 - a_t))
  if mixing == 0:
    return jnp.where(masked_BxL, rate_mask_BxL, 0.0)
  z_safe_BxL = jnp.minimum(z_BxL, vocab - 1)
  is_z_BxLxV = jax.nn.one_hot(z_safe_BxL, vocab, dtype=logr_BxLxV.dtype)
  q_x_z_BxL = jnp.sum(q_x_BxLxV * is_z_BxLxV, -1)
  log_qr_z_BxL = jnp.sum(log_qr_BxLxV * is_z_BxLxV, -1)
  jumps_BxL = jnp.sum(terms_BxLxV * (1.0 - is_z_BxLxV), -1)
  inv_x_BxL = 1.0 / q_x_z_BxL
  rate_data_BxL = (mixing / vocab / a_t) * (
    jumps_BxL * inv_x_BxL
    + (inv_x_BxL - 1.0) * (log_qr_z_BxL - jnp.log(q_x_z_BxL))
    + jnp.exp(-log_qr_z_BxL)
    - inv_x_BxL
  )
  return jnp.where(masked_BxL, rate_mask_BxL, rate_data_BxL)


def interpolating_step_kl(
  loo_log_probs_BxLxV, x_BxL, z_BxL, alpha_s, alpha_t, mixing: float
) -> jax.Array:
  """Per-position KL(q(z_s | z_t, x) || q(z_s | z_t, r)), r = LOO probs.

  Both posteriors are Bayes through the same transition, which cancels:
  sum_w q_w log(q_s(w | x) / q_s(w | r)) + log(q_t(z | r) / q_t(z | x)); the
  mask state's marginal does not depend on x, so only data states remain.
  Impossible (x, z_t) pairs (p_u = 0, unmasked z_t != x) contribute 0.
  """
  vocab = loo_log_probs_BxLxV.shape[-1]
  logr_BxLxV = as_float(loo_log_probs_BxLxV)
  is_x_BxLxV = jax.nn.one_hot(x_BxL, vocab, dtype=logr_BxLxV.dtype)
  post_BxLxV = interpolating_posterior(
    is_x_BxLxV, z_BxL, alpha_s, alpha_t, mixing
  )[..., :vocab]
  log_sr_BxLxV, q_sx_BxLxV = _data_log_marginals(
    logr_BxLxV, x_BxL, alpha_s, mixing
  )
  ok_BxLxV = post_BxLxV > 0
  diff_BxLxV = jnp.log(jnp.where(ok_BxLxV, q_sx_BxLxV, 1.0)) - log_sr_BxLxV
  kl_BxL = jnp.sum(jnp.where(ok_BxLxV, post_BxLxV * diff_BxLxV, 0.0), -1)
  log_tr_BxLxV, q_tx_BxLxV = _data_log_marginals(
    logr_BxLxV, x_BxL, alpha_t, mixing
  )
  is_z_BxLxV = jax.nn.one_hot(z_BxL, vocab, dtype=logr_BxLxV.dtype)
  q_tx_z_BxL = jnp.sum(q_tx_BxLxV * is_z_BxLxV, -1)
  log_tr_z_BxL = jnp.sum(
    jnp.where(is_z_BxLxV > 0, log_tr_BxLxV, 0.0), -1
  )  # z = m: both marginals equal, the term below is 0
  possible_BxL = (z_BxL == vocab) | (q_tx_z_BxL > 0)
  data_BxL = z_BxL < vocab
  tail_BxL = jnp.where(
    data_BxL & possible_BxL,
    log_tr_z_BxL - jnp.log(jnp.where(q_tx_z_BxL > 0, q_tx_z_BxL, 1.0)),
    0.0,
  )
  kl_BxL = jnp.where(possible_BxL, kl_BxL + tail_BxL, 0.0)
  if mixing == 0:
    # Unmasked tokens never change: both posteriors are the same point mass.
    kl_BxL = jnp.where(data_BxL, 0.0, kl_BxL)
  return kl_BxL


@dataclasses.dataclass(frozen=True)
class InterpolatingDiffusion(PluginNELBO):
  """Masked + uniform mixture over V tokens and the mask id V.

  The reported NELBO is a full bound (as UniformDiffusion's): the closed-form
  reconstruction at t_min (continuous) or t = 0 (T steps) with the Bayes
  decoder p(x | z) ~ q(z | x), the diffusion term with the LOO probabilities
  plugged into the posterior, and KL(q(z_1 | x) || q(z_1 | uniform x)) per
  token. At mixing = 0 the first two equal MaskedDiffusion's NELBO (which
  has no prior term); at mixing = 1 all three equal UniformDiffusion's.

  Attributes:
    schedule: keep-probability alpha(t).
    vocab_size: V, the number of data tokens (the mask id is V).
    mixing: p_u in [0, 1], the uniform share of the noise pi.
    num_steps: 0 for the continuous-time NELBO, T > 0 for the T-step one.
    t_min: continuous times are drawn from [t_min, 1].
    antithetic: stratify the batch's times (MD4).
    loss_type: 'elbo' or 'simple_ce' (denoiser cross-entropy at every
      position); both report the NELBO.
    parameterization: 'denoiser' or 'loo', what the network's V logits are.
  """

  schedule: Schedule
  vocab_size: int
  mixing: float = 0.1
  num_steps: int = 0
  t_min: float = 1e-3
  antithetic: bool = True
  loss_type: str = 'elbo'
  parameterization: str = 'denoiser'

  causal = False
  family = 'interpolating'

  def __post_init__(self):
    check_common(self)
    if not 0.0 <= self.mixing <= 1.0:
      raise ValueError(
        f'mixing (p_u) must lie in [0, 1] (0 masked, 1 uniform), got '
        f'{self.mixing}.'
      )

  @property
  def requires_time_conditioning(self) -> bool:
    """Only the purely masked end has a time-free optimal denoiser."""
    return self.mixing > 0

  @property
  def mask_id(self) -> int:
    return self.vocab_size

  @property
  def input_vocab_size(self) -> int:
    """Embedding rows the network needs: V data tokens plus the mask."""
    return self.vocab_size + 1

  def constant_nats(self):
    """(reconstruction, prior) nats per token (see mixture_constants)."""
    t_rec = 0.0 if self.num_steps else self.t_min
    recon, _ = mixture_constants(
      schedule_alpha(self.schedule, t_rec), self.vocab_size, self.mixing
    )
    _, prior = mixture_constants(
      schedule_alpha(self.schedule, 1.0), self.vocab_size, self.mixing
    )
    return recon, prior

  def _from_pi(self, key: jax.Array, frac_BxL, shape):
    """Draws from pi: mask if frac < 1 - p_u, else a uniform data token."""
    tokens = jax.random.randint(
      jax.random.fold_in(key, 1), shape, 0, self.vocab_size, dtype=jnp.int32
    )
    return jnp.where(frac_BxL < 1.0 - self.mixing, self.mask_id, tokens)

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_B: jax.Array):
    """z_t ~ q(z_t | x): keep w.p. alpha(t), else a draw from pi.

    One uniform u per token decides both (keep if u < alpha, then mask if
    (u - alpha) / (1 - alpha) < 1 - p_u), so p_u = 0 gives exactly
    MaskedDiffusion.corrupt's z_t and p_u = 1 UniformDiffusion.corrupt's.
    """
    alpha_Bx1 = self.schedule.alpha(t_B)[:, None]
    u_BxL = jax.random.uniform(key, x_BxL.shape)
    keep_BxL = u_BxL < alpha_Bx1
    frac_BxL = (u_BxL - alpha_Bx1) / jnp.maximum(1.0 - alpha_Bx1, 1e-30)
    noise_BxL = self._from_pi(key, frac_BxL, x_BxL.shape)
    return jnp.where(keep_BxL, x_BxL, noise_BxL.astype(x_BxL.dtype))

  def forward_marginal(self, x_probs_BxLxV, alpha) -> jax.Array:
    """q(z | x) = alpha x + (1 - alpha) pi over V + 1 ids."""
    return interpolating_marginal(x_probs_BxLxV, alpha, self.mixing)

  def prior_sample(self, key: jax.Array, shape) -> jax.Array:
    """z_1 ~ q(z_1 | uniform x): the prior the bound's last term uses.

    The mask w.p. (1 - alpha(1)) (1 - p_u), else a uniform data token.
    """
    alpha1 = schedule_alpha(self.schedule, 1.0)
    mask_prob = (1.0 - alpha1) * (1.0 - self.mixing)
    u = jax.random.uniform(key, shape)
    tokens = jax.random.randint(
      jax.random.fold_in(key, 1), shape, 0, self.vocab_size, dtype=jnp.int32
    )
    return jnp.where(u < mask_prob, self.mask_id, tokens)

  def denoiser_log_probs(self, logits_BxLxV, z_BxL, t_B) -> jax.Array:
    """log p(x^i | z_t) over V (converted when the network outputs LOO).

    May hold -inf (tokens z_t rules out, only at p_u = 0).
    """
    logits = as_float(logits_BxLxV)
    log_lik_BxLxV = _log_likelihood(
      z_BxL, self.vocab_size, self.schedule.alpha(t_B), self.mixing
    )
    if self.parameterization == 'loo':
      logits = logits + log_lik_BxLxV
    else:
      # The exact denoiser is 0 on tokens that cannot have produced z_t
      # (p_u = 0: MDLM's SUBS carry-over); elsewhere this adds 0.
      logits = logits + jnp.where(jnp.isinf(log_lik_BxLxV), -jnp.inf, 0.0)
    return jax.nn.log_softmax(logits, axis=-1)

  def loo_log_probs(self, logits_BxLxV, z_BxL, t_B) -> jax.Array:
    """log p(x^i | z_t^{-i}) over V (converted when it is a denoiser)."""
    logits = as_float(logits_BxLxV)
    if self.parameterization == 'denoiser':
      logits = interp_denoiser_to_loo_logits(
        logits, z_BxL, self.schedule.alpha(t_B), self.mixing
      )
    return jax.nn.log_softmax(logits, axis=-1)

  def posterior_probs(self, x_probs_BxLxV, z_BxL, s_B, t_B) -> jax.Array:
    """q(z_s | z_t, x) [B, L, V + 1]; linear in x (a denoiser)."""
    return interpolating_posterior(
      x_probs_BxLxV,
      z_BxL,
      self.schedule.alpha(jnp.asarray(s_B)),
      self.schedule.alpha(jnp.asarray(t_B)),
      self.mixing,
    )

  def diffusion_terms(self, logits_BxLxV, x_BxL, z_BxL, t_B) -> jax.Array:
    """Per-position diffusion terms (rate, or one step's KL), LOO plugged in."""
    loo_BxLxV = self.loo_log_probs(logits_BxLxV, z_BxL, t_B)
    alpha_t = self.schedule.alpha(t_B)
    if self.num_steps:
      s_B = jnp.maximum(t_B - 1.0 / self.num_steps, 0.0)
      return interpolating_step_kl(
        loo_BxLxV, x_BxL, z_BxL, self.schedule.alpha(s_B), alpha_t, self.mixing
      )
    return interpolating_nelbo_rate(
      loo_BxLxV, x_BxL, z_BxL, alpha_t, self.mixing
    )

  def aux_stats(self, x_BxL, z_BxL, valid_BxL) -> dict:
    """Per-sequence statistics logged with the loss."""
    denom_B = jnp.maximum(valid_BxL.sum(-1), 1.0)
    masked_BxL = (z_BxL == self.mask_id) * valid_BxL
    changed_BxL = (z_BxL != x_BxL) * valid_BxL
    return {
      'masked_fraction': masked_BxL.sum(-1) / denom_B,
      'changed_fraction': changed_BxL.sum(-1) / denom_B,
    }


@ProcessConfig.register('interpolating')
@dataclasses.dataclass(frozen=True)
class InterpolatingConfig(PluginConfig):
  """config.process of interpolating diffusion: mixing = the uniform share
  p_u of the noise (0 masked, 1 uniform)."""

  mixing: float = 0.5

  family: ClassVar[str] = 'interpolating'

  def check(self, backbone: Backbone, seq_len: int) -> None:
    # Only the purely masked end (mixing 0) has a time-free optimal
    # denoiser, as InterpolatingDiffusion.requires_time_conditioning says.
    if self.mixing > 0 and not backbone.time_conditioning:
      raise ValueError(
        f'process.kind={self.kind!r} with mixing={self.mixing} needs a '
        'time-conditioned network (the optimal denoiser depends on t); set '
        '--config.model.time_conditioning=True.'
      )

  def build(self, vocab_size: int) -> InterpolatingDiffusion:
    return InterpolatingDiffusion(
      **self.process_kwargs(vocab_size), mixing=self.mixing
    )
