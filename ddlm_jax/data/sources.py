"""Dataset sources for the paper recipes: packed streams and padded documents.

A ``Source`` serves one dataset (text8, LM1B, OpenWebText, a zero-shot set)
for one tokenizer. Each split is one of two kinds:

``PackedSplit`` (text8; LM1B and OWT with ``packing='packed'``)
  The split's documents, each followed by EOS, joined into one token stream
  (text8 is one stream of characters). Batches cut it into windows with the
  semantics of ``ddlm_jax.data.pipeline``: per-epoch random offset, per-epoch
  shuffle, shard by process, drop the remainder. A window holds
  ``seq_len - n`` stream tokens plus the ``n`` framing tokens of ``wrap``:
  ``'bos_eos'`` puts BOS first and EOS last in every row (MDLM's
  ``wrap=True``: ``[BOS] doc1 [EOS] doc2-part [EOS]``), ``'eos'`` adds nothing
  (md4: ``doc [EOS] doc [EOS]`` cut into rows). A split can also be a fixed
  set of grid windows (``window_ids``, md4's chunk-level OWT split); then the
  offset is always 0.

``DocumentSplit`` (LM1B with ``packing='padded'``)
  One document per row: ``[BOS] ids[:L-2] [EOS] [PAD]...`` (MDLM's
  ``wrap=False``, BERT-style truncation), with ``batch['loss_mask']``
  (float32 [B, L], 1 on BOS/ids/EOS, 0 on padding). Documents are shuffled
  per epoch, sharded by process and tokenized on the fly in grain.

Every training pipeline is a grain ``MapDataset`` (index -> batch, a pure
function of the index), so iterators are deterministic given the seed and
checkpointable: ``get_state()`` is JSON, ``set_state`` resumes exactly.
Evaluation batches are the split's windows (or documents) in order, the same
on every process.

Token streams of large corpora are built once into a cache folder
(``<name>.bin`` raw little-endian ids, uint16 when the vocabulary fits, plus
``<name>.json`` describing them) and memory-mapped, so a 9B-token OpenWebText
stream costs no RAM. The JSON records the tokenizer fingerprint and the
documents used; a cache built for something else is refused with a message.
Sources are lazy: nothing is read until a split is first used, so a run can
be restored for evaluation on a machine without its training data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from ddlm_jax.data import pipeline
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.pretrained import (
  DataUnavailableError,
  SpecialIds,
  encode_batch,
)

WRAPS = ('bos_eos', 'eos', 'none')
PACKINGS = ('packed', 'padded')
CORPORA = ('text8', 'lm1b', 'openwebtext')
_CACHE_FORMAT = 1


# --------------------------------------------------------------------------
# Documents.


class TextColumn(Sequence):
  """Random-access text documents over a record source.

  Wraps a TFDS ``data_source``, an HF ``datasets.Dataset`` or a list, taking
  ``key`` from each record (bytes are decoded as UTF-8), optionally a
  ``[start, stop)`` range and a detokenizer applied to each text.
  """

  def __init__(
    self,
    records: Any,
    key: str | None = 'text',
    *,
    start: int = 0,
    stop: int | None = None,
    detokenizer: Callable[[str], str] | None = None,
  ):
    self._records = records
    self._key = key
    n = len(records)
    stop = n if stop is None else stop
    if not 0 <= start <= stop <= n:
      raise ValueError(f'bad document range [{start}, {stop}) of {n}.')
    self._start, self._stop = start, stop
    self._detok = detokenizer

  def __len__(self) -> int:
    return self._stop - self._start

  def _text(self, record: Any) -> str:
    value = record if self._key is None else record[self._key]
    if isinstance(value, bytes):
      value = value.decode('utf-8')
    return value if self._detok is None else self._detok(value)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return self.get_many(range(*i.indices(len(self))))
    i = int(i)
    if i < 0:
      i += len(self)
    if not 0 <= i < len(self):
      raise IndexError(i)
    return self._text(self._records[self._start + i])

  def get_many(self, indices: Iterable[int]) -> list[str]:
    """Texts of several documents, read in one call where possible."""
    keys = [self._start + int(i) for i in indices]
    recs = self._records
    if hasattr(recs, 'column_names') and self._key is not None:
      # HF datasets: one columnar read for the whole batch.
      values = recs[keys][self._key]
      return [self._text({self._key: v}) for v in values]
    if hasattr(recs, '__getitems__'):
      try:
        return [self._text(r) for r in recs.__getitems__(keys)]
      except TypeError:  # tfds.testing.mock_data's source lacks it.
        pass
    return [self._text(recs[k]) for k in keys]

  def describe(self) -> str:
    return f'{type(self._records).__name__}[{self._start}:{self._stop}]'


def get_texts(docs: Sequence[str], indices: Iterable[int]) -> list[str]:
  """Texts of ``docs[i]`` for each index (batched for a ``TextColumn``)."""
  getter = getattr(docs, 'get_many', None)
  if getter is not None:
    return getter(indices)
  return [docs[int(i)] for i in indices]


# --------------------------------------------------------------------------
# Split kinds.


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


@dataclasses.dataclass(frozen=True)
class DocumentSplit:
  """Documents padded one per row, with a loss mask (module docstring)."""

  docs: Sequence[str]
  bos: int | None
  eos: int | None
  pad: int


class _PackedGather:
  """(batch index, window indices) -> {'tokens': int32[B, L]}."""

  def __init__(self, split, seq_len, seed, batches_per_epoch, max_offset):
    self._split = split
    self._inner = split.inner_len(seq_len)
    self._seed = seed
    self._batches_per_epoch = batches_per_epoch
    self._max_offset = max_offset

  def __call__(self, index: int, windows_B: np.ndarray) -> dict[str, Any]:
    epoch = index // self._batches_per_epoch
    offset = pipeline._epoch_offset(self._seed, epoch, self._max_offset)
    windows_B = np.asarray(windows_B, np.int64)
    if self._split.window_ids is not None:
      windows_B = np.asarray(self._split.window_ids, np.int64)[windows_B]
    starts_B = offset + windows_B * self._inner
    return {'tokens': self._split.gather(starts_B, self._inner)}


class _PadBatch:
  """Document indices -> {'tokens': int32[B, L], 'loss_mask': f32[B, L]}."""

  def __init__(self, split: DocumentSplit, tokenizer, seq_len: int):
    self._split = split
    self._tokenizer = tokenizer
    self._seq_len = seq_len

  def __call__(self, doc_ids_B: np.ndarray) -> dict[str, np.ndarray]:
    texts = get_texts(self._split.docs, np.asarray(doc_ids_B).tolist())
    return pad_documents(
      encode_batch(self._tokenizer, texts), self._split, self._seq_len
    )


def pad_documents(
  ids_list: Sequence[np.ndarray], split: DocumentSplit, seq_len: int
) -> dict[str, np.ndarray]:
  """Frames, truncates and pads each document to one row of ``seq_len``."""
  framing = int(split.bos is not None) + int(split.eos is not None)
  room = seq_len - framing
  if room < 1:
    raise ValueError(f'seq_len {seq_len} is too short for padded documents.')
  tokens_BxL = np.full((len(ids_list), seq_len), split.pad, np.int32)
  mask_BxL = np.zeros((len(ids_list), seq_len), np.float32)
  for b, ids in enumerate(ids_list):
    row = [] if split.bos is None else [split.bos]
    row.extend(np.asarray(ids[:room]).tolist())
    if split.eos is not None:
      row.append(split.eos)
    tokens_BxL[b, : len(row)] = row
    mask_BxL[b, : len(row)] = 1.0
  return {'tokens': tokens_BxL, 'loss_mask': mask_BxL}


def _check_shards(batch_size, seed, shard_index, shard_count):
  pipeline._check_positive(batch_size=batch_size, shard_count=shard_count)
  if not 0 <= shard_index < shard_count:
    raise ValueError(
      f'shard_index must be in [0, {shard_count}), got {shard_index}.'
    )
  if not 0 <= seed < 2**63:
    raise ValueError(f'seed must be a non-negative integer, got {seed}.')


def packed_train_dataset(
  split: PackedSplit,
  *,
  seq_len: int,
  batch_size: int,
  seed: int,
  shard_index: int = 0,
  shard_count: int = 1,
  random_offset: bool = True,
) -> grain.MapDataset:
  """Endless MapDataset of packed windows (``pipeline.train_dataset`` rules).

  On an int32 stream without framing it yields exactly the batches of
  ``pipeline.train_dataset`` (tested); it also reads memory-mapped streams
  of any integer dtype and adds the split's framing tokens.
  """
  _check_shards(batch_size, seed, shard_index, shard_count)
  inner = split.inner_len(seq_len)
  if split.window_ids is None:
    num_windows, max_offset = pipeline.window_layout(
      int(split.tokens.shape[0]), inner
    )
  else:
    num_windows, max_offset = len(split.window_ids), 0
  if not random_offset:
    max_offset = 0
  batches_per_epoch = num_windows // (shard_count * batch_size)
  if batches_per_epoch == 0:
    raise ValueError(
      f'The train split makes only {num_windows} windows of seq_len '
      f'{seq_len}, fewer than batch_size {batch_size} x {shard_count} '
      'process(es); lower the batch size or seq_len, or add data.'
    )
  per_shard = batches_per_epoch * batch_size
  ds = grain.MapDataset.range(num_windows).shuffle(
    seed=pipeline._shuffle_seed(seed)
  )
  ds = ds[: per_shard * shard_count][shard_index::shard_count]
  ds = ds.batch(batch_size, drop_remainder=True).repeat(None)
  gather = _PackedGather(split, seq_len, seed, batches_per_epoch, max_offset)
  return ds.map_with_index(gather)


def padded_train_dataset(
  split: DocumentSplit,
  tokenizer: tok_lib.Tokenizer,
  *,
  seq_len: int,
  batch_size: int,
  seed: int,
  shard_index: int = 0,
  shard_count: int = 1,
) -> grain.MapDataset:
  """Endless MapDataset of padded documents with ``loss_mask``."""
  _check_shards(batch_size, seed, shard_index, shard_count)
  num_docs = len(split.docs)
  batches_per_epoch = num_docs // (shard_count * batch_size)
  if batches_per_epoch == 0:
    raise ValueError(
      f'The train split has {num_docs} documents, fewer than batch_size '
      f'{batch_size} x {shard_count} process(es); lower the batch size.'
    )
  per_shard = batches_per_epoch * batch_size
  ds = grain.MapDataset.range(num_docs).shuffle(
    seed=pipeline._shuffle_seed(seed)
  )
  ds = ds[: per_shard * shard_count][shard_index::shard_count]
  ds = ds.batch(batch_size, drop_remainder=True).repeat(None)
  return ds.map(_PadBatch(split, tokenizer, seq_len))


def _eval_groups(n: int, batch_size: int, max_batches, drop_partial, what):
  pipeline._check_positive(batch_size=batch_size)
  if max_batches is not None:
    pipeline._check_positive(max_batches=max_batches)
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
  n = split.num_windows(seq_len)
  ids = (
    np.arange(n) if split.window_ids is None else np.asarray(split.window_ids)
  )
  groups = _eval_groups(
    n, batch_size, max_batches, drop_partial, f'The {split_name} split'
  )
  return [
    {'tokens': split.gather(ids[np.asarray(g)].astype(np.int64) * inner, inner)}
    for g in groups
  ]


def padded_eval_batches(
  split: DocumentSplit,
  tokenizer: tok_lib.Tokenizer,
  *,
  seq_len: int,
  batch_size: int,
  max_batches: int | None = None,
  drop_partial: bool = True,
  split_name: str = 'evaluation',
) -> list[dict[str, np.ndarray]]:
  """Documents in order, one per row, with ``loss_mask``."""
  groups = _eval_groups(
    len(split.docs),
    batch_size,
    max_batches,
    drop_partial,
    f'The {split_name} split',
  )
  encode = _PadBatch(split, tokenizer, seq_len)
  return [encode(np.asarray(g)) for g in groups]


# --------------------------------------------------------------------------
# Token-stream caches.


def tokenizer_fingerprint(tokenizer: tok_lib.Tokenizer) -> str:
  """A short hash of the tokenizer's saved JSON (ids depend on nothing else)."""
  blob = json.dumps(
    {'kind': tokenizer.kind, **tokenizer._config()}, sort_keys=True
  )
  return hashlib.sha256(blob.encode('utf-8')).hexdigest()[:16]


def stream_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def document_stream(
  docs: Sequence[str],
  tokenizer: tok_lib.Tokenizer,
  eos: int | None,
  *,
  block: int = 2048,
  label: str = '',
) -> Iterable[np.ndarray]:
  """Yields the ids of ``docs`` (each followed by ``eos``) block by block."""
  dtype = stream_dtype(tokenizer.vocab_size)
  n = len(docs)
  t0, shown = time.perf_counter(), 0.0
  for start in range(0, n, block):
    stop = min(n, start + block)
    texts = get_texts(docs, range(start, stop))
    pieces = []
    for ids in encode_batch(tokenizer, texts):
      pieces.append(ids)
      if eos is not None:
        pieces.append(np.asarray([eos], np.int32))
    yield np.concatenate(pieces).astype(dtype) if pieces else np.zeros(0, dtype)
    now = time.perf_counter()
    if label and (now - shown > 30 or stop == n) and n > block:
      rate = stop / max(now - t0, 1e-9)
      print(f'  {label}: {stop}/{n} documents ({rate:.0f} docs/s)', flush=True)
      shown = now


def cached_stream(
  cache_dir: str | os.PathLike,
  name: str,
  meta: Mapping[str, Any],
  build: Callable[[], Iterable[np.ndarray]],
  *,
  dtype: np.dtype,
) -> np.ndarray:
  """Returns the memory-mapped stream ``name``, building it once if absent.

  Args:
    cache_dir: folder of the cache (created if needed).
    name: file stem, e.g. ``openwebtext-mdlm-train-<fingerprint>``.
    meta: what the stream was built from (tokenizer fingerprint, documents);
      an existing cache with different ``meta`` is an error.
    build: yields the stream's pieces (1-D arrays of ``dtype``).
    dtype: the stored integer dtype.

  The file is written under a temporary name and renamed when complete, so
  an interrupted build leaves nothing half-done behind (several hosts may
  build the same cache into a shared folder at once).
  """
  folder = pathlib.Path(os.path.expanduser(str(cache_dir)))
  bin_path = folder / f'{name}.bin'
  json_path = folder / f'{name}.json'
  want = {'format': _CACHE_FORMAT, 'dtype': np.dtype(dtype).str, **meta}
  if json_path.is_file():
    have = json.loads(json_path.read_text())
    num_tokens = have.pop('num_tokens')
    if have != json.loads(json.dumps(want)):
      diff = sorted(
        k for k in set(have) | set(want) if have.get(k) != want.get(k)
      )
      raise ValueError(
        f'Token cache {json_path} was built from different inputs '
        f'(fields {diff} differ). Delete {bin_path} and {json_path}, or '
        'point --config.data.cache_dir elsewhere.'
      )
    return _open_stream(bin_path, want['dtype'], num_tokens)
  folder.mkdir(parents=True, exist_ok=True)
  tmp = folder / f'.{name}.{uuid.uuid4().hex}.tmp'
  t0 = time.perf_counter()
  print(f'Building token cache {bin_path} ...', flush=True)
  num_tokens = 0
  try:
    with open(tmp, 'wb') as f:
      for piece in build():
        piece = np.asarray(piece).astype(np.dtype(dtype).newbyteorder('<'))
        f.write(piece.tobytes())
        num_tokens += piece.size
    os.replace(tmp, bin_path)
  finally:
    if tmp.exists():
      tmp.unlink()
  tmp_json = folder / f'.{name}.{uuid.uuid4().hex}.json.tmp'
  tmp_json.write_text(json.dumps({**want, 'num_tokens': num_tokens}, indent=1))
  os.replace(tmp_json, json_path)
  print(
    f'  {num_tokens} tokens in {time.perf_counter() - t0:.1f}s -> {bin_path}',
    flush=True,
  )
  return _open_stream(bin_path, want['dtype'], num_tokens)


def _open_stream(path: pathlib.Path, dtype: str, num_tokens: int):
  if num_tokens == 0:
    return np.zeros(0, np.dtype(dtype))
  if not path.is_file():
    raise DataUnavailableError(
      f'Token cache {path} is missing but its .json exists; delete the .json '
      'to rebuild it.'
    )
  return np.memmap(path, dtype=np.dtype(dtype), mode='r', shape=(num_tokens,))


def default_cache_dir(cfg_cache_dir: str) -> str:
  return cfg_cache_dir or os.path.join('~', '.cache', 'ddlm_jax')


# --------------------------------------------------------------------------
# The source.

SplitKind = PackedSplit | DocumentSplit


class Source:
  """Train and eval batches of one dataset (module docstring).

  Args:
    name: dataset name for messages ('text8', 'lm1b', ...).
    tokenizer: the tokenizer whose ids the splits hold.
    split_factories: split name -> zero-argument function building the split
      (called once, on first use).
    notes: free-form facts about the variant, shown by ``describe``.
  """

  def __init__(
    self,
    name: str,
    tokenizer: tok_lib.Tokenizer,
    split_factories: Mapping[str, Callable[[], SplitKind]],
    *,
    notes: str = '',
  ):
    self.name = name
    self.tokenizer = tokenizer
    self._factories = dict(split_factories)
    self._splits: dict[str, SplitKind] = {}
    self.notes = notes

  @property
  def split_names(self) -> tuple[str, ...]:
    return tuple(self._factories)

  def split(self, name: str) -> SplitKind:
    """The split ``name``, built (and cached) on first use."""
    if name not in self._factories:
      raise ValueError(
        f'split {name!r} is not in {self.name}; have {self.split_names}.'
      )
    if name not in self._splits:
      self._splits[name] = self._factories[name]()
    return self._splits[name]

  def prepare(self) -> None:
    """Builds every split now (token caches included)."""
    for name in self.split_names:
      self.split(name)

  def is_padded(self, split: str = 'train') -> bool:
    return isinstance(self.split(split), DocumentSplit)

  def train_dataset(
    self,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
  ) -> grain.MapDataset:
    train = self.split('train')
    kwargs = dict(
      seq_len=seq_len,
      batch_size=batch_size,
      seed=seed,
      shard_index=shard_index,
      shard_count=shard_count,
    )
    if isinstance(train, DocumentSplit):
      return padded_train_dataset(train, self.tokenizer, **kwargs)
    return packed_train_dataset(train, **kwargs)

  def train_iterator(
    self,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
    num_threads: int = 1,
    prefetch_buffer_size: int = 4,
  ) -> grain.DatasetIterator:
    """Endless checkpointable iterator of this process's train batches."""
    ds = self.train_dataset(
      seq_len=seq_len,
      batch_size=batch_size,
      seed=seed,
      shard_index=shard_index,
      shard_count=shard_count,
    )
    return pipeline.to_iterator(ds, num_threads, prefetch_buffer_size)

  def eval_batches(
    self,
    split: str,
    *,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
    drop_partial: bool = True,
  ) -> list[dict[str, np.ndarray]]:
    """Deterministic evaluation batches of ``split`` (module docstring)."""
    kind = self.split(split)
    kwargs = dict(
      seq_len=seq_len,
      batch_size=batch_size,
      max_batches=max_batches,
      drop_partial=drop_partial,
      split_name=split,
    )
    if isinstance(kind, DocumentSplit):
      return padded_eval_batches(kind, self.tokenizer, **kwargs)
    return packed_eval_batches(kind, **kwargs)

  def split_tokens(self, split: str) -> np.ndarray:
    """The int32 token stream of a packed split, without framing tokens.

    For a split of fixed rows (``window_ids``) this is its rows joined in
    order, so cutting it into rows of the grid length gives them back.
    """
    kind = self.split(split)
    if isinstance(kind, DocumentSplit):
      raise ValueError(
        f'{self.name} split {split!r} is padded (one document per row) and '
        'has no single token stream; use data.eval_batches(...) instead.'
      )
    if kind.window_ids is None:
      return np.asarray(kind.tokens).astype(np.int32)
    inner = kind.inner_len(kind.grid_len)
    starts = np.asarray(kind.window_ids, np.int64) * inner
    idx = (starts[:, None] + np.arange(inner)).reshape(-1)
    return np.asarray(kind.tokens[idx], np.int32)

  def describe(self) -> str:
    return (
      f'{self.name}: splits {list(self.split_names)}, vocab '
      f'{self.tokenizer.vocab_size}. {self.notes}'
    ).strip()


class SplitTokens(Mapping):
  """``data.splits`` of a Source: split name -> int32 stream, read lazily.

  Membership tests read nothing; indexing materialises a packed split's
  stream (padded splits raise with a pointer to ``eval_batches``).
  """

  def __init__(self, source: Source):
    self._source = source

  def __contains__(self, name: object) -> bool:
    return name in self._source.split_names

  def __getitem__(self, name: str) -> np.ndarray:
    if name not in self._source.split_names:
      raise KeyError(name)
    return self._source.split_tokens(name)

  def __iter__(self):
    return iter(self._source.split_names)

  def __len__(self) -> int:
    return len(self._source.split_names)


# --------------------------------------------------------------------------
# Config -> source.


def framing_ids(wrap: str, specials: SpecialIds, what: str):
  """(bos, eos) framing ids of a packed split for ``wrap``."""
  if wrap not in WRAPS:
    raise ValueError(f'data.wrap={wrap!r}; choose one of {WRAPS}.')
  if wrap == 'none':
    return None, None
  if specials.eos is None or (wrap == 'bos_eos' and specials.bos is None):
    raise ValueError(
      f'data.wrap={wrap!r} needs BOS/EOS tokens, but the {what} tokenizer '
      f'has bos={specials.bos}, eos={specials.eos}.'
    )
  return (specials.bos if wrap == 'bos_eos' else None), specials.eos


def build_source(cfg, tokenizer: tok_lib.Tokenizer | None = None) -> Source:
  """The Source of ``cfg.corpus`` ('text8', 'lm1b' or 'openwebtext').

  Args:
    cfg: the ``config.data`` block.
    tokenizer: reuse this tokenizer (a resumed run's saved one) instead of
      loading or building it.
  """
  corpus = cfg.corpus
  if corpus == 'text8':
    from ddlm_jax.data import text8

    return text8.text8_source(cfg, tokenizer)
  if corpus == 'lm1b':
    from ddlm_jax.data import lm1b

    return lm1b.lm1b_source(cfg, tokenizer)
  if corpus == 'openwebtext':
    from ddlm_jax.data import openwebtext

    return openwebtext.openwebtext_source(cfg, tokenizer)
  raise ValueError(f'corpus {corpus!r} is not a source; have {CORPORA}.')


def load_saved_tokenizer(directory: str | os.PathLike) -> tok_lib.Tokenizer:
  """Reloads a run's tokenizer, including the kinds defined by sources."""
  path = pathlib.Path(directory) / tok_lib.TOKENIZER_FILENAME
  kind = json.loads(path.read_text(encoding='utf-8')).get('kind')
  if kind == 'text8':
    from ddlm_jax.data.text8 import Text8Tokenizer

    return Text8Tokenizer()
  tok = tok_lib.load_tokenizer(directory)
  if isinstance(tok, tok_lib.BPETokenizer):
    from ddlm_jax.data.pretrained import HFTokenizer

    return HFTokenizer.wrap(tok)
  return tok


__all__ = [
  'CORPORA',
  'PACKINGS',
  'WRAPS',
  'DataUnavailableError',
  'DocumentSplit',
  'PackedSplit',
  'Source',
  'SplitTokens',
  'TextColumn',
  'build_source',
  'cached_stream',
  'document_stream',
  'framing_ids',
  'load_saved_tokenizer',
  'packed_eval_batches',
  'packed_train_dataset',
  'pad_documents',
  'padded_eval_batches',
  'padded_train_dataset',
  'tokenizer_fingerprint',
]
