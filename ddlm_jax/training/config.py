"""The loop's typed settings, and the range checks every config goes through.

`TrainerConfig` is what `fit` reads; each task kind builds one from its
ConfigDict in one function (`lm_trainer_config`, the state-tracking and
planner builders), so the loop never reads a ConfigDict key itself. Every
field with a range is checked when it is built, before any compute, with
the config key, the value and the allowed range in one line.
"""

from __future__ import annotations

import dataclasses
import math

from ddlm_jax.diffusion.base import default_block, switch_block
from ddlm_jax.errors import ConfigError  # noqa: F401  (re-exported)


def apply_overrides(config, dotted: dict | None, *, create_blocks=False):
  """Sets {'a.b': value, ...} in a ConfigDict in place; returns it.

  The one dotted-override implementation (the configs, the sweeps and
  `run.load_config` use it). A missing block raises KeyError unless
  `create_blocks` (used for keys added after a run was saved).

  `process.kind` is applied first and switches the process block to that
  kind's keys (keeping the settings both families have), so the other
  overrides may set the new family's keys.
  """
  dotted = dict(dotted or {})
  kind = dotted.pop('process.kind', None)
  if kind is not None and 'process' in config:
    switched = switch_block(_as_dict(config['process']), kind)
    config['process'] = type(config)(switched)
    if getattr(config, 'is_locked', False):
      config['process'].lock()
  for key, value in dotted.items():
    *parents, leaf = key.split('.')
    node = config
    for name in parents:
      if name not in node and create_blocks:
        node[name] = type(config)()
      node = node[name]
    node[leaf] = value
  return config


def _as_dict(block) -> dict:
  return block.to_dict() if hasattr(block, 'to_dict') else dict(block)


def check_range(
  key: str,
  value,
  *,
  lo=None,
  hi=None,
  lo_open: bool = False,
  hi_open: bool = False,
  integer: bool = False,
):
  """Returns `value` if it lies in the range, else raises ConfigError."""
  if integer and (isinstance(value, bool) or int(value) != value):
    raise ConfigError(f'{key}={value!r}: must be an integer.')
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ConfigError(f'{key}={value!r}: must be a number.')
  if not math.isfinite(value):
    raise ConfigError(f'{key}={value!r}: must be finite.')
  below = lo is not None and (value <= lo if lo_open else value < lo)
  above = hi is not None and (value >= hi if hi_open else value > hi)
  if below or above:
    left = '(' if lo_open else '['
    right = ')' if hi_open else ']'
    lo_s = '-inf' if lo is None else lo
    hi_s = 'inf' if hi is None else hi
    raise ConfigError(
      f'{key}={value!r}: must be in {left}{lo_s}, {hi_s}{right}; set '
      f'--config.{key} to a value in that range.'
    )
  return int(value) if integer else value


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with warmup and cosine decay (training.optimizer)."""

  learning_rate: float
  warmup_steps: int
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  grad_clip: float = 1.0
  final_lr_fraction: float = 0.1
  # ((top-level parameter key, peak learning rate), ...): own schedules.
  group_learning_rates: tuple[tuple[str, float], ...] = ()
  # Parameters stack independent replicas on a leading axis (restarts
  # trained side by side): clipping and weight decay see each alone.
  replica_axis: bool = False


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """Everything the one loop needs, for any task."""

  num_steps: int
  optimizer: OptimizerConfig
  seed: int = 0
  log_every: int = 50
  eval_every: int = 0  # 0: no periodic evaluation.
  eval_at_end: bool = False  # Also evaluate at the last step.
  checkpoint_every: int = 0  # 0: only at the end (and on preemption).
  max_checkpoints: int = 3
  halt_after_steps: int = 0  # Stop after this many steps this start; 0: off.
  ema_decay: float = 0.0  # 0 disables the parameter EMA.
  eval_uses_ema: bool = False
  grad_accum_steps: int = 1
  mesh_shape: tuple[int, ...] = (1, 1, 1)
  fast_compile: bool = False  # Cheap XLA optimisation (smoke runs).
  # Printed names for the keys of config.train / config.optim in errors.
  prefix: str = 'train'


def optimizer_config(
  *,
  learning_rate: float,
  warmup_steps: int,
  total_steps: int,
  key: str = 'optim',
  lr_key: str | None = None,
  weight_decay: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.999,
  grad_clip: float = 1.0,
  final_lr_fraction: float = 0.1,
  group_learning_rates: tuple[tuple[str, float], ...] = (),
  replica_axis: bool = False,
) -> OptimizerConfig:
  """A checked OptimizerConfig; `key` is the config block for messages."""
  k = lambda name: f'{key}.{name}'
  check_range(lr_key or k('learning_rate'), learning_rate, lo=0, lo_open=True)
  check_range(k('warmup_steps'), warmup_steps, lo=0, integer=True)
  check_range(k('weight_decay'), weight_decay, lo=0)
  check_range(k('b1'), b1, lo=0, hi=1, hi_open=True)
  check_range(k('b2'), b2, lo=0, hi=1, hi_open=True)
  check_range(k('grad_clip'), grad_clip, lo=0)
  check_range(k('final_lr_fraction'), final_lr_fraction, lo=0, hi=1)
  for name, lr in group_learning_rates:
    check_range(f'{name}.learning_rate', lr, lo=0, lo_open=True)
  del total_steps
  return OptimizerConfig(
    learning_rate=float(learning_rate),
    warmup_steps=int(warmup_steps),
    weight_decay=float(weight_decay),
    b1=float(b1),
    b2=float(b2),
    grad_clip=float(grad_clip),
    final_lr_fraction=float(final_lr_fraction),
    group_learning_rates=tuple(group_learning_rates),
    replica_axis=bool(replica_axis),
  )


def warmup_steps(optim, num_steps: int) -> int:
  """The warmup of a config's `optim` block, in steps (one rule for all).

  `optim.warmup_fraction` (of num_steps; state tracking, planner stages)
  where the block has it, else `optim.warmup_steps`.
  """
  if 'warmup_fraction' in optim:
    fraction = check_range(
      'optim.warmup_fraction', optim['warmup_fraction'], lo=0, hi=1
    )
    return int(round(fraction * num_steps))
  return check_range(
    'optim.warmup_steps', optim['warmup_steps'], lo=0, integer=True
  )


def trainer_config(*, prefix: str = 'train', **fields) -> TrainerConfig:
  """A TrainerConfig whose integer fields were range-checked.

  Keys in messages read `{prefix}.{field}` (e.g. train.num_steps), except
  the optimizer's own, which optimizer_config names.
  """
  ints = {
    'num_steps': 1,
    'log_every': 1,
    'eval_every': 0,
    'checkpoint_every': 0,
    'max_checkpoints': 1,
    'halt_after_steps': 0,
    'grad_accum_steps': 1,
  }
  for name, lo in ints.items():
    if name in fields:
      key = 'optim.grad_accum_steps' if name == 'grad_accum_steps' else None
      fields[name] = check_range(
        key or f'{prefix}.{name}', fields[name], lo=lo, integer=True
      )
  if 'ema_decay' in fields:
    check_range(
      'optim.ema_decay', fields['ema_decay'], lo=0, hi=1, hi_open=True
    )
  if 'mesh_shape' in fields:
    shape = tuple(int(s) for s in fields['mesh_shape'])
    if (
      len(shape) != 3
      or sum(s == -1 for s in shape) > 1
      or any(s == 0 or s < -1 for s in shape)
    ):
      raise ConfigError(
        f'mesh.shape={shape}: must be three positive sizes '
        '(data, fsdp, tensor), one of which may be -1.'
      )
    fields['mesh_shape'] = shape
  return TrainerConfig(prefix=prefix, **fields)


# Config keys renamed since runs were saved: old dotted key -> new key, the
# same setting and value. load_config moves an old key of a saved run; a
# config or override that still spells one is refused naming the new key
# (experiments/run.py does the same for --config.OLD=... flags).
RENAMED_KEYS = {
  'data.batch_size': 'train.batch_size',  # The global training batch.
  'planner.steps': 'planner.num_steps',  # Planner/executor stage lengths.
  'executor.steps': 'executor.num_steps',
  'latent.steps': 'latent.num_steps',
}


def renamed_key_message(old: str) -> str:
  """The one-line refusal of a renamed config key."""
  new = RENAMED_KEYS[old]
  return (
    f'config key {old} was renamed {new} (the same setting); use '
    f'--config.{new}=... or set {new} in the config.'
  )


def _block(config, key: str):
  """(block holding a dotted key's leaf or None, leaf name)."""
  *parents, leaf = key.split('.')
  node = config
  for name in parents:
    node = node.get(name) if hasattr(node, 'get') else None
    if node is None:
      return None, leaf
  return (node if hasattr(node, 'get') else None), leaf


def check_renamed_keys(config, overrides: dict | None = None):
  """ConfigError naming the new key if a config or override has an old one."""
  for old in RENAMED_KEYS:
    block, leaf = _block(config, old)
    if old in (overrides or {}) or (block is not None and leaf in block):
      raise ConfigError(renamed_key_message(old))


def migrate_config(saved: dict) -> dict:
  """A saved config (nested dicts) with renamed keys moved to their new names.

  In place; returns it. An old key moves when its new key is absent; a run
  saved with both keeps the new one if they agree and is refused if not
  (which of the two it trained with cannot be told).
  """
  _drop_foreign_process_keys(saved)
  for old, new in RENAMED_KEYS.items():
    block, leaf = _block(saved, old)
    if block is None or leaf not in block:
      continue
    value = block.pop(leaf)
    target, new_leaf = _block(saved, new)
    if target is None:
      apply_overrides(saved, {new: value}, create_blocks=True)
    elif new_leaf not in target:
      target[new_leaf] = value
    elif target[new_leaf] != value:
      raise ConfigError(
        f'the saved config has {old}={value!r} and {new}='
        f'{target[new_leaf]!r}; {old} was renamed {new}: keep one value.'
      )
  return saved


def _drop_foreign_process_keys(saved: dict) -> None:
  """Runs saved with one flat process block (every family's keys) keep
  only the keys of their own kind, which were the only ones read."""
  block = saved.get('process')
  if not isinstance(block, dict) or 'kind' not in block:
    return
  try:
    keep = set(default_block(block['kind']))
  except ValueError:
    return  # An unknown kind is refused, naming the kinds, when built.
  for key in [k for k in block if k not in keep]:
    del block[key]
