"""Dataset sources for the paper recipes: packed streams and padded documents.

A ``Source`` serves one dataset (text8, LM1B, OpenWebText, a zero-shot set)
for one tokenizer. Each split is one of two kinds:

``PackedSplit`` (text8; LM1B and OWT with ``packing='packed'``)
  The split's documents, each followed by EOS, joined into one token stream
  (text8 is one stream of characters). ``ddlm_jax.data.pipeline`` defines
  it and cuts it into windows: per-epoch random offset, per-epoch shuffle,
  shard by process, drop the remainder. A window holds
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

This module is the base that the dataset modules (``text8``, ``lm1b``,
``openwebtext``) build on; ``ddlm_jax.data.source_registry`` maps a
``config.data.corpus`` to them.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import pathlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grain
import numpy as np
import tqdm

from ddlm_jax.data import pipeline
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.pipeline import PackedSplit, packed_eval_batches
from ddlm_jax.data.pretrained import DataUnavailableError
from ddlm_jax.data.settings import PACKINGS, WRAPS

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

  @property
  def start(self) -> int:
    """First record of the range (cache metadata names it)."""
    return self._start

  @property
  def stop(self) -> int:
    return self._stop

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
# Split kinds: ``PackedSplit`` (``ddlm_jax.data.pipeline``) and documents.


@dataclasses.dataclass(frozen=True)
class DocumentSplit:
  """Documents padded one per row, with a loss mask (module docstring)."""

  docs: Sequence[str]
  bos: int | None
  eos: int | None
  pad: int


class _PadBatch:
  """Document indices -> {'tokens': int32[B, L], 'loss_mask': f32[B, L]}."""

  def __init__(self, split: DocumentSplit, tokenizer, seq_len: int):
    self._split = split
    self._tokenizer = tokenizer
    self._seq_len = seq_len

  def __call__(self, doc_ids_B: np.ndarray) -> dict[str, np.ndarray]:
    texts = get_texts(self._split.docs, np.asarray(doc_ids_B).tolist())
    return pad_documents(
      self._tokenizer.encode_batch(texts), self._split, self._seq_len
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
  num_docs = len(split.docs)
  ds, _ = pipeline.epoch_batches(
    num_docs,
    batch_size=batch_size,
    seed=seed,
    shard_index=shard_index,
    shard_count=shard_count,
    what=f'The train split has {num_docs} documents',
  )
  return ds.map(_PadBatch(split, tokenizer, seq_len))


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
  groups = pipeline.eval_groups(
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


def stream_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def document_stream(
  docs: Sequence[str],
  tokenizer: tok_lib.Tokenizer,
  eos: int | None,
  *,
  block: int = 2048,
  label: str = '',
  num_proc: int = 1,
) -> Iterable[np.ndarray]:
  """Yields the ids of ``docs`` (each followed by ``eos``) block by block.

  ``num_proc > 1`` encodes the blocks in that many spawned worker
  processes (the reading, detokenizing and Python-side joining that the
  Rust tokenizer's own threads leave on one core), delivered in block
  order, so the stream is the same for every ``num_proc``. With a
  ``label`` a progress bar shows documents/s and the time left.
  """
  if isinstance(num_proc, bool) or not isinstance(num_proc, int):
    raise ValueError(f'num_proc must be an integer >= 1, got {num_proc!r}.')
  if num_proc < 1:
    raise ValueError(f'num_proc must be >= 1, got {num_proc}.')
  n = len(docs)
  spans = [(start, min(n, start + block)) for start in range(0, n, block)]
  encode = _BlockEncoder(docs, tokenizer, eos)
  pool = None
  if num_proc > 1 and len(spans) > 1:
    workers = min(num_proc, len(spans))
    pool = multiprocessing.get_context('spawn').Pool(
      workers,
      initializer=_start_worker,
      initargs=(encode, max(1, (os.cpu_count() or 1) // workers)),
    )
    pieces = pool.imap(_encode_in_worker, spans)
  else:
    pieces = map(encode, spans)
  bar = tqdm.tqdm(
    total=n,
    desc=f'  {label}',
    unit='doc',
    unit_scale=True,
    mininterval=5.0,
    disable=not label or n <= block,
  )
  try:
    for (start, stop), piece in zip(spans, pieces):
      yield piece
      bar.update(stop - start)
  finally:
    bar.close()
    if pool is not None:
      pool.terminate()
      pool.join()


class _BlockEncoder:
  """(start, stop) -> the ids of docs[start:stop], each followed by eos.

  A picklable object, so worker processes receive the documents' source
  (an Arrow table or ArrayRecord reader, opened again by path) and the
  tokenizer once, at start.
  """

  def __init__(self, docs, tokenizer, eos):
    self.docs = docs
    self.tokenizer = tokenizer
    self.eos = eos
    self.dtype = stream_dtype(tokenizer.vocab_size)

  def __call__(self, span: tuple[int, int]) -> np.ndarray:
    texts = get_texts(self.docs, range(*span))
    pieces = []
    tail = None if self.eos is None else np.asarray([self.eos], np.int32)
    for ids in self.tokenizer.encode_batch(texts):
      pieces.append(ids)
      if tail is not None:
        pieces.append(tail)
    if not pieces:
      return np.zeros(0, self.dtype)
    return np.concatenate(pieces).astype(self.dtype)


_WORKER_ENCODER: _BlockEncoder | None = None


def _start_worker(encode: _BlockEncoder, threads: int) -> None:
  # The Rust tokenizer's thread pool is sized on first use: share the
  # cores among the workers instead of starting all of them in each.
  os.environ['RAYON_RS_NUM_THREADS'] = str(threads)
  os.environ['RAYON_NUM_THREADS'] = str(threads)
  global _WORKER_ENCODER
  _WORKER_ENCODER = encode


def _encode_in_worker(span: tuple[int, int]) -> np.ndarray:
  return _WORKER_ENCODER(span)


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


def prep_processes(cfg) -> int:
  """``data.prep_processes`` of the typed data settings (checked again)."""
  n = cfg.prep_processes
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(
      f'data.prep_processes={n!r}; set it to an integer >= 1 (the worker '
      'processes that tokenize a token cache).'
    )
  return n


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
    return pipeline.train_dataset(train, **kwargs)

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


def framing_ids(wrap: str, specials: tok_lib.SpecialIds, what: str):
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


__all__ = [
  'PACKINGS',
  'WRAPS',
  'DataUnavailableError',
  'DocumentSplit',
  'PackedSplit',
  'Source',
  'SplitTokens',
  'TextColumn',
  'cached_stream',
  'document_stream',
  'framing_ids',
  'packed_eval_batches',
  'pad_documents',
  'padded_eval_batches',
  'padded_train_dataset',
  'prep_processes',
]
