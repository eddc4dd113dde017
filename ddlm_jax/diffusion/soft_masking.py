"""Soft-masking's two-pass training objective (arXiv 2510.17206).

With probability sm_prob a batch runs two passes on the same z_t: pass 1 is
the plain network with its gradient stopped, pass 2 reads pass 1's logits
through the soft-masking input layer (ddlm_jax.models.soft_masking) and is
trained with the usual NELBO. Otherwise a plain pass is trained. Pass 2
depends only on z_t (pass 1 is a deterministic function of z_t), so its NELBO
is still a valid bound: evaluation always uses the two-pass path
(`evaluation_process`).

The coin is drawn per batch, so a plain batch costs one forward and
backward and a two-pass batch one extra forward; `lax.cond` runs only the
branch taken, in the forward and the backward pass.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.masked import MaskedDiffusion


@dataclasses.dataclass(frozen=True)
class SoftMaskedDiffusion(MaskedDiffusion):
  """Masked diffusion trained and evaluated through soft-masking.

  `apply` must be a soft-masked denoiser: apply(z, t, prev_logits=...) and
  apply.feedback_lambda(prev_logits) (models.soft_masking.SoftMaskedModel).

  Attributes:
    sm_prob: probability that a training batch takes the two-pass path.
  """

  sm_prob: float = 0.8

  def __post_init__(self):
    super().__post_init__()
    if not 0.0 <= self.sm_prob <= 1.0:
      raise ValueError(f'sm_prob must be in [0, 1], got {self.sm_prob}.')

  @property
  def evaluation_process(self) -> SoftMaskedDiffusion:
    """The same process with the two-pass path always on (a valid bound)."""
    return dataclasses.replace(self, sm_prob=1.0)

  @classmethod
  def from_masked(cls, process: MaskedDiffusion, sm_prob: float):
    """The soft-masked twin of a masked process (same fields)."""
    fields = {
      f.name: getattr(process, f.name) for f in dataclasses.fields(process)
    }
    return cls(**fields, sm_prob=sm_prob)

  def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
    """One Monte-Carlo sample of the loss; see MaskedDiffusion.loss.

    aux adds 'sm_lambda' (mean lambda over masked positions, from the
    plain prediction at z_t, which is pass 1's), 'sm_two_pass' (1 when the
    batch took the two-pass path) and the scalars 'sm_w_s/a/b'.
    """
    if not hasattr(apply, 'feedback_lambda'):
      raise TypeError(
        'SoftMaskedDiffusion needs a soft-masked model '
        '(ddlm_jax.models.soft_masking.SoftMaskedModel); set '
        'config.soft_mask.enabled consistently for model and process.'
      )
    # The same (t, z_t) as the plain process for the same key.
    t_B, weight_B, z_BxL = self.draw(key, x_BxL)
    coin_key = jax.random.fold_in(key, 1)

    def two_pass():
      prev_BxLxV = jax.lax.stop_gradient(apply(z_BxL, t_B))
      logits_BxLxV = apply(z_BxL, t_B, prev_logits=prev_BxLxV)
      return logits_BxLxV, apply.feedback_lambda(prev_BxLxV)

    def plain():
      logits_BxLxV = apply(z_BxL, t_B)
      lam_BxL = apply.feedback_lambda(jax.lax.stop_gradient(logits_BxLxV))
      return logits_BxLxV, lam_BxL

    if self.sm_prob >= 1.0:
      use_two, (logits_BxLxV, lam_BxL) = jnp.bool_(True), two_pass()
    elif self.sm_prob <= 0.0:
      use_two, (logits_BxLxV, lam_BxL) = jnp.bool_(False), plain()
    else:
      use_two = jax.random.uniform(coin_key) < self.sm_prob
      logits_BxLxV, lam_BxL = jax.lax.cond(use_two, two_pass, plain)
    objective_B, nelbo_B, aux = self.bound(
      logits_BxLxV, x_BxL, z_BxL, t_B, weight_B, loss_mask_BxL
    )
    masked_BxL = (z_BxL == self.mask_id).astype(jnp.float32)
    lam_BxL = jax.lax.stop_gradient(lam_BxL)
    aux['sm_lambda'] = jnp.sum(lam_BxL * masked_BxL) / jnp.maximum(
      jnp.sum(masked_BxL), 1.0
    )
    aux['sm_two_pass'] = use_two.astype(jnp.float32)
    w_s, w_a, w_b = apply.soft_mask.scalars()
    aux.update(sm_w_s=w_s, sm_w_a=w_a, sm_w_b=w_b)
    return objective_B, nelbo_B, aux
