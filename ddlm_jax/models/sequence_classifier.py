"""Sequence classifier for the state-tracking benchmarks (last-token readout).

tokens_BxL -> embedding -> num_layers x SSMBlock(mixer) -> final RMSNorm ->
the hidden state of the last real token (index ``lengths - 1``) -> linear
head -> logits_BxC. Loss and accuracy are on that token only, as in the
PD-SSM paper; ``logits_all`` and ``prefix_metrics`` give the per-prefix
loss of the group word problems (every position predicts its prefix's
product).

Mixers come from the ``MIXERS`` registry: 'pdssm', 'complex_diag',
'selective_diag', 'lstm' and 'transformer' are built in. HOOK for other
baselines: call ``register_mixer(name, factory)`` with
``factory(config, rngs) -> nnx.Module`` whose ``__call__(x_BxLxD, mask_BxL)``
returns y_BxLxD; ``ClassifierConfig(mixer=name)`` then works unchanged. A
mixer is wrapped in ``ssm.SSMBlock`` (pre-norm residual + MLP) unless it is
registered with ``full_block=True``: then the factory builds the whole block.
Both kinds of block are ``layers.Block`` (pre-norm mixer and MLP residuals).
Extra mixer options travel in ``ClassifierConfig.mixer_kwargs``.

'pdssm_paper' is the PD-SSM block of the authors' released state-tracking
code (facts only; ``ssm.PostNormBlock``): LayerNorm(PD-SSM(x)) with no
residual and no MLP, their parameter scales (``init='authors'``), gate MLPs
of hidden width 2N and h_0 = e_0; ``mixer_kwargs`` override any of these
SSMMixer options. It is a full block.

'transformer' is the suite's own ``transformer.Block`` (RMSNorm, causal
rotary attention, GELU MLP of ``mlp_ratio * D``, no time conditioning) as a
full block; option ``num_heads`` (default 4) in ``mixer_kwargs``. Causal
attention needs no padding mask: the padding of right-padded sequences comes
after the last real token, whose readout therefore never sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ddlm_jax.models import layers, ssm, transformer


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
  """Hyper-parameters of ``SequenceClassifier`` (paper defaults for SSMs).

  Attributes:
    vocab_size: token ids in [0, vocab_size), PAD included.
    num_classes: size of the head.
    mixer: a key of ``MIXERS``.
    d_model: width D.
    state_size: SSM state N (ignored by 'lstm').
    num_dict: PD-SSM dictionary size K.
    num_layers: number of blocks.
    mlp_ratio: block MLP hidden = mlp_ratio * D.
    scan_impl: pallas_kernels impl for the scans.
    bidirectional: use forward + reverse mixers (not causal).
    mixer_kwargs: extra keyword arguments for the mixer factory.
  """

  vocab_size: int
  num_classes: int
  mixer: str = 'pdssm'
  d_model: int = 128
  state_size: int = 128
  num_dict: int = 8
  num_layers: int = 2
  mlp_ratio: float = 2.0
  scan_impl: str = 'auto'
  bidirectional: bool = False
  mixer_kwargs: tuple[tuple[str, object], ...] = ()


MixerFactory = Callable[[ClassifierConfig, nnx.Rngs], nnx.Module]


def _ssm_factory(kind: str) -> MixerFactory:
  def factory(cfg: ClassifierConfig, rngs: nnx.Rngs) -> nnx.Module:
    return ssm.make_mixer(
      kind,
      cfg.d_model,
      state_size=cfg.state_size,
      num_dict=cfg.num_dict,
      bidirectional=cfg.bidirectional,
      scan_impl=cfg.scan_impl,
      rngs=rngs,
      **dict(cfg.mixer_kwargs),
    )

  return factory


PAPER_PDSSM_DEFAULTS = {'init': 'authors', 'initial_state': 'onehot'}


def _pdssm_paper_factory(cfg: ClassifierConfig, rngs: nnx.Rngs) -> nnx.Module:
  """The authors' block: post-norm PD-SSM, no MLP (see module docstring)."""
  if cfg.bidirectional:
    raise ValueError(
      "'pdssm_paper' is the authors' causal block; use mixer='pdssm' for a "
      'bidirectional PD-SSM.'
    )
  kwargs = {
    **PAPER_PDSSM_DEFAULTS,
    'gate_hidden': 2 * cfg.state_size,
    **dict(cfg.mixer_kwargs),
  }
  mixer = ssm.SSMMixer(
    cfg.d_model,
    cfg.state_size,
    mode='pdssm',
    num_dict=cfg.num_dict,
    scan_impl=cfg.scan_impl,
    rngs=rngs,
    **kwargs,
  )
  return ssm.PostNormBlock(cfg.d_model, mixer, rngs=rngs)


def _lstm_factory(cfg: ClassifierConfig, rngs: nnx.Rngs) -> nnx.Module:
  return ssm.make_mixer(
    'lstm',
    cfg.d_model,
    bidirectional=cfg.bidirectional,
    rngs=rngs,
    **dict(cfg.mixer_kwargs),
  )


class TransformerBlockMixer(nnx.Module):
  """``transformer.Block`` (causal, untimed) with the mixer call signature."""

  def __init__(self, cfg: ClassifierConfig, rngs: nnx.Rngs):
    kwargs = dict(cfg.mixer_kwargs)
    num_heads = int(kwargs.pop('num_heads', 4))
    if kwargs:
      raise ValueError(
        f'transformer mixer takes only num_heads in mixer_kwargs, got '
        f'{sorted(kwargs)}.'
      )
    tcfg = transformer.TransformerConfig(
      vocab_size=cfg.vocab_size,
      input_vocab_size=cfg.vocab_size,
      width=cfg.d_model,
      num_heads=num_heads,
      mlp_dim=max(1, int(cfg.mlp_ratio * cfg.d_model)),
      mlp_kind='gelu',
      causal=True,
      time_conditioning=False,
    )
    self.block = transformer.Block(tcfg, rngs=rngs)

  def __call__(
    self, x_BxLxD: jax.Array, mask_BxL: jax.Array | None = None
  ) -> jax.Array:
    del mask_BxL  # Causal: right padding never reaches earlier positions.
    return self.block(x_BxLxD, None)


MIXERS: dict[str, MixerFactory] = {
  'pdssm': _ssm_factory('pdssm'),
  'pdssm_paper': _pdssm_paper_factory,
  'complex_diag': _ssm_factory('complex_diag'),
  'selective_diag': _ssm_factory('selective_diag'),
  'lstm': _lstm_factory,
  'transformer': TransformerBlockMixer,
}
# Mixers whose factory builds the whole residual block (no SSMBlock wrapper).
FULL_BLOCK_MIXERS: set[str] = {'transformer', 'pdssm_paper'}


def register_mixer(
  name: str,
  factory: MixerFactory,
  *,
  overwrite: bool = False,
  full_block: bool = False,
) -> None:
  """Adds a mixer usable as ClassifierConfig.mixer.

  ``full_block=True``: the factory's module is a whole residual block (norms,
  MLP and residuals included) and is not wrapped in ``ssm.SSMBlock``.
  """
  if name in MIXERS and not overwrite:
    raise ValueError(
      f'mixer {name!r} is already registered; pass overwrite=True.'
    )
  MIXERS[name] = factory
  FULL_BLOCK_MIXERS.discard(name)
  if full_block:
    FULL_BLOCK_MIXERS.add(name)


def _make_block(config: ClassifierConfig, rngs: nnx.Rngs) -> nnx.Module:
  mixer = MIXERS[config.mixer](config, rngs)
  if config.mixer in FULL_BLOCK_MIXERS:
    return mixer
  return ssm.SSMBlock(
    config.d_model, mixer, mlp_ratio=config.mlp_ratio, rngs=rngs
  )


def _per_token_transitions(block: nnx.Module) -> bool:
  """Whether a block computes PD-SSM transitions once per token id.

  Exact for the first block (no position embeddings): see
  ``ssm.SSMMixer.states``'s token_ids. Only PD-SSM blocks whose P_t goes
  through a Sinkhorn (relaxed training, Sinkhorn or matching hardening)
  take them: that is where the per-position cost lies (22x per training
  step on A4). The paper's layer (a column softmax) keeps its per-position
  arithmetic, so its runs stay bit-identical to earlier ones; the rounding
  of the two paths differs, and a chaotic training such as parity's then
  ends elsewhere (one seed at 98.0% per position, 70.9% per token).
  """
  mixer = getattr(block, 'mixer', None)
  return (
    isinstance(block, (ssm.SSMBlock, ssm.PostNormBlock))
    and isinstance(mixer, ssm.SSMMixer)
    and mixer.mode == 'pdssm'
    and mixer.uses_sinkhorn
  )


class SequenceClassifier(nnx.Module):
  """Embedding -> blocks -> norm -> last real token -> linear head."""

  def __init__(self, config: ClassifierConfig, *, rngs: nnx.Rngs):
    if config.mixer not in MIXERS:
      raise ValueError(
        f'unknown mixer {config.mixer!r}; registered: {sorted(MIXERS)}. '
        'Add new ones with register_mixer.'
      )
    if config.num_layers < 1 or config.vocab_size < 2:
      raise ValueError(
        'need num_layers >= 1 and vocab_size >= 2, got '
        f'{config.num_layers}, {config.vocab_size}.'
      )
    self.config = config
    D = config.d_model
    self.embed = nnx.Embed(
      config.vocab_size,
      D,
      embedding_init=nnx.initializers.normal(1.0),
      embedding_metadata=layers.axes_meta('vocab', 'embed'),
      rngs=rngs,
    )
    self.blocks = nnx.List(
      [_make_block(config, rngs) for _ in range(config.num_layers)]
    )
    self.norm = layers.RMSNorm(D, rngs=rngs)
    # The class axis reuses the 'vocab' logical name (output vocabulary).
    self.head = layers.lecun_dense(
      D, config.num_classes, ('embed', 'vocab'), rngs=rngs
    )

  def features(self, tokens_BxL: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Normalised hidden states h_BxLxD (padding masked as identity)."""
    L = tokens_BxL.shape[1]
    mask_BxL = jnp.arange(L)[None, :] < lengths_B[:, None]
    x = self.embed(tokens_BxL)
    for i, block in enumerate(self.blocks):
      if i == 0 and _per_token_transitions(block):
        # The first block's input is a function of the token alone.
        x = block(x, mask_BxL, (tokens_BxL, self.config.vocab_size))
      else:
        x = block(x, mask_BxL)
    return self.norm(x)

  def logits_all(
    self, tokens_BxL: jax.Array, lengths_B: jax.Array
  ) -> jax.Array:
    """Logits_BxLxC at every position (per-prefix labels; causal mixers).

    Position t sees tokens[:t + 1] only, so its logits predict the label of
    that prefix; padding positions are garbage and must be masked.
    """
    return self.head(self.features(tokens_BxL, lengths_B))

  def __call__(self, tokens_BxL: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Logits_BxC read at the last real token of each sequence."""
    if tokens_BxL.ndim != 2 or lengths_B.shape != tokens_BxL.shape[:1]:
      raise ValueError(
        'expected tokens_BxL [B, L] and lengths_B [B], got '
        f'{tokens_BxL.shape} and {lengths_B.shape}.'
      )
    h = self.features(tokens_BxL, lengths_B)
    last = jnp.clip(lengths_B - 1, 0, tokens_BxL.shape[1] - 1)
    h_BxD = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
    return self.head(h_BxD)


def classification_metrics(
  logits_BxC: jax.Array, labels_B: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy and accuracy of last-token predictions."""
  loss = optax.softmax_cross_entropy_with_integer_labels(
    logits_BxC, labels_B
  ).mean()
  acc = (jnp.argmax(logits_BxC, -1) == labels_B).mean()
  return loss, acc


def prefix_metrics(
  logits_BxLxC: jax.Array,
  prefix_labels_BxL: jax.Array,
  lengths_B: jax.Array,
  labels_B: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(per-prefix loss, last-token accuracy, per-prefix accuracy).

  Every real position t predicts the label of the prefix x_1..x_t; the loss
  and the prefix accuracy are means over real positions (padding, at and
  after ``lengths``, does not count). The last-token accuracy reads the
  same logits at ``lengths - 1``, as ``SequenceClassifier.__call__`` does,
  so it compares with the last-token loss's accuracy.
  """
  L = logits_BxLxC.shape[1]
  w_BxL = (jnp.arange(L)[None, :] < lengths_B[:, None]).astype(jnp.float32)
  total = jnp.maximum(w_BxL.sum(), 1.0)
  nll_BxL = optax.softmax_cross_entropy_with_integer_labels(
    logits_BxLxC, prefix_labels_BxL
  )
  loss = (nll_BxL * w_BxL).sum() / total
  pred_BxL = jnp.argmax(logits_BxLxC, -1)
  prefix_acc = ((pred_BxL == prefix_labels_BxL) * w_BxL).sum() / total
  last_B = jnp.clip(lengths_B - 1, 0, L - 1)
  pred_B = jnp.take_along_axis(pred_BxL, last_B[:, None], axis=1)[:, 0]
  return loss, (pred_B == labels_B).mean(), prefix_acc
