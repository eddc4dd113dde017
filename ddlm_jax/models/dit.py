"""The MDLM / Duo / BD3-LM diffusion transformer (DiT) as a run backbone.

The layout of those projects' `DIT`, built from this suite's layers so a
run trains, evaluates and samples it like any backbone
(`config.model.backbone='dit'`), and a converted checkpoint
(`interop.dit`) loads into it by parameter path. How it differs from
`models.Transformer`:

- LayerNorm without bias (not RMSNorm), eps 1e-5, in float32;
- a biased GELU (tanh) MLP of width 4 x D;
- adaLN modulation in every block, always present (a time-free DiT still
  modulates, by the constant c = time_mlp(features(0))), biased, whose
  gates multiply the branch: x + gate * f(norm(x) * (1 + scale) + shift);
- a modulated final norm (shift, scale) and a biased head;
- a time MLP 256 -> C -> C (SiLU after each layer) on [cos, sin] features
  of the noise level sigma, with frequencies 1e4^(-j / 128) and no 1000x
  time scale.

The attention is the suite's `SelfAttention` (fused (3, H, K) projection,
rotate-half rotary of base 1e4, bidirectional), which has the layout's
shapes. Time: with `time_conditioning` the network reads the noise level
sigma(t) = -log(1 - (1 - eps) t) of MDLM's log-linear schedule
(`time_input='loglinear_sigma'`, eps 1e-3) or the process's t itself
(`time_input='t'`); without it, sigma = 0, as those projects pass. The
first is what a converted time-conditioned checkpoint was trained on.

Plain passes only: block diffusion (BD3-LM's concat(z_t, x) with its
key/value cache) runs on `model.backbone='transformer'`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ddlm_jax.diffusion.base import BlockProcess
from ddlm_jax.errors import ConfigError
from ddlm_jax.models.attention import ATTENTION_IMPLS, SelfAttention
from ddlm_jax.models.backbones import register_backbone
from ddlm_jax.models.layers import MLP, Dense, param

NAME = 'dit'
FREQ_DIM = 256  # Sinusoidal features the time MLP reads.
LOGLINEAR_EPS = 1e-3  # MDLM's log-linear schedule: sigma(1) = -log(eps).
TIME_INPUTS = ('loglinear_sigma', 't')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class DiTConfig:
  """Shape and options of the DiT (module docstring)."""

  vocab_size: int  # Logits per position.
  input_vocab_size: int  # Embedding rows (data tokens plus mask).
  width: int = 64
  depth: int = 2
  num_heads: int = 4
  mlp_dim: int = 0  # 0 means 4 * width, the layout's ratio.
  cond_dim: int = 32  # C: width of the time embedding.
  time_conditioning: bool = False
  time_input: str = 'loglinear_sigma'
  rope_theta: float = 10_000.0
  attention_impl: str = 'xla'
  dtype: str = 'float32'  # Compute dtype; parameters stay float32.

  def __post_init__(self):
    if self.time_input not in TIME_INPUTS:
      raise ConfigError(
        f'model.time_input={self.time_input!r}; choose one of {TIME_INPUTS}.'
      )
    if self.dtype not in DTYPES:
      raise ConfigError(
        f'model.dtype={self.dtype!r}; choose one of {list(DTYPES)}.'
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ConfigError(
        f'model.attention_impl={self.attention_impl!r}; choose one of '
        f'{ATTENTION_IMPLS}.'
      )
    for key, lo in (
      ('width', 1), ('depth', 1), ('num_heads', 1), ('cond_dim', 1),
      ('mlp_dim', 0),
    ):  # fmt: skip
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f'model.{key}={value!r}; use an int >= {lo}.')
    if self.width % self.num_heads or (self.width // self.num_heads) % 2:
      raise ConfigError(
        f'model.width={self.width} is not divisible by model.num_heads='
        f'{self.num_heads} into an even head size (rotary embeddings rotate '
        'pairs); change one of them.'
      )
    if self.input_vocab_size < self.vocab_size:
      raise ConfigError('input_vocab_size must be >= vocab_size.')


class LayerNorm(nnx.Module):
  """LayerNorm with a scale and no bias, computed in float32."""

  def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
    self.scale = param(rngs, nnx.initializers.ones, (dim,), ('embed',))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...]
    return y.astype(x.dtype)


def _modulation(cfg: DiTConfig, parts: int, rngs: nnx.Rngs) -> Dense:
  """c [B, C] -> [B, parts, D]; zero-initialised, so a fresh network's
  blocks start as gate-0 identities (the layout's own init)."""
  return Dense(
    (cfg.cond_dim,),
    (parts, cfg.width),
    ('cond',),
    ('modulation', 'embed'),
    rngs=rngs,
    use_bias=True,
    init=nnx.initializers.zeros,
  )


def _modulate(h, shift, scale):
  return h * (1 + scale) + shift


class DiTBlock(nnx.Module):
  """x + gate1 * attn(mod(norm1(x))), then x + gate2 * mlp(mod(norm2(x)))."""

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    dtype = DTYPES[cfg.dtype]
    self.norm1 = LayerNorm(cfg.width, rngs=rngs)
    self.attn = SelfAttention(
      cfg.width,
      cfg.num_heads,
      causal=False,
      impl=cfg.attention_impl,
      rope_theta=cfg.rope_theta,
      rngs=rngs,
      dtype=dtype,
    )
    self.norm2 = LayerNorm(cfg.width, rngs=rngs)
    self.mlp = MLP(
      cfg.width,
      cfg.mlp_dim or 4 * cfg.width,
      'gelu',
      rngs=rngs,
      dtype=dtype,
      use_bias=True,
    )
    self.modulation = _modulation(cfg, 6, rngs)

  def __call__(self, x_BxLxD: jax.Array, c_BxC: jax.Array) -> jax.Array:
    mod_Bx6x1xD = self.modulation(c_BxC)[:, :, None].astype(x_BxLxD.dtype)
    shift1, scale1, gate1, shift2, scale2, gate2 = [
      mod_Bx6x1xD[:, i] for i in range(6)
    ]
    h = _modulate(self.norm1(x_BxLxD), shift1, scale1)
    x_BxLxD = x_BxLxD + gate1 * self.attn(h)
    h = _modulate(self.norm2(x_BxLxD), shift2, scale2)
    return x_BxLxD + gate2 * self.mlp(h)


def time_features(sigma_B: jax.Array, dim: int = FREQ_DIM) -> jax.Array:
  """[cos, sin] of sigma * 1e4^(-j / half): the time MLP's input [B, dim]."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(half) / half)
  args_BxF = sigma_B[:, None].astype(jnp.float32) * freqs[None]
  return jnp.concatenate([jnp.cos(args_BxF), jnp.sin(args_BxF)], -1)


class DiT(nnx.Module):
  """tokens_BxL (+ t_B) -> logits_BxLxV in the DiT layout."""

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedding = param(
      rngs,
      nnx.initializers.normal(stddev=1.0),
      (cfg.input_vocab_size, cfg.width),
      ('vocab', 'embed'),
    )
    dense = lambda i: Dense(
      (i,), (cfg.cond_dim,), ('cond',), ('cond',), rngs=rngs, use_bias=True
    )
    self.time_mlp = nnx.List([dense(FREQ_DIM), dense(cfg.cond_dim)])
    self.blocks = nnx.List([DiTBlock(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.final_norm = LayerNorm(cfg.width, rngs=rngs)
    self.final_modulation = _modulation(cfg, 2, rngs)
    self.head = Dense(
      (cfg.width,),
      (cfg.vocab_size,),
      ('embed',),
      ('vocab',),
      rngs=rngs,
      use_bias=True,
      init=nnx.initializers.zeros,
      out_dtype=jnp.float32,
    )

  def embed(self, tokens_BxL: jax.Array) -> jax.Array:
    """Ids [B, L], or soft inputs [B, L, V_in] on the simplex (Duo's
    relaxed latent), to embeddings [B, L, D]."""
    table_VxD = self.embedding[...].astype(DTYPES[self.cfg.dtype])
    if tokens_BxL.ndim == 3:
      if tokens_BxL.shape[-1] != table_VxD.shape[0]:
        raise ValueError(
          f'soft inputs have {tokens_BxL.shape[-1]} classes; the embedding '
          f'has {table_VxD.shape[0]} rows.'
        )
      return tokens_BxL.astype(table_VxD.dtype) @ table_VxD
    return jnp.take(table_VxD, tokens_BxL, axis=0)

  def sigma(self, t_B: jax.Array | None, batch: int) -> jax.Array:
    """The noise level the time MLP reads (module docstring)."""
    if not self.cfg.time_conditioning:
      return jnp.zeros((batch,), jnp.float32)
    if t_B is None:
      raise ValueError('This DiT is time-conditioned: pass t_B.')
    t_B = jnp.broadcast_to(jnp.asarray(t_B, jnp.float32), (batch,))
    if self.cfg.time_input == 't':
      return t_B
    return -jnp.log1p(-(1.0 - LOGLINEAR_EPS) * t_B)

  def condition(self, sigma_B: jax.Array) -> jax.Array:
    """c [B, C] = silu(mlp1(silu(mlp0(features(sigma)))))."""
    h_BxC = jax.nn.silu(self.time_mlp[0](time_features(sigma_B)))
    return jax.nn.silu(self.time_mlp[1](h_BxC))

  def __call__(
    self, tokens_BxL: jax.Array, t_B=None, *, block_size: int | None = None
  ) -> jax.Array:
    """Logits [B, L, V] (float32)."""
    if block_size:
      raise ValueError(
        'the DiT backbone runs plain passes only; block diffusion needs '
        "model.backbone='transformer'."
      )
    x_BxLxD = self.embed(tokens_BxL)
    c_BxC = self.condition(self.sigma(t_B, x_BxLxD.shape[0]))
    for block in self.blocks:
      x_BxLxD = block(x_BxLxD, c_BxC)
    mod_Bx2x1xD = self.final_modulation(c_BxC)[:, :, None]
    mod_Bx2x1xD = mod_Bx2x1xD.astype(x_BxLxD.dtype)
    h_BxLxD = _modulate(
      self.final_norm(x_BxLxD), mod_Bx2x1xD[:, 0], mod_Bx2x1xD[:, 1]
    )
    return self.head(h_BxLxD).astype(jnp.float32)


# ------------------------------------------------------------ run backbone

# Keys of config.model this backbone reads (all DiTConfig's but the sizes
# the process decides).
MODEL_KEYS = tuple(
  f.name
  for f in dataclasses.fields(DiTConfig)
  if f.name not in ('vocab_size', 'input_vocab_size')
)
# Keys of the transformer and hybrid that a shared config.model block
# carries (experiments/configs/common.py): accepted and not read, so
# --config.model.backbone=dit switches a preset's network.
OTHER_BACKBONE_KEYS = (
  'backbone', 'mlp_kind', 'tied_embeddings', 'remat', 'pattern', 'ssm_kind',
  'state_size', 'num_dict', 'scan_impl',
)  # fmt: skip


def run_model_config(model: Mapping[str, Any], process) -> DiTConfig:
  """The DiTConfig of a run's config.model block and its process.

  The vocabulary and embedding rows come from the process; block
  processes and causal (autoregressive) ones are refused, and so are keys
  neither the DiT nor the shared block's other backbones have.
  """
  unknown = sorted(set(model) - set(MODEL_KEYS) - set(OTHER_BACKBONE_KEYS))
  if unknown:
    raise ConfigError(
      f'config.model has keys the {NAME} backbone does not take: {unknown};'
      f' it takes {sorted(MODEL_KEYS)}.'
    )
  if process.causal:
    raise ConfigError(
      f"model.backbone='{NAME}' is bidirectional; an autoregressive process "
      "needs model.backbone='transformer'."
    )
  if isinstance(process, BlockProcess):
    raise ConfigError(
      f"model.backbone='{NAME}' runs plain passes only; a block-diffusion "
      "process needs model.backbone='transformer'."
    )
  kwargs = {k: model[k] for k in MODEL_KEYS if k in model}
  return DiTConfig(
    vocab_size=int(process.output_size),
    input_vocab_size=int(process.input_vocab_size),
    **kwargs,
  )


def _build(mcfg: DiTConfig, model, rngs) -> DiT:
  del model  # Everything the network needs is in its config.
  return DiT(mcfg, rngs=rngs)


register_backbone(NAME, run_model_config, _build)
