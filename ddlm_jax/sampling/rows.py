"""Rows sampled independently: a batch whose rows equal the rows run alone.

A sampler's draws are shaped by its batch (Gumbel noise [B, L, V], one
key split per step), so row b of a batch of 3 is not what the same prompt
gives in a batch of 1, even with the same key. `sample_rows` runs the
sampler once per row under `jax.vmap`, each row with its own key and at
batch 1: row b's draws depend on its own key and prompt only, so a row
equals that row run alone with that key, whatever else is in the batch.

Prompts of different lengths share one row length; positions past a
row's span hold padding, fixed like prompt tokens and never read as
content: `valid_BxL` marks the keys attention may read, and `masked_apply`
(valid_1xL -> apply) builds the row's network that honours it. A
time-free network then gives a padded row the logits of the unpadded one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def row_keys(seeds: Sequence[int]) -> jax.Array:
  """One key per row: jax.random.key(seed) of each row's seed."""
  return jax.vmap(jax.random.key)(jnp.asarray(list(seeds), jnp.uint32))


def sample_rows(
  sampler,
  apply,
  keys_B: jax.Array,
  process,
  prompt_BxL: jax.Array,
  valid_BxL: jax.Array | None = None,
  masked_apply: Callable | None = None,
):
  """Each row sampled alone at batch 1: (tokens_BxL, nfe per row).

  Args:
    sampler: a registered sampler with one network.
    apply: the network, apply(z_BxL, t_B) -> logits_BxLxV.
    keys_B: one key per row (row_keys).
    prompt_BxL: the generate id at the positions to generate; every other
      position (prompt and padding) is kept.
    valid_BxL: keys attention may read (None: all), with `masked_apply`.
  """
  if sampler.num_models != 1:
    raise ValueError(
      f'sampler {sampler.name!r} needs {sampler.num_models} networks; '
      'prompted rows take one.'
    )
  if valid_BxL is not None and masked_apply is None:
    raise ValueError('valid_BxL needs masked_apply (valid_1xL -> apply).')
  length = prompt_BxL.shape[1]

  def one(key, prompt_L, valid_L):
    net = apply if valid_L is None else masked_apply(valid_L[None])
    tokens_1xL, nfe = sampler(
      net, key, process, batch=1, length=length, prompt_BxL=prompt_L[None]
    )
    return tokens_1xL[0], nfe

  axes = (0, 0, None if valid_BxL is None else 0)
  return jax.vmap(one, in_axes=axes)(
    keys_B, jnp.asarray(prompt_BxL, jnp.int32), valid_BxL
  )


def prompt_batch(
  prompts: Sequence[np.ndarray],
  length: int,
  *,
  generate_id: int,
  pad_id: int,
  max_new_tokens: int | None = None,
):
  """(rows_BxL, valid_BxL, ends_B) for token-id prompts of any lengths.

  Row b is its prompt, then `max_new_tokens` positions holding the
  generate id (default: the rest of the row), then padding (pad_id,
  valid False) up to `length`; ends_B[b] is where its span ends.
  """
  rows = np.full((len(prompts), length), pad_id, np.int32)
  valid = np.zeros((len(prompts), length), bool)
  ends = []
  for b, ids in enumerate(prompts):
    ids = np.asarray(ids, np.int32).reshape(-1)
    new = length - len(ids) if max_new_tokens is None else max_new_tokens
    end = len(ids) + new
    if new < 1 or end > length:
      raise ValueError(
        f'prompt {b} has {len(ids)} tokens; with {new} new tokens it needs '
        f'{end} positions, but rows hold {length} (data.seq_len): shorten '
        'it or ask for fewer max_new_tokens.'
      )
    rows[b, : len(ids)] = ids
    rows[b, len(ids) : end] = generate_id
    valid[b, :end] = True
    ends.append(end)
  return rows, valid, np.asarray(ends)
