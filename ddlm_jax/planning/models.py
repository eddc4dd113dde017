"""Planner, executor and projector on the suite's Transformer backbone.

The planner is a bidirectional, time-free masked-diffusion Transformer (its
input vocabulary has the mask id V); the executor is the causal AR twin (its
extra id is BOS). `planner_hidden` reads the planner's final hidden states
(`Transformer.backbone`), and `executor_logits` runs the executor with the
plan field's input embeddings optionally replaced by soft tokens, which is
how the latent pipeline feeds projected planner states into the executor's
first layer. The projector is an MLP from the planner's width to the
executor's embedding width.
"""

from __future__ import annotations

import jax
from flax import nnx

from ddlm_jax.data import reasoning as rs
from ddlm_jax.diffusion.autoregressive import Autoregressive
from ddlm_jax.models.layers import Dense
from ddlm_jax.models.transformer import Transformer, TransformerConfig


def backbone_config(
  model_cfg, *, causal: bool, vocab_size: int = rs.VOCAB_SIZE
) -> TransformerConfig:
  """TransformerConfig from a config block with width, depth, num_heads;
  `vocab_size` is the task's (default: the arithmetic task's)."""
  return TransformerConfig(
    vocab_size=int(vocab_size),
    input_vocab_size=int(vocab_size) + 1,  # mask id (planner) or BOS (AR)
    width=int(model_cfg.width),
    depth=int(model_cfg.depth),
    num_heads=int(model_cfg.num_heads),
    mlp_kind='swiglu',
    causal=causal,
    time_conditioning=False,
  )


class Projector(nnx.Module):
  """Soft tokens from planner hidden states: [B, P, Dp] -> [B, P, De].

  num_layers = 1 is a linear map; more layers insert GELU hidden layers of
  width `hidden` (0: 2 * max(Dp, De)).
  """

  def __init__(
    self,
    in_dim: int,
    out_dim: int,
    *,
    hidden: int = 0,
    num_layers: int = 2,
    rngs: nnx.Rngs,
  ):
    if num_layers < 1:
      raise ValueError(f'projector num_layers must be >= 1, got {num_layers}.')
    hidden = hidden or 2 * max(in_dim, out_dim)
    dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
    axes = ['embed'] + ['mlp'] * (num_layers - 1) + ['embed']
    self.layers = nnx.List(
      [
        Dense((a,), (b,), (ia,), (ib,), rngs=rngs, use_bias=True)
        for a, b, ia, ib in zip(dims[:-1], dims[1:], axes[:-1], axes[1:])
      ]
    )
    self.in_dim, self.out_dim = in_dim, out_dim

  def __call__(self, h_BxPxDp: jax.Array) -> jax.Array:
    if h_BxPxDp.shape[-1] != self.in_dim:
      raise ValueError(
        f'projector expects width {self.in_dim}, got {h_BxPxDp.shape[-1]}.'
      )
    x = h_BxPxDp
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if i < len(self.layers) - 1:
        x = jax.nn.gelu(x)
    return x


def projector_flops(proj: Projector, num_tokens: int) -> float:
  """Forward FLOPs (2 per multiply-add) of the projector on num_tokens."""
  macs = sum(layer.in_shape[0] * layer.out_shape[0] for layer in proj.layers)
  return 2.0 * macs * num_tokens


def planner_hidden(planner: Transformer, z_BxL: jax.Array) -> jax.Array:
  """Final hidden states (after the last norm) of the planner on z."""
  return planner.backbone(planner.embed(z_BxL))


def executor_logits(
  executor: Transformer,
  tokens_BxL: jax.Array,
  soft_BxPxD: jax.Array | None = None,
) -> jax.Array:
  """Next-token logits of the executor on [question | plan = answer].

  Inputs are the tokens shifted right behind BOS, so position j predicts
  token j. With `soft_BxPxD`, the inputs that carry the plan field (input
  positions plan_start + 1 ... plan_start + P) are these vectors instead of
  token embeddings. The layout [question | plan = answer] puts the plan
  field at L - P - 2 ... L - 3 whatever the task's question length.
  """
  process = Autoregressive(executor.cfg.vocab_size)
  x_BxLxD = executor.embed(process.shift_right(tokens_BxL))
  if soft_BxPxD is not None:
    plan_len = soft_BxPxD.shape[1]
    question_len = tokens_BxL.shape[1] - plan_len - 3
    if question_len < 1:
      raise ValueError(
        f'{plan_len} soft tokens do not fit an executor sequence of length '
        f'{tokens_BxL.shape[1]}.'
      )
    if soft_BxPxD.shape[-1] != x_BxLxD.shape[-1]:
      raise ValueError(
        f'soft tokens have width {soft_BxPxD.shape[-1]}; the executor '
        f'embeds to {x_BxLxD.shape[-1]}.'
      )
    start = question_len + 2  # plan_start + 1
    x_BxLxD = jax.lax.dynamic_update_slice_in_dim(
      x_BxLxD, soft_BxPxD.astype(x_BxLxD.dtype), start, axis=1
    )
  return executor.logits(executor.backbone(x_BxLxD))


def build(cfg: TransformerConfig, seed: int) -> Transformer:
  return Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(seed)))


def pure_params(module: nnx.Module) -> dict:
  """The module's parameters as a plain nested dict of arrays."""
  return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def merge(graphdef, params):
  """Module from a graphdef and a pure parameter dict (inside jit too)."""
  return nnx.merge(graphdef, params)


def split(module: nnx.Module):
  """(graphdef, pure params) of a module."""
  graphdef, state = nnx.split(module)
  return graphdef, nnx.to_pure_dict(state)
