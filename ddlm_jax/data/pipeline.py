"""Token streams to fixed-length batches: a checkpointable grain train loader.

Training (``train_iterator``) treats a split as one concatenated token stream
and cuts it into non-overlapping windows of ``seq_len`` tokens. Each epoch

1. draws one offset ``o`` in ``[0, max_offset]`` from ``(seed, epoch)``
   and uses windows ``tokens[o + w*seq_len : o + (w+1)*seq_len]``, so window
   boundaries move from epoch to epoch;
2. shuffles the window indices with a per-epoch seed (grain's
   ``MapDataset.shuffle`` folds the epoch into the seed);
3. keeps the first ``shard_count * batches_per_epoch * batch_size`` shuffled
   windows and gives process ``shard_index`` every ``shard_count``-th of them,
   so processes see disjoint windows and the same number of batches per epoch;
4. batches them (``batch_size`` is the per-process batch; the remainder of an
   epoch is dropped).

The pipeline is a grain ``MapDataset`` (index -> batch, pure function of the
index), so its iterator state is just the next batch index: ``get_state()``
returns ``{'next_index': int}`` (JSON-serialisable) and ``set_state`` resumes
with exactly the batches an uninterrupted iterator would have produced.

Evaluation (``eval_batches``) is deterministic: the non-overlapping windows
``tokens[w*seq_len : (w+1)*seq_len]`` in order, grouped into full batches; the
tail of the split shorter than a window and a final partial batch are dropped
(with the Shakespeare splits at seq_len 256 and batch 32 this is < 0.1% of
the validation tokens).
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np


def _as_tokens(tokens: Any, what: str) -> np.ndarray:
  arr = np.asarray(tokens)
  if arr.ndim != 1:
    raise ValueError(f'{what} tokens must be 1-D, got shape {arr.shape}.')
  if not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f'{what} tokens must be integers, got {arr.dtype}.')
  return arr.astype(np.int32, copy=False)


def _check_positive(**values: int) -> None:
  for name, value in values.items():
    if int(value) != value or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}.')


def _check_fits(num_tokens: int, seq_len: int, split: str) -> None:
  if seq_len > num_tokens:
    raise ValueError(
      f"seq_len {seq_len} exceeds the {split} split's {num_tokens} tokens; "
      f'use a shorter --config.data.seq_len (at most {num_tokens}).'
    )


def window_layout(num_tokens: int, seq_len: int) -> tuple[int, int]:
  """Returns (windows per epoch, largest per-epoch offset) for a train stream.

  When the stream holds at least two windows, one window is given up so that
  the offset can take every value in ``[0, seq_len - 1]``; otherwise the single
  window shifts over whatever slack there is.
  """
  _check_fits(num_tokens, seq_len, 'train')
  num_windows = max(1, (num_tokens - seq_len + 1) // seq_len)
  max_offset = min(seq_len - 1, num_tokens - num_windows * seq_len)
  return num_windows, max_offset


def _epoch_offset(seed: int, epoch: int, max_offset: int) -> int:
  if max_offset == 0:
    return 0
  rng = np.random.default_rng([seed, epoch, 0x0FF5E7])
  return int(rng.integers(0, max_offset + 1))


def _shuffle_seed(seed: int) -> int:
  # Decorrelates runs: grain's per-epoch seed is shuffle_seed + epoch, so raw
  # seeds s and s + 1 would otherwise replay each other's epochs.
  return int(np.random.SeedSequence([seed, 0x5EED]).generate_state(1)[0])


class _GatherWindows:
  """Batch index + window ids -> {'tokens': int32[B, L]} (picklable)."""

  def __init__(
    self,
    tokens: np.ndarray,
    seq_len: int,
    seed: int,
    batches_per_epoch: int,
    max_offset: int,
  ):
    self._tokens = tokens
    self._seq_len = seq_len
    self._seed = seed
    self._batches_per_epoch = batches_per_epoch
    self._max_offset = max_offset

  def __call__(self, index: int, window_ids: np.ndarray) -> dict[str, Any]:
    epoch = index // self._batches_per_epoch
    offset = _epoch_offset(self._seed, epoch, self._max_offset)
    starts_B = offset + np.asarray(window_ids, np.int64) * self._seq_len
    idx_BxL = starts_B[:, None] + np.arange(self._seq_len)[None, :]
    return {'tokens': self._tokens[idx_BxL]}


def train_dataset(
  tokens: Any,
  *,
  seq_len: int,
  batch_size: int,
  seed: int,
  shard_index: int = 0,
  shard_count: int = 1,
  random_offset: bool = True,
) -> grain.MapDataset:
  """The endless grain MapDataset behind ``train_iterator`` (module doc)."""
  tokens = _as_tokens(tokens, 'train')
  _check_positive(
    seq_len=seq_len, batch_size=batch_size, shard_count=shard_count
  )
  if not 0 <= shard_index < shard_count:
    raise ValueError(
      f'shard_index must be in [0, {shard_count}), got {shard_index}.'
    )
  if not 0 <= seed < 2**63:
    raise ValueError(f'seed must be a non-negative integer, got {seed}.')
  num_windows, max_offset = window_layout(tokens.size, seq_len)
  batches_per_epoch = num_windows // (shard_count * batch_size)
  if batches_per_epoch == 0:
    raise ValueError(
      f'The train split ({tokens.size} tokens) makes only {num_windows} '
      f'windows of seq_len {seq_len}, fewer than batch_size {batch_size} x '
      f'{shard_count} process(es); lower the batch size or seq_len.'
    )
  per_shard = batches_per_epoch * batch_size
  ds = grain.MapDataset.range(num_windows).shuffle(seed=_shuffle_seed(seed))
  ds = ds[: per_shard * shard_count][shard_index::shard_count]
  ds = ds.batch(batch_size, drop_remainder=True).repeat(None)
  gather = _GatherWindows(
    tokens,
    seq_len,
    seed,
    batches_per_epoch,
    max_offset if random_offset else 0,
  )
  return ds.map_with_index(gather)


def train_iterator(
  tokens: Any,
  *,
  seq_len: int,
  batch_size: int,
  seed: int,
  shard_index: int = 0,
  shard_count: int = 1,
  random_offset: bool = True,
  num_threads: int = 1,
  prefetch_buffer_size: int = 4,
) -> grain.DatasetIterator:
  """Endless iterator of ``{'tokens': int32[batch_size, seq_len]}`` batches.

  Args:
    tokens: the train split's 1-D token ids.
    seq_len: tokens per example.
    batch_size: examples per batch on this process.
    seed: shuffle/offset seed; same seed on every process.
    shard_index: this process's index (``jax.process_index()``).
    shard_count: number of processes (``jax.process_count()``).
    random_offset: shift window boundaries by a per-epoch random offset.
    num_threads: grain reader threads (batches are cheap numpy gathers).
    prefetch_buffer_size: batches read ahead.

  Returns:
    A grain ``DatasetIterator``; ``get_state()`` is a JSON-serialisable dict
    and ``set_state(state)`` resumes exactly.

  Raises:
    ValueError: ``seq_len`` longer than the split, or too few windows for one
      batch per process.
  """
  ds = train_dataset(
    tokens,
    seq_len=seq_len,
    batch_size=batch_size,
    seed=seed,
    shard_index=shard_index,
    shard_count=shard_count,
    random_offset=random_offset,
  )
  return to_iterator(ds, num_threads, prefetch_buffer_size)


def to_iterator(
  ds: grain.MapDataset, num_threads: int = 1, prefetch_buffer_size: int = 4
) -> grain.DatasetIterator:
  """A checkpointable iterator over a batched MapDataset."""
  options = grain.ReadOptions(
    num_threads=num_threads, prefetch_buffer_size=prefetch_buffer_size
  )
  return iter(ds.to_iter_dataset(options))


def eval_batches(
  tokens: Any,
  *,
  seq_len: int,
  batch_size: int,
  max_batches: int | None = None,
  split_name: str = 'evaluation',
) -> list[np.ndarray]:
  """Deterministic evaluation batches: in-order windows, int32[B, L] each.

  Windows ``tokens[w*seq_len : (w+1)*seq_len]`` for w = 0, 1, ... are grouped
  into full batches; leftover tokens and a final partial batch are dropped.

  Args:
    tokens: an evaluation split's 1-D token ids.
    seq_len: tokens per example.
    batch_size: examples per batch.
    max_batches: keep at most this many batches (the first ones).
    split_name: the split's name, for error messages ('validation', ...).

  Raises:
    ValueError: fewer tokens than one window, or than one full batch.
  """
  tokens = _as_tokens(tokens, 'eval')
  _check_positive(seq_len=seq_len, batch_size=batch_size)
  if max_batches is not None:
    _check_positive(max_batches=max_batches)
  _check_fits(tokens.size, seq_len, split_name)
  num_windows = tokens.size // seq_len
  num_batches = num_windows // batch_size
  if num_batches == 0:
    raise ValueError(
      f'The {split_name} split ({tokens.size} tokens) makes only {num_windows} '
      f'windows of seq_len {seq_len}, fewer than batch_size {batch_size}; '
      'lower the eval batch size or seq_len.'
    )
  if max_batches is not None:
    num_batches = min(num_batches, max_batches)
  used_T = tokens[: num_batches * batch_size * seq_len]
  windows_NxBxL = used_T.reshape(num_batches, batch_size, seq_len)
  return [np.array(b_BxL) for b_BxL in windows_NxBxL]
