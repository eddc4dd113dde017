"""The process contract every family implements, and the family registry.

A *process* is what turns clean tokens into a training loss: the forward
corruption and the bound of a diffusion family, or the exact likelihood of
the autoregressive twin. Samplers, evaluation and the train step type
against the three classes here, never against a family's module, and never
probe a process with `hasattr` (a test scans the library for that):

  Process            what every process has: vocab sizes, `causal`,
                     `family`, `requires_time_conditioning`, `uses_step`,
                     `loss_is_bound`,
                     `output_size`, `generate_id`,
                     `loss(apply, key, x, mask, *, step)`,
                     `evaluation_process`.
  DiffusionProcess   adds the schedule, the mask id (None without one),
                     `corrupt`, `draw`, `bound`, the forward marginal, the
                     prior sample and the denoiser's log-probabilities, and
                     writes the draw -> apply -> bound skeleton of `loss`
                     once.
  BlockProcess       adds the block size, the masked process inside one
                     block, and the two-pass network input of block
                     diffusion.

A *family config* is a frozen dataclass, registered by the `kind` strings
that name it in a run's `config.process` block (levanter's
`register_subclass` pattern): `build(vocab_size)` makes the process,
`check(backbone, seq_len)` refuses a backbone or length the family cannot
use. A new family is its process module plus its config class; nothing
else in the library changes (docs/ARCHITECTURE.md walks through one).
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.schedules import get_schedule

# apply(z_BxL, t_B) -> logits_BxLxV. Time-free networks ignore t_B.
ApplyFn = Callable[[jax.Array, jax.Array], jax.Array]
# (objective_B, nelbo_B, aux): what every loss returns.
LossOut = tuple[jax.Array, jax.Array, dict]


class Process(abc.ABC):
  """What every process has (diffusion families and the AR twin).

  Concrete processes are frozen dataclasses with a `vocab_size` field (or
  property): V data tokens. Class attributes declare the traits consumers
  branch on, so they never probe for attributes.
  """

  # The network must be causal (the AR twin) or bidirectional.
  causal: ClassVar[bool] = False
  # Sampler compatibility: 'masked', 'uniform', 'interpolating', 'block',
  # 'autoregressive' or a new family's own name.
  family: ClassVar[str] = ''
  # The optimal denoiser depends on t, so the network must be told t.
  requires_time_conditioning: ClassVar[bool] = False
  # loss() reads the global training step (Duo's curriculum).
  uses_step: ClassVar[bool] = False
  # loss() is a bound on -log p(x) (or the exact NLL), so evaluation may
  # call its per-token value bits/token and a perplexity bound; False for
  # a network trained on something else (DDPD's planner: a BCE).
  loss_is_bound: ClassVar[bool] = True

  vocab_size: int

  @property
  @abc.abstractmethod
  def input_vocab_size(self) -> int:
    """Embedding rows the network needs (data tokens plus special ids)."""

  @property
  def output_size(self) -> int:
    """Logits per position the network emits (V unless overridden: a
    process that predicts something other than tokens, such as DDPD's
    one noise logit, declares its width here)."""
    return int(self.vocab_size)

  @property
  def generate_id(self) -> int:
    """The id that marks a position to generate (V unless overridden)."""
    return int(self.vocab_size)

  @property
  def evaluation_process(self) -> Process:
    """The process whose nelbo_B is the reported bound (default: self)."""
    return self

  @abc.abstractmethod
  def loss(
    self,
    apply,
    key: jax.Array,
    x_BxL: jax.Array,
    loss_mask_BxL: jax.Array | None = None,
    *,
    step=None,
  ) -> LossOut:
    """One Monte-Carlo sample: (objective_B, nelbo_B, aux).

    `loss_mask_BxL` (1 = real token, 0 = padding) removes padded positions
    from the bound. `step` is the global training step (None outside
    training); only processes with `uses_step` read it.
    """


class DiffusionProcess(Process):
  """A diffusion family: schedule, corruption, bound; one loss skeleton.

  Subclasses supply `draw` (times, their bound weights and z_t), `bound`
  (the objective and NELBO of one prediction at z_t) and `corrupt`; `loss`
  is draw -> network -> bound, written here once.
  """

  schedule: Any  # ddlm_jax.diffusion.schedules.Schedule

  @property
  def mask_id(self) -> int | None:
    """The absorbing mask id, or None for families without a mask."""
    return None

  @property
  def generate_id(self) -> int:
    """The mask id where there is one; else V, which samplers replace by
    prior noise before any network call."""
    return int(self.vocab_size if self.mask_id is None else self.mask_id)

  @abc.abstractmethod
  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t) -> jax.Array:
    """z_t ~ q(z_t | x)."""

  @abc.abstractmethod
  def draw(self, key: jax.Array, x_BxL: jax.Array):
    """(t, weight, z_BxL): diffusion times, their bound weights and z_t."""

  @abc.abstractmethod
  def bound(self, logits_BxLxV, x_BxL, z_BxL, t, weight, loss_mask_BxL):
    """(objective_B, nelbo_B, aux) of one prediction at z_t."""

  def network_logits(self, apply, z_BxL, x_BxL, t) -> jax.Array:
    """The network's logits at z_t (block diffusion also reads x)."""
    del x_BxL
    return apply(z_BxL, t)

  def loss(self, apply, key, x_BxL, loss_mask_BxL=None, *, step=None):
    """One Monte-Carlo sample of the loss: draw, one network call, bound."""
    del step
    t, weight, z_BxL = self.draw(key, x_BxL)
    logits_BxLxV = self.network_logits(apply, z_BxL, x_BxL, t)
    return self.bound(logits_BxLxV, x_BxL, z_BxL, t, weight, loss_mask_BxL)

  def forward_marginal(self, x_probs_BxLxV: jax.Array, alpha) -> jax.Array:
    """q(z | x) at keep-probability alpha for a distribution over x.

    The absorbing form, alpha x + (1 - alpha) e_m over V + 1 ids; families
    with another stationary distribution override it. alpha is a scalar or
    a [B] array.
    """
    alpha = jnp.asarray(alpha, jnp.float32)
    alpha = alpha.reshape(alpha.shape + (1,) * (3 - alpha.ndim))
    mask_BxLx1 = jnp.broadcast_to(1.0 - alpha, x_probs_BxLxV.shape[:-1] + (1,))
    return jnp.concatenate([alpha * x_probs_BxLxV, mask_BxLx1], axis=-1)

  def prior_sample(self, key: jax.Array, shape) -> jax.Array:
    """z_1 as the samplers start it (absorbing: every position masked)."""
    del key
    return jnp.full(shape, self.generate_id, jnp.int32)

  def denoiser_log_probs(self, logits_BxLxV, z_BxL, t_B) -> jax.Array:
    """log p_theta(x^i | z_t) over the V data tokens, float32."""
    del z_BxL, t_B
    return jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)


class BlockProcess(DiffusionProcess):
  """Block diffusion: blocks of `block_size` tokens, denoised left to right.

  The network reads concat(z_t, x) (2L tokens) under the block-diffusion
  mask; samplers decode block by block with a KV cache of clean blocks.
  """

  block_size: int

  @property
  @abc.abstractmethod
  def masked_process(self) -> DiffusionProcess:
    """The masked process inside one block (what block samplers run)."""

  @abc.abstractmethod
  def check_length(self, seq_len: int) -> None:
    """ValueError unless the block size(s) divide seq_len."""


# ------------------------------------------------------ family configs --


@dataclasses.dataclass(frozen=True)
class Backbone:
  """What a family config checks of the network, before anything runs."""

  name: str = 'transformer'  # 'transformer' | 'hybrid' | ...
  time_conditioning: bool = False
  attention_impl: str = 'xla'


_REGISTRY: dict[str, type[ProcessConfig]] = {}


@dataclasses.dataclass(frozen=True)
class ProcessConfig(abc.ABC):
  """A family's typed settings; subclasses register the kinds they serve.

  Fields are the keys of a run's `config.process` block besides `kind`;
  their defaults are the block's defaults. `build(vocab_size)` makes the
  process (its constructor checks the ranges), `check(backbone, seq_len)`
  what the family needs of the network and the length.
  """

  kind: str = ''

  # The family the built process declares (checked before data is read).
  family: ClassVar[str] = ''
  # Whether config.soft_mask.enabled may wrap it (masked families only).
  supports_soft_mask: ClassVar[bool] = False
  # Whether its process needs a time-conditioned network.
  requires_time_conditioning: ClassVar[bool] = False
  # Attention mask kinds the network must express beyond the plain ones
  # (block diffusion: 'block_diffusion'); checked against the backend.
  attention_masks: ClassVar[tuple[str, ...]] = ()

  @classmethod
  def register(cls, *kinds: str):
    """Class decorator: `@ProcessConfig.register('mdlm', 'md4')`."""

    def wrap(config_cls):
      for kind in kinds:
        if kind in _REGISTRY and _REGISTRY[kind] is not config_cls:
          raise ValueError(
            f'process kind {kind!r} is registered already by '
            f'{_REGISTRY[kind].__name__}; choose another kind name.'
          )
        _REGISTRY[kind] = config_cls
      return config_cls

    return wrap

  @abc.abstractmethod
  def build(self, vocab_size: int) -> Process:
    """The process over `vocab_size` data tokens (its constructor checks
    the ranges of every setting)."""

  def check(self, backbone: Backbone, seq_len: int) -> None:
    """ValueError naming the fix if the backbone or length cannot serve."""
    if self.requires_time_conditioning and not backbone.time_conditioning:
      raise ValueError(
        f'process.kind={self.kind!r} needs a time-conditioned network (the '
        'optimal denoiser depends on t); set '
        '--config.model.time_conditioning=True.'
      )

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ScheduledConfig(ProcessConfig):
  """Settings every diffusion family with a noise schedule shares.

  schedule: alpha(t) by name ('loglinear', 'linear', 'cosine', 'poly', ...)
  with schedule_kwargs; t_min: times drawn from [t_min, 1]; antithetic:
  stratified times; loss_type: 'elbo' | 'simple_ce' (both report the
  NELBO).
  """

  schedule: str = 'loglinear'
  schedule_kwargs: dict = dataclasses.field(default_factory=dict)
  t_min: float = 1e-3
  antithetic: bool = True
  loss_type: str = 'elbo'

  def scheduled_kwargs(self, vocab_size: int) -> dict:
    """The process fields these settings give (the schedule built)."""
    return dict(
      schedule=get_schedule(self.schedule, **dict(self.schedule_kwargs)),
      vocab_size=vocab_size,
      t_min=self.t_min,
      antithetic=self.antithetic,
      loss_type=self.loss_type,
    )


def registered_kinds() -> tuple[str, ...]:
  """Every process kind a config may name, sorted."""
  return tuple(sorted(_REGISTRY))


def config_class(kind: str) -> type[ProcessConfig]:
  """The config class registered for `kind`; ValueError naming the kinds."""
  if kind not in _REGISTRY:
    close = difflib.get_close_matches(str(kind), list(_REGISTRY), n=1)
    hint = f' (did you mean {close[0]!r}?)' if close else ''
    raise ValueError(
      f'config.process.kind={kind!r}{hint}; choose one of {registered_kinds()}.'
    )
  return _REGISTRY[kind]


def default_block(kind: str) -> dict:
  """The `config.process` keys and defaults of a kind (kind included)."""
  fields = dataclasses.asdict(config_class(kind)())
  fields['kind'] = kind
  return fields


def switch_block(block: Mapping, kind: str) -> dict:
  """A process block switched to `kind`: that kind's keys, with the values
  of the settings both families have kept from `block`."""
  new = default_block(kind)
  for key, value in dict(block).items():
    if key != 'kind' and key in new:
      new[key] = value
  return new


def _names(cls) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}


def process_config(block: Mapping) -> ProcessConfig:
  """The typed config of a `config.process` block (a plain mapping).

  A key the kind's class does not take is refused naming the closest key
  of that family, before anything runs.
  """
  block = dict(block)
  kind = block.pop('kind', None)
  cls = config_class(kind)
  names = [f.name for f in dataclasses.fields(cls) if f.name != 'kind']
  unknown = sorted(set(block) - set(names))
  if unknown:
    bad = unknown[0]
    close = difflib.get_close_matches(bad, names, n=1)
    hint = f'did you mean process.{close[0]}? ' if close else ''
    owners = [
      k for k, c in sorted(_REGISTRY.items()) if set(block) <= _names(c)
    ]
    if owners and not close:
      hint = (
        f'the block holds the settings of process.kind in {owners}: to '
        'switch families, start from a config of that family or call '
        'experiments.configs.common.set_process; '
      )
    raise ValueError(
      f'config.process.{bad} is not a setting of process.kind={kind!r} '
      f'({cls.__name__}); {hint}it takes {names}.'
    )
  try:
    return cls(kind=kind, **block)
  except TypeError as err:
    raise ValueError(f'config.process (kind={kind!r}): {err}') from None
