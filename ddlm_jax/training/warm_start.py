"""Continued pretraining: start a run from another run's parameters.

`config.train.init_from = DIR` takes the newest parameters of the run in DIR
(the optimizer starts fresh) when the new run has no checkpoint of its own;
afterwards the run resumes from its own checkpoints like any other. The
tokenizer is copied first, so token ids mean the same in both runs. A plain
MDLM checkpoint initialises the `net` of a soft-masked model (whose SM
scalars keep their initial values), and the reverse direction drops them.
"""

from __future__ import annotations

import jax
import numpy as np

from ddlm_jax import paths
from ddlm_jax.data import tokenizers

SOFT_MASK_KEYS = frozenset({'net', 'soft_mask'})


def copy_tokenizer(src_workdir: str, workdir: str) -> None:
  """Copies src/tokenizer into workdir unless workdir already has one."""
  src = paths.join(src_workdir, 'tokenizer')
  dst = paths.join(workdir, 'tokenizer')
  if paths.exists(paths.join(dst, tokenizers.TOKENIZER_FILENAME)):
    return
  if not paths.exists(paths.join(src, tokenizers.TOKENIZER_FILENAME)):
    raise FileNotFoundError(
      f'train.init_from={src_workdir!r} has no tokenizer/: it is not a '
      'finished run directory (train it first, or fix the path).'
    )
  paths.copy_tree(src, dst)  # Either side local or a URI.


def _is_soft_masked(params) -> bool:
  return isinstance(params, dict) and set(params) == SOFT_MASK_KEYS


def graft(source, target):
  """`target` with the parameters of `source` written in, checked leafwise.

  Handles plain -> soft-masked (fills target['net']) and soft-masked ->
  plain (takes source['net']); otherwise the trees must match.
  """
  if _is_soft_masked(target) and not _is_soft_masked(source):
    return {**target, 'net': graft(source, target['net'])}
  if _is_soft_masked(source) and not _is_soft_masked(target):
    return graft(source['net'], target)
  src_flat = dict(jax.tree_util.tree_flatten_with_path(source)[0])
  tgt_flat, treedef = jax.tree_util.tree_flatten_with_path(target)
  tgt_paths = [p for p, _ in tgt_flat]
  missing = [jax.tree_util.keystr(p) for p in tgt_paths if p not in src_flat]
  extra = [jax.tree_util.keystr(p) for p in set(src_flat) - set(tgt_paths)]
  if missing or extra:
    raise ValueError(
      'train.init_from: the source run has a different model: missing '
      f'{missing[:5]}, unexpected {extra[:5]}. Use the same model.* '
      'settings as the source run.'
    )
  leaves = []
  for path, leaf in tgt_flat:
    value = src_flat[path]
    if tuple(np.shape(value)) != tuple(leaf.shape):
      raise ValueError(
        f'train.init_from: {jax.tree_util.keystr(path)} has shape '
        f'{tuple(np.shape(value))} in the source run, {tuple(leaf.shape)} '
        'here. Use the same model.* settings as the source run.'
      )
    leaves.append(value)
  return jax.tree_util.tree_unflatten(treedef, leaves)


def with_params(state, shardings, params):
  """state with `params` grafted in (and EMA), placed in `shardings`."""
  params = graft(params, jax.device_get(state.params))
  params = jax.device_put(params, shardings.params)
  ema = state.ema_params
  if ema is not None:  # A copy: the train step donates both buffers.
    ema = jax.device_put(params, shardings.ema_params, may_alias=False)
  return state.replace(params=params, ema_params=ema)
