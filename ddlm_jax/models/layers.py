"""The building blocks every model here is made of: Dense, RMSNorm, MLP, Block.

Every parameter is created through `param`, which records logical axis names
(`embed`, `mlp`, `heads`, ...) as the `out_sharding` metadata (`axes_meta`)
with `eager_sharding=False`, so modules build without a mesh. The names are
mapped to mesh axes later by `ddlm_jax.parallel.rules` (`logical_names`,
`logical_to_spec`); models never see mesh axes.

Attribute names are parameter paths: the MLP and Block take the names their
callers have always used (`up`/`gate`/`down` or `fc1`/`fc2`; `attn` or
`mixer`), so checkpoints of every model keep loading.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Initializer = Callable[..., jax.Array]

# (input, gate, output) layer names of the two MLP layouts: the transformer's
# SwiGLU / GELU MLP and the SSM stacks' biased two-layer GELU MLP.
UP_GATE_DOWN = ('up', 'gate', 'down')
FC1_FC2 = ('fc1', None, 'fc2')


def axes_meta(*names: str | None) -> dict:
  """Variable metadata attaching logical axis names (no eager sharding)."""
  return {'out_sharding': tuple(names), 'eager_sharding': False}


def param(
  rngs: nnx.Rngs,
  init: Initializer,
  shape: Sequence[int],
  axes: Sequence[str | None],
  dtype=jnp.float32,
) -> nnx.Param:
  """A parameter with logical axis names; draws one `rngs.params()` key."""
  if len(axes) != len(shape):
    raise ValueError(f'axes {axes} do not match shape {shape}.')
  value = init(rngs.params(), tuple(shape), dtype)
  return nnx.Param(value, **axes_meta(*axes))


class Dense(nnx.Module):
  """y = x @ W (+ b) over the last input axes; W has named axes.

  The default kernel init is normal(fan_in**-0.5); the SSM layers pass
  LeCun-normal (`lecun_dense`). Keys are drawn kernel first, then bias.
  """

  def __init__(
    self,
    in_shape: Sequence[int],
    out_shape: Sequence[int],
    in_axes: Sequence[str | None],
    out_axes: Sequence[str | None],
    *,
    rngs: nnx.Rngs,
    use_bias: bool = False,
    init: Initializer | None = None,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    out_dtype=None,
  ):
    self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
    if init is None:
      init = nnx.initializers.normal(stddev=math.prod(self.in_shape) ** -0.5)
    self.kernel = param(
      rngs,
      init,
      self.in_shape + self.out_shape,
      tuple(in_axes) + tuple(out_axes),
      param_dtype,
    )
    self.bias = (
      param(
        rngs,
        nnx.initializers.zeros,
        self.out_shape,
        tuple(out_axes),
        param_dtype,
      )
      if use_bias
      else None
    )
    self.dtype = dtype
    # The matmul's accumulation/output dtype (None: the compute dtype). The
    # LM head sets float32 so bf16 logits are not rounded before softmax.
    self.out_dtype = out_dtype

  def __call__(self, x: jax.Array, part: slice | None = None) -> jax.Array:
    """x [..., *in_shape] -> [..., *out_shape].

    `part` keeps a slice of the first output axis only, so a fused
    projection (attention's Q/K/V) can compute some of its outputs.
    """
    # One 2-D matmul: XLA's CPU backend runs [M, K] x [K, N] (and its
    # transposes in the backward pass) much faster than batched einsums.
    n_in = len(self.in_shape)
    lead = x.shape[: x.ndim - n_in]
    k = math.prod(self.in_shape)
    kernel, bias = self.kernel[...], self.bias
    bias = None if bias is None else bias[...]
    if part is not None:
      kernel = kernel[(slice(None),) * n_in + (part,)]
      bias = None if bias is None else bias[part]
    out_shape = kernel.shape[n_in:]
    y_MxN = jnp.matmul(
      x.astype(self.dtype).reshape(-1, k),
      kernel.astype(self.dtype).reshape(k, -1),
      preferred_element_type=self.out_dtype,
    )
    y = y_MxN.reshape(lead + out_shape)
    if bias is not None:
      y = y + bias.astype(y.dtype)
    return y


def lecun_dense(
  d_in: int,
  d_out: int,
  axes: tuple[str | None, str | None],
  *,
  rngs: nnx.Rngs,
  param_dtype=jnp.float32,
) -> Dense:
  """Biased d_in -> d_out Dense with a LeCun-normal kernel.

  These are flax `nnx.Linear`'s defaults, with which the SSM layers and the
  sequence classifier were first built; keeping them keeps their inits.
  """
  return Dense(
    (d_in,),
    (d_out,),
    axes[:1],
    axes[1:],
    rngs=rngs,
    use_bias=True,
    init=nnx.initializers.lecun_normal(),
    param_dtype=param_dtype,
  )


class RMSNorm(nnx.Module):
  """RMS normalisation over the last axis, computed in float32."""

  def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-6):
    self.scale = param(rngs, nnx.initializers.ones, (dim,), ('embed',))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.eps) * self.scale[...]
    return y.astype(x.dtype)


class MLP(nnx.Module):
  """Position-wise feed-forward block, dim -> hidden -> out_dim.

  kind='swiglu': down(silu(gate(x)) * up(x)); kind='gelu': down(gelu(up(x))).
  `names` are the (input, gate, output) attribute names, i.e. parameter
  paths: `UP_GATE_DOWN` (transformer) or `FC1_FC2` (SSM stacks, GELU only).
  `axes` are the logical names of (input, hidden, output).
  """

  def __init__(
    self,
    dim: int,
    hidden: int,
    kind: str,
    *,
    rngs: nnx.Rngs,
    dtype=jnp.float32,
    out_dim: int | None = None,
    axes: tuple[str, str, str] = ('embed', 'mlp', 'embed'),
    use_bias: bool = False,
    init: Initializer | None = None,
    param_dtype=jnp.float32,
    names: tuple[str, str | None, str] = UP_GATE_DOWN,
  ):
    if kind not in ('swiglu', 'gelu'):
      raise ValueError(f"mlp kind {kind!r}; choose 'swiglu' or 'gelu'.")
    if kind == 'swiglu' and names[1] is None:
      raise ValueError(f'a SwiGLU MLP needs a gate layer name, got {names}.')
    self.kind, self.names = kind, names
    dense = lambda i, o, ia, oa: Dense(
      (i,), (o,), (ia,), (oa,), rngs=rngs, use_bias=use_bias, init=init,
      dtype=dtype, param_dtype=param_dtype,
    )  # fmt: skip
    d_in, d_hidden, d_out = axes
    out_dim = out_dim or dim
    # Built in the order up, gate, down: the order the rngs are consumed.
    setattr(self, names[0], dense(dim, hidden, d_in, d_hidden))
    if kind == 'swiglu':
      setattr(self, names[1], dense(dim, hidden, d_in, d_hidden))
    setattr(self, names[2], dense(hidden, out_dim, d_hidden, d_out))

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    up, gate, down = self.names
    h_BxLxF = getattr(self, up)(x_BxLxD)
    if self.kind == 'swiglu':
      h_BxLxF = jax.nn.silu(getattr(self, gate)(x_BxLxD)) * h_BxLxF
    else:
      h_BxLxF = jax.nn.gelu(h_BxLxF)
    return getattr(self, down)(h_BxLxF)


class Block(nnx.Module):
  """Pre-norm residual block: x + mixer(norm1(x)), then x + mlp(norm2(x)).

  The one block of the transformer, the hybrid backbone and the sequence
  classifier; subclasses only choose the mixer and the MLP. With
  `cond_dim > 0` (adaLN time conditioning) a zero-initialised projection of
  c_BxC gives a shift, scale and gate per branch,
  x + (1 + gate) * f(norm(x) * (1 + scale) + shift), so a fresh block
  ignores c. Submodules are built, and draw their keys, in the order norm1,
  mixer, norm2, mlp, modulation; a mixer built by the caller before the
  block (`make_mixer=lambda _: mixer`) draws its keys first.

  Attributes:
    mixer_name: attribute holding the mixer ('mixer', or 'attn' in the
      transformer); it is the mixer's parameter path.
    mixer_dtype: if set, the mixer runs in this dtype (SSM mixers keep their
      complex state in float32) and its output is cast back.
  """

  def __init__(
    self,
    dim: int,
    make_mixer: Callable[[nnx.Rngs], nnx.Module],
    make_mlp: Callable[[nnx.Rngs], nnx.Module],
    *,
    rngs: nnx.Rngs,
    cond_dim: int = 0,
    mixer_name: str = 'mixer',
    mixer_dtype=None,
  ):
    self.mixer_name, self.mixer_dtype = mixer_name, mixer_dtype
    self.norm1 = RMSNorm(dim, rngs=rngs)
    setattr(self, mixer_name, make_mixer(rngs))
    self.norm2 = RMSNorm(dim, rngs=rngs)
    self.mlp = make_mlp(rngs)
    self.modulation = (
      Dense(
        (cond_dim,),
        (6, dim),
        ('cond',),
        ('modulation', 'embed'),
        rngs=rngs,
        init=nnx.initializers.zeros,
      )
      if cond_dim
      else None
    )

  def _mix(self, h_BxLxD: jax.Array, mask_BxL: jax.Array | None, **kw):
    mixer = getattr(self, self.mixer_name)
    call = lambda u: (
      mixer(u, **kw) if mask_BxL is None else mixer(u, mask_BxL, **kw)
    )
    if self.mixer_dtype is None:
      return call(h_BxLxD)
    return call(h_BxLxD.astype(self.mixer_dtype)).astype(h_BxLxD.dtype)

  def __call__(
    self,
    x_BxLxD: jax.Array,
    c_BxC: jax.Array | None = None,
    mask_BxL: jax.Array | None = None,
    **mixer_kwargs,
  ) -> jax.Array:
    """Block output; c_BxC is needed iff the block is time-conditioned.

    mask_BxL (if given) is passed on to the mixer, as mixer(h, mask_BxL),
    and so are mixer_kwargs (e.g. an SSM mixer's token_ids).
    """
    mix = lambda h: (self._mix(h, mask_BxL, **mixer_kwargs), None)
    return self.residual(x_BxLxD, c_BxC, mix)[0]

  def at(self, x_BxLxD: jax.Array, c_BxC, idx_BxN: jax.Array) -> jax.Array:
    """The block's output at N positions per row, [B, N, D].

    The mixer still reads all L positions; the MLP and the residual stream
    run at the N positions only (the last block, when only some positions'
    logits are needed).
    """
    mix = lambda h: (self._mix_at(h, idx_BxN), None)
    return self.residual(x_BxLxD, c_BxC, mix, idx_BxN)[0]

  def _mix_at(self, h_BxLxD: jax.Array, idx_BxN: jax.Array) -> jax.Array:
    """The mixer's output at N positions (all computed, then taken);
    mixers with a cheaper path (attention: queries at N) override it."""
    return take_positions(self._mix(h_BxLxD, None), idx_BxN)

  def residual(self, x_BxLxD, c_BxC, mix, idx_BxN=None):
    """The residual arithmetic around a mixer: (output, mix's extra).

    x + (1 + gate1) * mix(norm1(x) * (1 + scale1) + shift1), then the same
    with the MLP (no modulation without cond_dim). `mix(h_BxLxD)` returns
    (y, extra); with idx_BxN, y holds only those positions and the residual
    stream continues at them.
    """
    if self.modulation is None:
      mod = (None,) * 6
    elif c_BxC is None:
      raise ValueError('This block is time-conditioned: pass c_BxC.')
    else:
      mod_Bx6x1xD = self.modulation(c_BxC)[:, :, None, :]
      mod_Bx6x1xD = mod_Bx6x1xD.astype(x_BxLxD.dtype)
      mod = [mod_Bx6x1xD[:, i] for i in range(6)]
    shift1, scale1, gate1, shift2, scale2, gate2 = mod
    y, extra = mix(_modulate(self.norm1(x_BxLxD), shift1, scale1))
    if idx_BxN is not None:
      x_BxLxD = take_positions(x_BxLxD, idx_BxN)
    x_BxLxD = x_BxLxD + _gated(y, gate1)
    h = _modulate(self.norm2(x_BxLxD), shift2, scale2)
    return x_BxLxD + _gated(self.mlp(h), gate2), extra


def _modulate(h, shift, scale):
  return h if scale is None else h * (1 + scale) + shift


def _gated(y, gate):
  return y if gate is None else (1 + gate) * y


def take_positions(x_BxLxD: jax.Array, idx_BxN: jax.Array) -> jax.Array:
  """x at N positions per row: [B, N, D] (indices clipped to [0, L))."""
  return jnp.take_along_axis(x_BxLxD, idx_BxN[..., None], axis=1, mode='clip')


def sinusoidal_embedding(t_B: jax.Array, dim: int, max_period=10_000.0):
  """Sinusoidal features of a scalar time per example: [B, dim]."""
  half = dim // 2
  freqs = jnp.exp(-jnp.log(max_period) * jnp.arange(half) / half)
  args_BxH = t_B[:, None].astype(jnp.float32) * 1000.0 * freqs[None]
  return jnp.concatenate([jnp.cos(args_BxH), jnp.sin(args_BxH)], axis=-1)


def remat_call(call):
  """call(module, *arrays), recomputed in the backward pass.

  A pure function of the module's state under jax.checkpoint rather than
  nnx.remat: models are often merged outside the transform that calls
  them (a jax.lax.map over evaluation draws, a sampler's loop), where
  nnx.remat refuses to touch the outer trace's parameters.
  """

  def wrapped(module, *args):
    graphdef, state = nnx.split(module)

    def pure(state, *args):
      return call(nnx.merge(graphdef, state), *args)

    return jax.checkpoint(pure)(state, *args)

  return wrapped
