"""Checkpoints: train state, data-iterator state and a manifest of both.

Wraps orbax's CheckpointManager. Saves are asynchronous; `wait` and `close`
surface any error a background save hit. Restores go into a target that
carries the current shardings, so a run resumes on whatever mesh it is
launched with. The directory is local or any `etils.epath` URI (gs://):
orbax writes both, and this module reads listings through ddlm_jax.paths.

Nothing that might be good data is ever deleted. Each save records a manifest
(path -> shape, dtype) and a cheap fingerprint (sum, sum of squares) of every
leaf of the state, so a restore can decide from files, not from exceptions:

* parameter shapes differ from the config: IncompatibleCheckpointError,
  nothing touched;
* parameters match but another part of the state changed structure (EMA
  switched on or off, a different optimizer chain): the parts that match are
  restored, the rest is initialised, and every change is logged and kept in
  `Checkpointer.last_restore_changes`;
* the checkpoint cannot be read, or its values are not finite or do not match
  their fingerprints: it is moved aside to `<step>.corrupt` (then
  `.corrupt.1`, ...; never overwritten) and the previous one is used. Only
  a writer (the holder of the workdir's lock) moves anything: a reader
  (`read_only=True`: --mode=eval|sample, load_run) skips an unreadable
  checkpoint and leaves every file where it is.

When checkpoints exist but none can be restored, training refuses to start
from step 0 (`AllCheckpointsCorruptError`, see training.fit) unless a
fresh start is asked for.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from ddlm_jax import paths
from ddlm_jax.errors import (  # noqa: F401  (re-exported)
  CheckpointSaveError,
  NoCheckpointError,
)
from ddlm_jax.training.faults import AllCheckpointsCorruptError, os_error_reason

log = logging.getLogger(__name__)

# Fields of the state whose values must be finite to be saved or restored.
_FINITE_FIELDS = ('params', 'opt_state', 'ema_params')
# Relative tolerance of the fingerprint check: a restore onto another mesh
# sums in another order, a flipped byte changes a sum by far more.
_FINGERPRINT_RTOL = 1e-4
_FORMAT = 2  # meta['format']; 1 (absent) = only a params shape manifest.


class IncompatibleCheckpointError(ValueError):
  """The checkpoint's shapes do not match the model built from the config."""


def has_checkpoint(directory: str) -> bool:
  """Whether `directory` holds a finished-looking checkpoint (<step>/).

  Read from the listing alone, so a reader can refuse an empty workdir
  before it builds (or writes) anything.
  """
  try:
    names = paths.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return False
  return any(
    n.isdigit() and paths.isdir(paths.join(directory, n)) for n in names
  )


def no_checkpoint(workdir: str) -> NoCheckpointError:
  """The one 'No checkpoint in ...' error of the suite (eval, sample,
  load_run, warm start)."""
  return NoCheckpointError(
    f'No checkpoint in {workdir}/checkpoints; train first (--mode=train).'
  )


class NonFiniteStateError(FloatingPointError):
  """The state to save holds NaN/Inf; saving it would poison the resume."""


class _UnreadableError(Exception):
  """A checkpoint whose files cannot be read back as they were written."""


def shape_manifest(tree) -> dict[str, list[int]]:
  """{'path/to/leaf': shape} for every array leaf of a pytree (format 1)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {
    jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in flat
  }


def _key_name(key) -> str:
  # The names orbax gives the same tree on disk, so that its metadata of
  # old checkpoints and our manifests share keys.
  if isinstance(key, jax.tree_util.SequenceKey):
    return str(key.idx)
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return str(key.key)
  return str(key)


def _path(prefix, keys) -> str:
  return '/'.join([*prefix, *(_key_name(k) for k in keys)])


def _flat(tree, prefix=()) -> dict[str, Any]:
  """{'a/0/b': leaf} for every leaf of a pytree."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {_path(prefix, p): leaf for p, leaf in flat}


def _is_key(dtype) -> bool:
  return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _spec(leaf) -> list:
  """[shape, dtype] as stored on disk (typed PRNG keys as their key data)."""
  dtype = getattr(leaf, 'dtype', None)
  if dtype is None:
    dtype = np.result_type(leaf)
  shape = tuple(np.shape(leaf))
  if _is_key(dtype):
    data = jax.eval_shape(
      jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype)
    )
    shape, dtype = data.shape, data.dtype
  return [list(shape), str(np.dtype(dtype))]


def manifest(tree) -> dict[str, list]:
  """{'path': [shape, dtype]} for every leaf of a pytree."""
  return {k: _spec(v) for k, v in _flat(tree).items()}


def _leaf_stats(x):
  if _is_key(x.dtype):
    x = jax.random.key_data(x)
  finite = (
    jnp.all(jnp.isfinite(x))
    if jnp.issubdtype(x.dtype, jnp.inexact)
    else jnp.array(True)
  )
  x = x.astype(jnp.float32)
  return jnp.stack([jnp.sum(x), jnp.sum(x * x), finite.astype(jnp.float32)])


# One dispatch per set of devices (a jit cannot mix them); the reductions
# run where the (possibly sharded) leaves live and three floats per leaf
# come back.
_tree_stats = jax.jit(lambda tree: jax.tree.map(_leaf_stats, tree))


def _devices(x):
  sharding = getattr(x, 'sharding', None)
  if sharding is None:
    return None
  return tuple(sorted(d.id for d in sharding.device_set))


def _stats(flat: dict[str, Any]) -> dict[str, tuple[float, float, bool]]:
  groups: dict[Any, dict[str, Any]] = {}
  for k, v in flat.items():
    v = v if hasattr(v, 'dtype') else jnp.asarray(v)
    groups.setdefault(_devices(v), {})[k] = v
  got = jax.device_get([_tree_stats(g) for g in groups.values()])
  return {
    k: (float(v[0]), float(v[1]), bool(v[2] > 0.5))
    for g in got
    for k, v in g.items()
  }


def _field(path: str) -> str:
  return path.split('/', 1)[0]


def _fingerprint_ok(saved, got, size: int) -> bool:
  def close(a, b, scale):
    if a == b or (math.isnan(a) and math.isnan(b)):
      return True
    return abs(a - b) <= _FINGERPRINT_RTOL * scale + 1e-30

  (s0, q0), (s1, q1) = saved, got
  # |sum| <= sqrt(n * sumsq): the scale a rounding difference of the sum
  # is relative to, even when the sum itself cancels to ~0.
  return close(q0, q1, abs(q0)) and close(s0, s1, math.sqrt(size * abs(q0)))


def _diff(saved: dict, current: dict, limit: int = 8) -> list[str]:
  lines = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key), current.get(key)
    if a != b:
      a = 'absent' if a is None else tuple(a)
      b = 'absent' if b is None else tuple(b)
      lines.append(f'  {key}: checkpoint {a} vs config {b}')
  if len(lines) > limit:
    lines = lines[:limit] + [f'  ... and {len(lines) - limit} more']
  return lines


def _shapes_only(m: dict) -> dict:
  return {k: v[0] for k, v in m.items()}


def _metadata_flat(node, prefix=()) -> dict[str, Any]:
  """{'a/0/b': leaf metadata} of orbax's on-disk tree, empty nodes skipped."""
  if isinstance(node, Mapping):
    out = {}
    for k, v in node.items():
      out.update(_metadata_flat(v, (*prefix, str(k))))
    return out
  if isinstance(node, (list, tuple)):
    out = {}
    for i, v in enumerate(node):
      out.update(_metadata_flat(v, (*prefix, str(i))))
    return out
  if node is None:
    return {}
  return {'/'.join(prefix): node}


def _metadata_spec(meta) -> list:
  shape = getattr(meta, 'shape', None)
  dtype = getattr(meta, 'dtype', None)
  return [
    list(shape) if shape is not None else [],
    str(np.dtype(dtype)) if dtype is not None else 'unknown',
  ]


def _mirror(node, targets: dict[str, Any], prefix=()):
  """Orbax's on-disk tree with the wanted leaves replaced by targets.

  Orbax restores a subset only into a tree whose containers mirror the
  saved ones; the target's own containers may differ harmlessly (an optax
  chain gaining an empty state), so they are rebuilt from the paths.
  """
  if isinstance(node, Mapping):
    out = {}
    for k, v in node.items():
      sub = _mirror(v, targets, (*prefix, str(k)))
      if sub is not _SKIP:
        out[str(k)] = sub
    return out if out or not prefix else _SKIP
  if isinstance(node, (list, tuple)):
    subs = [_mirror(v, targets, (*prefix, str(i))) for i, v in enumerate(node)]
    if all(s is _SKIP or s is None for s in subs):
      return _SKIP
    return [None if s is _SKIP else s for s in subs]
  if node is None:
    return None
  return targets.get('/'.join(prefix), _SKIP)


_SKIP = object()


@dataclasses.dataclass
class _Plan:
  """What a restore takes from a checkpoint, decided from its manifest."""

  step: int
  fields: dict[str, str]  # name -> restore | ema | initial | drop | empty
  targets: dict[str, Any]  # path -> abstract leaf, for fields to restore
  saved: dict[str, list]  # the checkpoint's manifest
  fingerprints: dict[str, list]  # path -> [sum, sumsq]; {} for format 1
  tree: Any  # orbax's on-disk metadata tree
  changes: list[str]


def _use_coordination_barriers():
  """Orbax's multi-process barriers through the coordination service.

  By default orbax synchronises processes with a collective
  (`sync_global_devices`). On CPU that is a gloo collective, whose peers
  give up after 30 s, so processes that reach a checkpoint more than 30 s
  apart (one compiled or loaded data more slowly) crash; the coordination
  service's barrier waits orbax's own timeout (5 minutes) instead. orbax
  reads the choice from an absl flag, which can be set only once absl has
  parsed the command line (experiments.run); elsewhere the default stays.
  """
  if jax.process_count() == 1 or jax.default_backend() != 'cpu':
    return
  from absl import flags

  name = 'experimental_orbax_use_distributed_barrier'
  if name in flags.FLAGS and flags.FLAGS.is_parsed():
    flags.FLAGS[name].value = True


class Checkpointer:
  """Save/restore of (train state, iterator state) under workdir/checkpoints."""

  def __init__(
    self,
    directory: str,
    *,
    max_to_keep: int = 3,
    async_=True,
    read_only: bool = False,
  ):
    if (
      isinstance(max_to_keep, bool)
      or not isinstance(max_to_keep, int)
      or max_to_keep < 1
    ):
      raise ValueError(
        f'train.max_checkpoints must be an integer >= 1 (got {max_to_keep!r})'
        '; the newest checkpoint is always kept.'
      )
    self.directory = paths.absolute(directory)  # Local, or a URI.
    self.read_only = read_only
    self._async = async_
    self._max_to_keep = max_to_keep
    self._pending: int | None = None  # Step of a save not yet confirmed.
    # What the last restore_latest changed relative to the checkpoint.
    self.last_restore_changes: list[str] = []
    # (step, why) of checkpoints the last restore_latest could not read.
    self.unreadable: list[tuple[int, str]] = []
    self._open()

  def _open(self):
    self.manager = None
    if self.read_only and not paths.isdir(self.directory):
      return  # A reader creates nothing: no directory, no checkpoints.
    _use_coordination_barriers()
    if self.read_only:
      options = ocp.CheckpointManagerOptions(
        read_only=True,
        create=False,
        save_interval_steps=0,
        max_to_keep=None,
        cleanup_tmp_directories=False,
      )
    else:
      options = ocp.CheckpointManagerOptions(
        max_to_keep=self._max_to_keep,
        enable_async_checkpointing=self._async,
        # Made in the foreground, so an unwritable directory fails the save
        # at once instead of leaving writer threads waiting for it.
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        create=True,
      )
    absl_log = logging.getLogger('absl')
    level = absl_log.level
    if self.read_only:  # orbax warns that a reader's directory is read-only.
      absl_log.setLevel(logging.ERROR)
    try:
      self.manager = ocp.CheckpointManager(
        self.directory,
        options=options,
        item_handlers={
          'state': ocp.PyTreeCheckpointHandler(),
          'data': ocp.JsonCheckpointHandler(),
          'meta': ocp.JsonCheckpointHandler(),
        },
      )
    finally:
      absl_log.setLevel(level)

  def all_steps(self) -> list[int]:
    return [] if self.manager is None else sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return None if self.manager is None else self.manager.latest_step()

  def set_aside(self) -> list[str]:
    """Paths of checkpoints moved aside as unreadable (<step>.corrupt*)."""
    if not paths.isdir(self.directory):
      return []
    return sorted(
      paths.join(self.directory, name)
      for name in paths.listdir(self.directory)
      if '.corrupt' in name and name.split('.', 1)[0].isdigit()
    )

  def all_corrupt_error(self) -> AllCheckpointsCorruptError:
    """The refusal of a run whose checkpoints are all unreadable."""
    paths = self.set_aside() or [
      f'{self.directory}/{step}' for step, _ in self.unreadable
    ]
    shown = ', '.join(paths[:4]) + (
      f' and {len(paths) - 4} more' if len(paths) > 4 else ''
    )
    return AllCheckpointsCorruptError(
      f'Every checkpoint in {self.directory} is unreadable ({shown}); they '
      'are kept, nothing was trained. Restore a good copy into '
      f'{self.directory}, or pass --allow_fresh_start to train from step 0.'
    )

  # --- saving ---------------------------------------------------------------

  def _save_error(self, err: Exception, step: int | None, when: str):
    try:
      previous = [s for s in self.all_steps() if s != step]
    except Exception:  # noqa: BLE001 - the directory may be unreadable too.
      previous = []
    kept = f'step {previous[-1]}' if previous else 'none'
    first = str(err).splitlines()[0][:300] if str(err) else ''
    reason = os_error_reason(err)
    what = f'{type(err).__name__}: {first[:160]}'
    if reason:
      what = f'{reason[0].upper() + reason[1:]} ({what})'
    return CheckpointSaveError(
      f'Saving checkpoint step {step} to {self.directory} failed ({when}): '
      f'{what}. Earlier checkpoints are untouched (newest kept: {kept}). '
      'Free space or make the directory writable, then run again to resume.'
    )

  def _settle(self, when: str):
    """Waits for the pending background save; raises what it hit."""
    step, self._pending = self._pending, None
    try:
      self.manager.wait_until_finished()
      self.manager.check_for_errors()
    except Exception as err:  # noqa: BLE001 - any write failure.
      raise self._save_error(err, step, when) from err

  def save(self, step: int, state, data_state, *, force: bool = False):
    """Starts saving `state` at `step`; returns whether a save started.

    Raises NonFiniteStateError (nothing saved) if parameters or optimizer
    state hold NaN/Inf, and CheckpointSaveError if this or the previous
    (background) save failed.
    """
    step = int(step)
    if self.read_only:
      raise ValueError(
        f'this Checkpointer of {self.directory} is a reader (read_only=True) '
        'and writes nothing; save through a Checkpointer(read_only=False), '
        "which the run holding the workdir's lock owns."
      )
    self._settle('while finishing the previous save')
    flat = _flat(state)
    stats = _stats(flat)
    bad = [
      k
      for k, (_, _, ok) in stats.items()
      if _field(k) in _FINITE_FIELDS and not ok
    ]
    if bad:
      shown = ', '.join(bad[:8]) + (
        f' and {len(bad) - 8} more' if len(bad) > 8 else ''
      )
      raise NonFiniteStateError(
        f'Refusing to save checkpoint step {step}: non-finite values in '
        f'{shown}. Nothing was written; the previous checkpoints are kept.'
      )
    meta = {
      'format': _FORMAT,
      'step': step,
      'shapes': shape_manifest(state.params),
      'manifest': {k: _spec(v) for k, v in flat.items()},
      'fingerprints': {
        k: [s, q] if math.isfinite(s) and math.isfinite(q) else None
        for k, (s, q, _) in stats.items()
      },
    }
    try:
      started = self.manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.PyTreeSave(state),
          data=ocp.args.JsonSave(data_state if data_state is not None else {}),
          meta=ocp.args.JsonSave(meta),
        ),
        force=force and step not in self.manager.all_steps(),
      )
    except Exception as err:  # noqa: BLE001 - any write failure.
      raise self._save_error(err, step, 'while writing') from err
    if started:
      self._pending = step
    return started

  def wait(self):
    """Blocks until the background save is done; raises CheckpointSaveError."""
    self._settle('in the background')

  def close(self):
    if self.manager is None:
      return
    try:
      self._settle('in the background')
    finally:
      self.manager.close()

  # --- restoring ------------------------------------------------------------

  def restore_latest(self, abstract_state, initial_state=None):
    """Newest restorable (state, data_state, step), or None if none exist.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct with shardings.
    `initial_state`, the freshly initialised concrete state, supplies the
    parts of the state whose structure changed since the checkpoint (say
    the optimizer chain); without it such a change raises
    IncompatibleCheckpointError. What changed is logged and kept in
    `self.last_restore_changes`.
    """
    self.last_restore_changes = []
    self.unreadable = []
    for step in reversed(self.all_steps()):
      try:
        plan = self._plan(step, abstract_state, initial_state)
        restored, data = self._read(plan)
        self._verify(plan, restored)
      except _UnreadableError as err:
        self.unreadable.append((step, str(err).splitlines()[0][:300]))
        if self.read_only:
          log.warning(
            'Checkpoint step %d in %s is unreadable (%s); trying the '
            'previous one. Nothing is moved: this process does not hold '
            'the workdir (only a training run on it sets checkpoints aside).',
            step,
            self.directory,
            self.unreadable[-1][1],
          )
        else:
          self._quarantine(step, err)
        continue
      state = self._assemble(plan, restored, abstract_state, initial_state)
      for change in plan.changes:
        log.warning('Restoring checkpoint step %d: %s', step, change)
      self.last_restore_changes = plan.changes
      return state, data, step
    return None

  def _guarded(self, what: str, fn):
    try:
      return fn()
    except Exception as err:  # noqa: BLE001 - a read failure = unreadable.
      if 'RESOURCE_EXHAUSTED' in str(err):  # Out of memory: not the files.
        raise
      raise _UnreadableError(f'{what}: {type(err).__name__}: {err}') from err

  def _plan(self, step: int, abstract_state, initial_state) -> _Plan:
    meta = self._guarded(
      'reading meta',
      lambda: self.manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
      )['meta'],
    )
    tree = self._guarded(
      'reading metadata', lambda: self.manager.item_metadata(step)['state']
    )
    tree = getattr(tree, 'tree', tree)
    if not isinstance(meta, Mapping) or not isinstance(tree, Mapping):
      raise _UnreadableError(
        f'malformed meta/metadata: {type(meta)}, {type(tree)}'
      )
    where = f'{self.directory}/{step}'
    if 'manifest' in meta:
      saved = {k: [list(v[0]), v[1]] for k, v in meta['manifest'].items()}
      fingerprints = dict(meta.get('fingerprints', {}))
      params_diff = _diff(
        _shapes_only(_subset(saved, 'params')),
        _shapes_only(_subset(manifest(abstract_state), 'params')),
      )
    else:  # Format 1: only the params' shapes were recorded.
      saved = {k: _metadata_spec(v) for k, v in _metadata_flat(tree).items()}
      fingerprints = {}
      params_diff = _diff(
        meta.get('shapes', {}), shape_manifest(abstract_state.params)
      )
    if params_diff:
      raise IncompatibleCheckpointError(
        f'The checkpoint at {where} does not fit the model built from this '
        'config (parameter shapes differ):\n'
        + '\n'.join(params_diff)
        + '\nUse the config the run was started with, or a new --workdir. '
        'The checkpoint was not modified.'
      )
    current = manifest(abstract_state)
    abstract_flat = _flat(abstract_state)
    fields, targets, changes = {}, {}, []
    for name in _field_names(abstract_state):
      mine, theirs = _subset(current, name), _subset(saved, name)
      if not mine:
        fields[name] = 'drop' if theirs else 'empty'
        if theirs:
          changes.append(
            f'{name}: in the checkpoint but not in this config; dropped.'
          )
        continue
      if _shapes_only(mine) == _shapes_only(theirs):
        fields[name] = 'restore'
        targets.update({k: abstract_flat[k] for k in mine})
        cast = sorted(k for k in mine if mine[k][1] != theirs[k][1])
        if cast:
          changes.append(
            f'{name}: dtype changed, cast on restore: '
            + ', '.join(f'{k} {theirs[k][1]}->{mine[k][1]}' for k in cast[:4])
            + (f' and {len(cast) - 4} more' if len(cast) > 4 else '')
          )
        continue
      diff = _diff(_shapes_only(theirs), _shapes_only(mine), limit=3)
      why = (
        'not in the checkpoint'
        if not theirs
        else 'structure changed:\n' + '\n'.join(diff)
      )
      if name == 'ema_params' and _same_structure(
        abstract_state, 'ema_params', 'params'
      ):
        fields[name] = 'ema'
        changes.append(
          f'ema_params: {why}\n  -> initialised from the restored params.'
        )
      elif initial_state is not None:
        fields[name] = 'initial'
        changes.append(f'{name}: {why}\n  -> freshly initialised.')
      else:
        raise IncompatibleCheckpointError(
          f'The checkpoint at {where} has a different {name} than this '
          f'config builds (a hyperparameter change?): {why}\nPass '
          'initial_state to restore_latest to restore the rest and '
          f're-initialise {name}, or use the original config. The checkpoint '
          'was not modified.'
        )
    fields.setdefault('params', 'restore')
    return _Plan(step, fields, targets, saved, fingerprints, tree, changes)

  def _read(self, plan: _Plan):
    item = _mirror(plan.tree, plan.targets)
    item = {} if item is _SKIP else item
    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    restored = self._guarded(
      'reading state',
      lambda: self.manager.restore(
        plan.step,
        args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, partial_restore=True
          ),
          data=ocp.args.JsonRestore(),
        ),
      ),
    )
    flat = _metadata_flat(restored['state'])
    missing = sorted(set(plan.targets) - set(flat))
    if missing:
      raise _UnreadableError(f'leaves not restored: {", ".join(missing[:4])}')
    return {k: flat[k] for k in plan.targets}, restored['data']

  def _verify(self, plan: _Plan, restored: dict[str, Any]):
    """Raises _UnreadableError unless finite and matching fingerprints."""
    stats = _stats(restored)  # An error here is ours, not the files'.
    bad = []
    for k, (s, q, finite) in stats.items():
      if _field(k) in _FINITE_FIELDS and not finite:
        bad.append(f'{k} not finite')
        continue
      saved = plan.fingerprints.get(k)
      same_dtype = plan.saved.get(k, [None, None])[1] == _spec(restored[k])[1]
      if saved is None or not same_dtype:
        continue
      size = int(np.prod(np.shape(restored[k])))
      if not _fingerprint_ok(tuple(saved), (s, q), max(size, 1)):
        bad.append(f'{k} fingerprint {saved} != {[s, q]}')
    if bad:
      raise _UnreadableError(
        'values differ from what was saved: ' + '; '.join(bad[:4])
      )

  def _assemble(self, plan: _Plan, restored, abstract_state, initial_state):
    kids, treedef = _fields_of(abstract_state)
    initial = dict(_fields_of(initial_state)[0]) if initial_state else {}
    out = {}
    for name, target in kids:
      how = plan.fields.get(name, 'empty')
      if how == 'restore':
        out[name] = jax.tree_util.tree_map_with_path(
          lambda p, _, n=name: restored[_path((n,), p)], target
        )
      elif how == 'initial':
        out[name] = initial[name]
      elif how != 'ema':  # drop / empty: the target's own (empty) value.
        out[name] = target
    for name, target in kids:
      if plan.fields.get(name) == 'ema':
        # A copy: the train step may donate params and EMA separately.
        out[name] = jax.tree.map(
          lambda x, t: jax.device_put(
            jnp.array(x, dtype=t.dtype, copy=True), t.sharding
          ),
          out['params'],
          target,
        )
    return treedef.unflatten([out[name] for name, _ in kids])

  def _quarantine(self, step: int, err: BaseException):
    src = paths.join(self.directory, str(step))
    dst = src + '.corrupt'
    n = 0
    # Never overwrite an earlier quarantine (a dangling link counts).
    while paths.exists(dst) or os.path.islink(dst):
      n += 1
      dst = f'{src}.corrupt.{n}'
    why = str(err).splitlines()[0][:300] if str(err) else ''
    if not isinstance(err, _UnreadableError):
      why = f'{type(err).__name__}: {why}'
    log.warning(
      'Checkpoint step %d in %s is unreadable (%s); moving it to %s and '
      'trying the previous one.',
      step,
      self.directory,
      why,
      dst,
    )
    self.manager.close()
    if jax.process_index() == 0 and paths.exists(src):
      paths.rename(src, dst)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(f'ddlm_quarantine_{step}')
    self._open()


def _subset(m: dict, field: str) -> dict:
  return {k: v for k, v in m.items() if k == field or k.startswith(field + '/')}


def _fields_of(tree):
  """([(name, child)], treedef) one level down (dataclass fields, keys)."""
  kids, treedef = jax.tree_util.tree_flatten_with_path(
    tree, is_leaf=lambda x: x is not tree
  )
  return [(_path((), p), v) for p, v in kids], treedef


def _field_names(tree) -> list[str]:
  return [name for name, _ in _fields_of(tree)[0]]


def _same_structure(tree, a: str, b: str) -> bool:
  kids = dict(_fields_of(tree)[0])
  return jax.tree.structure(kids.get(a)) == jax.tree.structure(kids.get(b))
