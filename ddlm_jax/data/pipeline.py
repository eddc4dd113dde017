"""Token streams to fixed-length batches: a checkpointable grain train loader.

Training (``train_iterator``) treats a split as one concatenated token stream
and cuts it into non-overlapping windows of ``seq_len`` tokens. Each epoch

1. draws one offset ``o`` in ``[0, max_offset]`` from ``(seed, epoch)``
   and uses windows ``tokens[o + w*seq_len : o + (w+1)*seq_len]``, so window
   boundaries move from epoch to epoch;
2. shuffles the window indices with a per-epoch seed (grain's
   ``MapDataset.shuffle`` folds the epoch into the seed);
3. keeps the first ``shard_count * batches_per_epoch * batch_size`` shuffled
   windows and cuts them into global batches of ``shard_count * batch_size``;
4. gives process ``shard_index`` rows ``[shard_index * batch_size,
   (shard_index + 1) * batch_size)`` of each global batch (``batch_size`` is
   the per-process batch; the remainder of an epoch is dropped).

So processes see disjoint windows and the same number of batches per epoch,
and the global batch, in row order, does not depend on how many processes
read it: process i's rows land on its devices, which hold rows [i * b, (i +
1) * b) of the global array (``jax.make_array_from_process_local_data``), so
one process and N processes train on the same global batches
(``tests/test_multiprocess.py``).

A stream is a ``PackedSplit``: the ids (any integer dtype, e.g. a
memory-mapped uint16 cache) plus optional framing tokens (BOS first and/or
EOS last in every row, each window then holding ``seq_len - framing`` stream
tokens) and optionally a fixed set of grid windows (``window_ids``; the
offset is then always 0). A plain 1-D array is a ``PackedSplit`` without
framing. The corpus loaders and ``ddlm_jax.data.sources`` both use this one
implementation.

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

import dataclasses
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


def check_positive(**values: int) -> None:
  """Raises ValueError naming the first value that is not an integer >= 1."""
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


def epoch_batches(
  num_items: int,
  *,
  batch_size: int,
  seed: int,
  shard_index: int,
  shard_count: int,
  what: str,
) -> tuple[grain.MapDataset, int]:
  """Endless batches of item ids: steps 2-4 of the module docstring.

  Shared by packed windows and padded documents, so both shuffle, shard and
  drop remainders alike.

  Args:
    num_items: windows (or documents) per epoch.
    batch_size: items per batch on this process.
    seed: the run's seed, the same on every process.
    shard_index: this process's index.
    shard_count: number of processes.
    what: the items, for the too-few-items error ('The train split ...').

  Returns:
    (MapDataset of int64 [batch_size] item ids, batches per epoch).
  """
  check_positive(batch_size=batch_size, shard_count=shard_count)
  if not 0 <= shard_index < shard_count:
    raise ValueError(
      f'shard_index must be in [0, {shard_count}), got {shard_index}.'
    )
  if not 0 <= seed < 2**63:
    raise ValueError(f'seed must be a non-negative integer, got {seed}.')
  batches_per_epoch = num_items // (shard_count * batch_size)
  if batches_per_epoch == 0:
    raise ValueError(
      f'{what}, fewer than batch_size {batch_size} x {shard_count} '
      'process(es); lower the batch size or seq_len, or add data.'
    )
  global_batch = shard_count * batch_size
  ds = grain.MapDataset.range(num_items).shuffle(seed=_shuffle_seed(seed))
  ds = ds[: batches_per_epoch * global_batch]
  ds = ds.batch(global_batch, drop_remainder=True)
  if shard_count > 1:
    ds = ds.map(_RowBlock(shard_index * batch_size, batch_size))
  return ds.repeat(None), batches_per_epoch


class _RowBlock:
  """Rows [start, start + size) of a global batch of ids (picklable)."""

  def __init__(self, start: int, size: int):
    self._start, self._stop = start, start + size

  def __call__(self, ids: np.ndarray) -> np.ndarray:
    return ids[self._start : self._stop]


@dataclasses.dataclass(frozen=True)
class PackedSplit:
  """A token stream cut into windows (see module docstring).

  Attributes:
    tokens: 1-D integer ids (numpy array or ``np.memmap``, any int dtype).
    bos: id put first in every window, or None.
    eos: id put last in every window, or None.
    window_ids: None for the sliding grid; else the grid windows (of
      ``seq_len - framing`` stream tokens) that form this split.
    grid_len: the ``seq_len`` that ``window_ids`` were drawn for.
  """

  tokens: Any
  bos: int | None = None
  eos: int | None = None
  window_ids: np.ndarray | None = None
  grid_len: int | None = None

  @property
  def framing(self) -> int:
    return int(self.bos is not None) + int(self.eos is not None)

  def inner_len(self, seq_len: int) -> int:
    if self.grid_len is not None and seq_len != self.grid_len:
      raise ValueError(
        f'This split is a fixed set of rows of length {self.grid_len}; '
        f'seq_len {seq_len} differs. Rebuild the source with this seq_len.'
      )
    inner = seq_len - self.framing
    if inner < 1:
      raise ValueError(
        f'seq_len {seq_len} leaves no room for data beside {self.framing} '
        'framing token(s); use a longer --config.data.seq_len.'
      )
    return inner

  def num_windows(self, seq_len: int) -> int:
    inner = self.inner_len(seq_len)
    if self.window_ids is not None:
      return len(self.window_ids)
    return int(self.tokens.shape[0]) // inner

  def frame(self, body_BxI: np.ndarray) -> np.ndarray:
    """Adds the BOS/EOS columns: int32 [B, I] -> int32 [B, I + framing]."""
    cols = []
    n = body_BxI.shape[0]
    if self.bos is not None:
      cols.append(np.full((n, 1), self.bos, np.int32))
    cols.append(body_BxI.astype(np.int32, copy=False))
    if self.eos is not None:
      cols.append(np.full((n, 1), self.eos, np.int32))
    return np.concatenate(cols, axis=1) if len(cols) > 1 else cols[0]

  def gather(self, starts_B: np.ndarray, inner: int) -> np.ndarray:
    idx_BxI = np.asarray(starts_B, np.int64)[:, None] + np.arange(inner)
    return self.frame(np.asarray(self.tokens[idx_BxI], np.int32))


def as_split(stream: Any, what: str = 'train') -> PackedSplit:
  """A ``PackedSplit`` as is; a 1-D integer array as an unframed one."""
  if isinstance(stream, PackedSplit):
    return stream
  return PackedSplit(_as_tokens(stream, what))


class _GatherWindows:
  """Batch index + window ids -> {'tokens': int32[B, L]} (picklable)."""

  def __init__(self, split, inner, seed, batches_per_epoch, max_offset):
    self._split = split
    self._inner = inner
    self._seed = seed
    self._batches_per_epoch = batches_per_epoch
    self._max_offset = max_offset

  def __call__(self, index: int, windows_B: np.ndarray) -> dict[str, Any]:
    epoch = index // self._batches_per_epoch
    offset = _epoch_offset(self._seed, epoch, self._max_offset)
    windows_B = np.asarray(windows_B, np.int64)
    if self._split.window_ids is not None:
      windows_B = np.asarray(self._split.window_ids, np.int64)[windows_B]
    starts_B = offset + windows_B * self._inner
    return {'tokens': self._split.gather(starts_B, self._inner)}


def train_dataset(
  stream: Any,
  *,
  seq_len: int,
  batch_size: int,
  seed: int,
  shard_index: int = 0,
  shard_count: int = 1,
  random_offset: bool = True,
) -> grain.MapDataset:
  """The endless grain MapDataset behind ``train_iterator`` (module doc).

  ``stream`` is a ``PackedSplit`` or a 1-D integer array; batches are
  ``{'tokens': int32[batch_size, seq_len]}`` whatever the stored dtype.
  """
  split = as_split(stream)
  check_positive(seq_len=seq_len)
  inner = split.inner_len(seq_len)
  num_tokens = int(split.tokens.shape[0])
  if split.window_ids is None:
    num_windows, max_offset = window_layout(num_tokens, inner)
  else:
    num_windows, max_offset = len(split.window_ids), 0
  ds, batches_per_epoch = epoch_batches(
    num_windows,
    batch_size=batch_size,
    seed=seed,
    shard_index=shard_index,
    shard_count=shard_count,
    what=(
      f'The train split ({num_tokens} tokens) makes only {num_windows} '
      f'windows of seq_len {seq_len}'
    ),
  )
  gather = _GatherWindows(
    split,
    inner,
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
    tokens: the train split's 1-D token ids, or a ``PackedSplit``.
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


def eval_groups(
  n: int,
  batch_size: int,
  max_batches: int | None,
  drop_partial: bool,
  what: str,
) -> list[range]:
  """Item ids of each evaluation batch: ``range(n)`` in order, in groups.

  Shared by packed windows and padded documents.
  """
  check_positive(batch_size=batch_size)
  if max_batches is not None:
    check_positive(max_batches=max_batches)
  full = n // batch_size
  groups = [range(b * batch_size, (b + 1) * batch_size) for b in range(full)]
  if not drop_partial and n % batch_size:
    groups.append(range(full * batch_size, n))
  if not groups:
    raise ValueError(
      f'{what} makes only {n} sequence(s), fewer than batch_size '
      f'{batch_size}; lower the eval batch size or seq_len.'
    )
  return groups if max_batches is None else groups[:max_batches]


def packed_eval_batches(
  split: PackedSplit,
  *,
  seq_len: int,
  batch_size: int,
  max_batches: int | None = None,
  drop_partial: bool = True,
  split_name: str = 'evaluation',
) -> list[dict[str, np.ndarray]]:
  """Windows in order (offset 0), framed, grouped into batches."""
  inner = split.inner_len(seq_len)
  if split.window_ids is None:
    _check_fits(int(split.tokens.shape[0]), inner, split_name)
  n = split.num_windows(seq_len)
  ids = (
    np.arange(n) if split.window_ids is None else np.asarray(split.window_ids)
  )
  groups = eval_groups(
    n, batch_size, max_batches, drop_partial, f'The {split_name} split'
  )
  return [
    {'tokens': split.gather(ids[np.asarray(g)].astype(np.int64) * inner, inner)}
    for g in groups
  ]


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
  into full batches; leftover tokens and a final partial batch are dropped
  (``packed_eval_batches`` of an unframed split).

  Args:
    tokens: an evaluation split's 1-D token ids.
    seq_len: tokens per example.
    batch_size: examples per batch.
    max_batches: keep at most this many batches (the first ones).
    split_name: the split's name, for error messages ('validation', ...).

  Raises:
    ValueError: fewer tokens than one window, or than one full batch.
  """
  split = as_split(tokens, 'eval')
  check_positive(seq_len=seq_len, batch_size=batch_size)
  _check_fits(split.tokens.size, seq_len, split_name)
  batches = packed_eval_batches(
    split,
    seq_len=seq_len,
    batch_size=batch_size,
    max_batches=max_batches,
    split_name=split_name,
  )
  return [b['tokens'] for b in batches]
