"""Random restarts trained side by side: R models on one leading axis.

A task whose outcome depends on the initialisation (a PD-SSM finding a
permutation representation either does or does not) can train R
independent initialisations in one run and let validation pick one. The
parameters of the R replicas are stacked on a leading axis; the loss is
the sum of the replicas' own losses, so each replica's gradient is exactly
the one it would get alone (the optimizer clips and decays each replica
alone, ``OptimizerConfig.replica_axis``). Every replica sees the same
batches and draws its own randomness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def stack_init(init: Callable[[jax.Array], Any], restarts: int):
  """key -> parameters of `restarts` replicas, each from its own key."""
  if restarts == 1:
    return init
  return lambda key: jax.vmap(init)(jax.random.split(key, restarts))


def stack_loss(loss: Callable, restarts: int):
  """(params, key, batch) -> (sum of the replicas' losses, metrics).

  Metrics are means over replicas; 'acc' also gets its best replica
  ('acc_best'), so a log shows whether any replica is getting there.
  """
  if restarts == 1:
    return loss

  def stacked(params, key, batch):
    keys = jax.random.split(key, restarts)
    values_R, aux = jax.vmap(loss, in_axes=(0, 0, None))(params, keys, batch)
    out = {name: v.mean() for name, v in aux.items()}
    if 'acc' in aux:
      out['acc_best'] = aux['acc'].max()
    return values_R.sum(), out

  return stacked


def replica(params, r: int):
  """The parameters of replica r (a plain, unstacked parameter tree)."""
  return jax.tree.map(lambda x: x[r], params)
