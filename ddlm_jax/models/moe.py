"""Mixture-of-experts feed-forward: a softmax top-k router and GELU experts.

The router follows the Gemma-4 layout: an unscaled RMS norm of the residual
stream, a learned per-channel scale times width**-0.5, a linear map to
expert scores, a float32 softmax, top-k, renormalisation of the k weights
to sum to one, and a learned per-expert scale on the chosen weights.

The experts are computed densely (every expert on every token, weighted by
a combine matrix that is zero off the chosen k). That is exact and simple
at the sizes this suite trains; a token-dropping dispatch would only pay
off with many experts on an accelerator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.models.layers import Dense, param


def gelu_tanh(x: jax.Array) -> jax.Array:
  """Tanh-approximate GELU computed in float32, returned in x's dtype."""
  return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) over the last axis in float32, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  mean_sq = jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps
  return (x32 * jax.lax.rsqrt(mean_sq)).astype(x.dtype)


class TopKRouter(nnx.Module):
  """Scores experts per token; returns (weights, indices), each [N, K]."""

  def __init__(
    self,
    dim: int,
    num_experts: int,
    top_k: int,
    *,
    rngs: nnx.Rngs,
    eps: float = 1e-6,
    dtype=jnp.float32,
  ):
    if not 1 <= top_k <= num_experts:
      raise ValueError(
        f'top_k={top_k} with {num_experts} experts; choose 1 <= top_k <= '
        'num_experts.'
      )
    self.top_k, self.eps, self.dim = top_k, eps, dim
    self.proj = Dense(
      (dim,), (num_experts,), ('embed',), (None,), rngs=rngs, dtype=dtype,
      param_dtype=dtype,
    )  # fmt: skip
    self.scale = param(rngs, nnx.initializers.ones, (dim,), ('embed',), dtype)
    self.per_expert_scale = param(
      rngs, nnx.initializers.ones, (num_experts,), ('expert',), dtype
    )

  def __call__(self, x_NxD: jax.Array) -> tuple[jax.Array, jax.Array]:
    h_NxD = rms_normalize(x_NxD, self.eps)
    h_NxD = h_NxD * self.scale[...].astype(h_NxD.dtype)
    # The width factor is applied in float32 and rounded once.
    h_NxD = (h_NxD.astype(jnp.float32) * self.dim**-0.5).astype(h_NxD.dtype)
    scores_NxE = self.proj(h_NxD)
    probs_NxE = jax.nn.softmax(scores_NxE.astype(jnp.float32), axis=-1)
    weights_NxK, idx_NxK = jax.lax.top_k(probs_NxE, self.top_k)
    weights_NxK = weights_NxK / jnp.sum(weights_NxK, axis=-1, keepdims=True)
    weights_NxK = weights_NxK * self.per_expert_scale[...][idx_NxK]
    return weights_NxK, idx_NxK


class Experts(nnx.Module):
  """E gated-GELU (tanh) feed-forward experts of hidden width F."""

  def __init__(
    self,
    dim: int,
    hidden: int,
    num_experts: int,
    *,
    rngs: nnx.Rngs,
    dtype=jnp.float32,
    init_std: float = 0.02,
  ):
    init = nnx.initializers.normal(stddev=init_std)
    # Kernels are [E, in, out]; experts split over the 'expert' rule.
    self.gate_up = param(
      rngs, init, (num_experts, dim, 2 * hidden), ('expert', 'embed', 'mlp'),
      dtype,
    )  # fmt: skip
    self.down = param(
      rngs, init, (num_experts, hidden, dim), ('expert', 'mlp', 'embed'), dtype
    )
    self.num_experts, self.hidden = num_experts, hidden

  def __call__(
    self, x_NxD: jax.Array, weights_NxK: jax.Array, idx_NxK: jax.Array
  ) -> jax.Array:
    dtype = x_NxD.dtype
    gate_up_NxEx2F = jnp.einsum(
      'nd,edf->nef', x_NxD, self.gate_up[...].astype(dtype)
    )
    gate_NxExF = gate_up_NxEx2F[..., : self.hidden]
    up_NxExF = gate_up_NxEx2F[..., self.hidden :]
    h_NxExF = gelu_tanh(gate_NxExF) * up_NxExF
    out_NxExD = jnp.einsum(
      'nef,efd->ned', h_NxExF, self.down[...].astype(dtype)
    )
    # Each expert's weighted output is rounded to the compute dtype before
    # the sum, as a scatter-add into a tensor of that dtype would do.
    onehot_NxKxE = jax.nn.one_hot(idx_NxK, self.num_experts)
    combine_NxE = jnp.einsum('nke,nk->ne', onehot_NxKxE, weights_NxK)
    weighted_NxExD = out_NxExD.astype(jnp.float32) * combine_NxE[..., None]
    return jnp.sum(weighted_NxExD.astype(dtype), axis=1)
