"""Checkpoints: train state, data-iterator state and a shape manifest.

Wraps orbax's CheckpointManager. Saves are asynchronous; `close` waits for
them. Restores go into a target that carries the current shardings, so a run
resumes on whatever mesh it is launched with. Two failure modes get clear
handling: a checkpoint whose parameter shapes differ from the current config
(error, nothing touched) and a corrupt newest checkpoint (warning, moved aside
to `<step>.corrupt`, the next newest is used).
"""

from __future__ import annotations

import logging
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class IncompatibleCheckpointError(ValueError):
  """The checkpoint's shapes do not match the model built from the config."""


def shape_manifest(tree) -> dict[str, list[int]]:
  """{'path/to/leaf': shape} for every array leaf of a pytree."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {
    jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in flat
  }


def _diff_manifests(saved: dict, current: dict, limit: int = 8) -> list[str]:
  lines = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key), current.get(key)
    if a != b:
      lines.append(f'  {key}: checkpoint {a} vs config {b}')
  if len(lines) > limit:
    lines = lines[:limit] + [f'  ... and {len(lines) - limit} more']
  return lines


class Checkpointer:
  """Save/restore of (train state, iterator state) under workdir/checkpoints."""

  def __init__(self, directory: str, *, max_to_keep: int = 3, async_=True):
    self.directory = os.path.abspath(directory)
    self._async = async_
    self._max_to_keep = max_to_keep
    self._open()

  def _open(self):
    options = ocp.CheckpointManagerOptions(
      max_to_keep=self._max_to_keep,
      enable_async_checkpointing=self._async,
      create=True,
    )
    self.manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=('state', 'data', 'meta')
    )

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state, *, force: bool = False):
    meta = {'step': int(step), 'shapes': shape_manifest(state.params)}
    self.manager.save(
      int(step),
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state if data_state is not None else {}),
        meta=ocp.args.JsonSave(meta),
      ),
      force=force,
    )

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()

  def _check_compatible(self, step: int, abstract_state):
    meta = self.manager.restore(
      step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
    )['meta']
    current = shape_manifest(abstract_state.params)
    diff = _diff_manifests(meta['shapes'], current)
    if diff:
      raise IncompatibleCheckpointError(
        f'The checkpoint at {self.directory}/{step} does not fit the model '
        'built from this config (parameter shapes differ):\n'
        + '\n'.join(diff)
        + '\nUse the config the run was started with, or a new --workdir. '
        'The checkpoint was not modified.'
      )

  def restore_latest(self, abstract_state):
    """Newest restorable (state, data_state, step), or None if none exist.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct with shardings.
    """
    for step in reversed(self.all_steps()):
      try:
        self._check_compatible(step, abstract_state)
        restored = self.manager.restore(
          step,
          args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
          ),
        )
      except IncompatibleCheckpointError:
        raise
      except Exception as err:  # noqa: BLE001 - any read failure = corrupt.
        self._quarantine(step, err)
        continue
      return restored['state'], restored['data'], step
    return None

  def _quarantine(self, step: int, err: Exception):
    src = os.path.join(self.directory, str(step))
    dst = src + '.corrupt'
    log.warning(
      'Checkpoint step %d in %s is unreadable (%s: %s); moving it to %s and '
      'trying the previous one.',
      step,
      self.directory,
      type(err).__name__,
      str(err).splitlines()[0][:200] if str(err) else '',
      dst,
    )
    self.manager.close()
    if os.path.exists(dst):
      shutil.rmtree(dst)
    if os.path.exists(src):
      os.rename(src, dst)
    self._open()
