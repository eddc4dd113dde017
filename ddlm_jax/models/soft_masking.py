"""Soft-masking (SM, arXiv 2510.17206): masked inputs that carry a guess.

A still-masked position normally enters the network as the mask embedding
E[m]. With soft-masking it enters as a blend of E[m] and the previous
prediction's top-k tokens, weighted by how confident that prediction was
(arXiv 2510.17206):

  pi = softmax(top_k(logits_prev)),  H = entropy(softmax(logits_prev))
  lambda = w_s * sigmoid(w_a * (-H - w_b))
  e = (1 - lambda) * E[m] + lambda * sum_j pi_j * E[idx_j]

with three learned scalars w_s = sigmoid(r_s), w_a = softplus(r_a) and
w_b = -softplus(r_b). Unmasked positions keep their embedding. The math is in
pure functions; `SoftMaskedModel` wraps any backbone that splits its forward
pass into embed / backbone / logits (the transformer and the hybrid SSM
backbone), so a plain MDLM checkpoint is its `net` subtree.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

# Paper initialisation (arXiv 2510.17206). w_s starts near 0 in the
# paper; short runs start it higher (configurable).
PAPER_W_A = 6.66
PAPER_W_B = -0.75
PAPER_W_S = 0.01


def inverse_softplus(y: float) -> float:
  """x with softplus(x) = y > 0."""
  if y <= 0:
    raise ValueError(f'softplus is positive; cannot invert {y}.')
  return y + math.log(-math.expm1(-y))


def logit(p: float) -> float:
  """x with sigmoid(x) = p in (0, 1)."""
  if not 0.0 < p < 1.0:
    raise ValueError(f'w_s must be in (0, 1), got {p}.')
  return math.log(p) - math.log1p(-p)


def sm_scalars(r_s, r_a, r_b):
  """Raw parameters -> (w_s in (0, 1), w_a > 0, w_b < 0)."""
  return jax.nn.sigmoid(r_s), jax.nn.softplus(r_a), -jax.nn.softplus(r_b)


def predictive_entropy(logits_BxLxV: jax.Array) -> jax.Array:
  """Entropy (nats) of softmax(logits) at each position: [B, L]."""
  logp = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def feedback_lambda(logits_prev_BxLxV, w_s, w_a, w_b) -> jax.Array:
  """lambda = w_s * sigmoid(w_a * (-H - w_b)): [B, L] in (0, w_s)."""
  h_BxL = predictive_entropy(logits_prev_BxLxV)
  return w_s * jax.nn.sigmoid(w_a * (-h_BxL - w_b))


def top_k_mixture(logits_prev_BxLxV: jax.Array, k: int):
  """(idx_BxLxK, pi_BxLxK): the k most likely tokens, renormalised."""
  z_BxLxK, idx_BxLxK = jax.lax.top_k(logits_prev_BxLxV.astype(jnp.float32), k)
  return idx_BxLxK, jax.nn.softmax(z_BxLxK, axis=-1)


def soft_mask_embeddings(
  x_BxLxD: jax.Array,
  table_VxD: jax.Array,
  masked_BxL: jax.Array,
  logits_prev_BxLxV: jax.Array,
  lam_BxL: jax.Array,
  k: int,
) -> jax.Array:
  """Blends the masked positions of x (which hold E[m]) with the top-k mix.

  Unmasked positions are returned unchanged, bit for bit.
  """
  idx_BxLxK, pi_BxLxK = top_k_mixture(logits_prev_BxLxV, k)
  emb_BxLxKxD = jnp.take(table_VxD, idx_BxLxK, axis=0)
  mix_BxLxD = jnp.einsum('blk,blkd->bld', pi_BxLxK.astype(x_BxLxD.dtype),
                         emb_BxLxKxD)  # fmt: skip
  lam_BxLx1 = lam_BxL[..., None].astype(x_BxLxD.dtype)
  blended_BxLxD = (1.0 - lam_BxLx1) * x_BxLxD + lam_BxLx1 * mix_BxLxD
  return jnp.where(masked_BxL[..., None], blended_BxLxD, x_BxLxD)


class SoftMaskInput(nnx.Module):
  """The three SM scalars (r_s, r_a, r_b) and the top-k size."""

  def __init__(
    self,
    *,
    k: int = 3,
    w_s: float = PAPER_W_S,
    w_a: float = PAPER_W_A,
    w_b: float = PAPER_W_B,
  ):
    if int(k) != k or k < 1:
      raise ValueError(f'soft_mask.k must be an integer >= 1, got {k!r}.')
    if w_a <= 0 or w_b >= 0:
      raise ValueError(
        f'soft-masking needs w_a > 0 and w_b < 0, got w_a={w_a}, w_b={w_b}.'
      )
    self.k = int(k)
    scalar = lambda v: nnx.Param(
      jnp.asarray(v, jnp.float32), out_sharding=(), eager_sharding=False
    )
    self.r_s = scalar(logit(w_s))
    self.r_a = scalar(inverse_softplus(w_a))
    self.r_b = scalar(inverse_softplus(-w_b))

  def scalars(self):
    return sm_scalars(self.r_s[...], self.r_a[...], self.r_b[...])

  def lam(self, logits_prev_BxLxV: jax.Array) -> jax.Array:
    return feedback_lambda(logits_prev_BxLxV, *self.scalars())


class SoftMaskedModel(nnx.Module):
  """A denoiser whose masked inputs read the previous prediction.

  model(z_BxL, t_B) is the plain network (lambda = 0). With prev_logits,
  masked positions get the soft-masked embedding; `use_prev` (a boolean
  scalar) switches the feedback off inside a traced loop, exactly.
  """

  # Samplers thread the previous logits through their loops for such nets.
  uses_feedback = True

  def __init__(self, net: nnx.Module, mask_id: int, soft_mask: SoftMaskInput):
    for name in ('embed', 'backbone', 'logits', 'embedding'):
      if not hasattr(net, name):
        raise TypeError(
          f'{type(net).__name__} has no {name!r}; soft-masking needs a '
          'backbone split into embed / backbone / logits.'
        )
    self.net = net
    self.mask_id = int(mask_id)
    self.soft_mask = soft_mask

  def feedback_lambda(self, prev_logits_BxLxV: jax.Array) -> jax.Array:
    """lambda at every position for these previous logits: [B, L]."""
    return self.soft_mask.lam(prev_logits_BxLxV)

  def __call__(self, z_BxL, t_B=None, prev_logits=None, use_prev=True):
    x_BxLxD = self.net.embed(z_BxL)
    if prev_logits is not None:
      lam_BxL = self.feedback_lambda(prev_logits)
      lam_BxL = jnp.where(use_prev, lam_BxL, 0.0)
      table_VxD = self.net.embedding[...].astype(x_BxLxD.dtype)
      x_BxLxD = soft_mask_embeddings(
        x_BxLxD,
        table_VxD,
        z_BxL == self.mask_id,
        prev_logits,
        lam_BxL,
        self.soft_mask.k,
      )
    return self.net.logits(self.net.backbone(x_BxLxD, t_B))
