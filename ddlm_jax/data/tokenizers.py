"""Tokenizers behind one small interface: characters, bytes, HF, text8.

Every tokenizer maps text to a 1-D int32 array of ids in ``[0, vocab_size)``
and back, is picklable (grain workers receive copies) and saves itself as one
JSON file, ``ddlm_tokenizer.json``, so that a run directory holds the exact
tokenizer its model was trained with. ``load_tokenizer(run_dir)`` reloads
every kind, so all of them live in this module: ``char``, ``byte``, ``bpe``
(any HF ``tokenizers`` model: BPE trained here, or the pretrained BERT and
GPT-2 tokenizers of ``ddlm_jax.data.pretrained``) and ``text8`` (the 27
symbols of ``ddlm_jax.data.text8``).

Ids and special tokens:

* The character and byte vocabularies hold no BOS/EOS/PAD/MASK tokens. A
  masked-diffusion model adds its own mask id, conventionally ``vocab_size``,
  outside the tokenizer.
* ``CharTokenizer`` reserves one id for unknown characters, ``unk_id =
  vocab_size - 1`` (the sorted characters take ids ``0 .. vocab_size - 2``).
  It decodes to U+FFFD. With ``unk_policy='error'`` encoding an unseen
  character raises instead of mapping it to ``unk_id``.
* ``BPETokenizer`` is byte-level, so it never meets an unknown character; it
  has no special tokens unless ``special_tokens`` are given to ``train``
  (they then take the lowest ids).
* ``decode`` accepts any integer sequence. Ids outside ``[0, vocab_size)``,
  such as a diffusion mask id, decode to the visible placeholder ``'_'``
  (``MASK_PLACEHOLDER``; pass ``placeholder=`` to choose another, because
  ``'_'`` also occurs in real text).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ddlm_jax import paths

TOKENIZER_FILENAME = 'ddlm_tokenizer.json'
MASK_PLACEHOLDER = '_'
UNK_CHAR = '\ufffd'
UNK_POLICIES = ('replace', 'error')
TEXT8_ALPHABET = 'abcdefghijklmnopqrstuvwxyz '
_FORMAT_VERSION = 1
_BOS_CANDIDATES = ('[CLS]', '<|endoftext|>', '<s>', '[BOS]', '<bos>')
_EOS_CANDIDATES = ('[SEP]', '<|endoftext|>', '</s>', '[EOS]', '<eos>')
_PAD_CANDIDATES = ('[PAD]', '<pad>', '<|padding|>')


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """BOS/EOS/PAD ids of a tokenizer (None where it has no such token)."""

  bos: int | None
  eos: int | None
  pad: int | None


def _as_id_array(ids: Any) -> np.ndarray:
  """Converts ids (list, array, jax array) to a 1-D int64 numpy array."""
  arr = np.asarray(ids)
  if arr.ndim == 0:
    arr = arr.reshape(1)
  if arr.ndim != 1:
    raise ValueError(
      f'decode takes a 1-D sequence of ids, got shape {arr.shape}; decode '
      'each row of a batch separately.'
    )
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f'decode takes integer ids, got dtype {arr.dtype}.')
  return arr.astype(np.int64)


def _valid_runs(
  ids: np.ndarray, vocab_size: int
) -> Iterable[tuple[bool, np.ndarray]]:
  """Splits ids into maximal runs that are all in / all out of the vocab."""
  valid = (ids >= 0) & (ids < vocab_size)
  if not ids.size:
    return
  cuts = np.flatnonzero(np.diff(valid.astype(np.int8))) + 1
  for run in np.split(np.arange(ids.size), cuts):
    yield bool(valid[run[0]]), ids[run]


class Tokenizer(abc.ABC):
  """Interface: ``encode``/``decode``/``save`` plus ``vocab_size``, ``kind``."""

  kind: str = ''
  vocab_size: int = 0

  @abc.abstractmethod
  def encode(self, text: str) -> np.ndarray:
    """Returns the ids of ``text`` as a 1-D int32 array."""

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """Ids of each text; subclasses with a batch encoder override this."""
    return [np.asarray(self.encode(t), np.int32) for t in texts]

  @abc.abstractmethod
  def _decode_valid(self, ids: np.ndarray) -> str:
    """Text of ids that are all inside the vocabulary."""

  def decode(self, ids: Any, *, placeholder: str = MASK_PLACEHOLDER) -> str:
    """Returns the text of ``ids``; out-of-vocab ids become ``placeholder``."""
    arr = _as_id_array(ids)
    pieces = []
    for valid, run in _valid_runs(arr, self.vocab_size):
      pieces.append(
        self._decode_valid(run) if valid else placeholder * run.size
      )
    return ''.join(pieces)

  @abc.abstractmethod
  def _config(self) -> dict[str, Any]:
    """JSON-serialisable state that ``_from_config`` rebuilds from."""

  @classmethod
  @abc.abstractmethod
  def _from_config(cls, config: dict[str, Any]) -> Tokenizer:
    """Inverse of ``_config``."""

  def save(self, directory: str | os.PathLike):
    """Writes ``directory/ddlm_tokenizer.json``; returns its path.

    `directory` is local or any `etils.epath` URI (a gs:// workdir's
    tokenizer/); the returned path is an `etils.epath.Path`.
    """
    path = paths.epath(directory)
    path.mkdir(parents=True, exist_ok=True)
    path = path / TOKENIZER_FILENAME
    config = {'format_version': _FORMAT_VERSION, 'kind': self.kind}
    config.update(self._config())
    path.write_text(json.dumps(config, ensure_ascii=True), encoding='utf-8')
    return path

  def __eq__(self, other: object) -> bool:
    return type(self) is type(other) and self._config() == other._config()

  def __hash__(self) -> int:
    return hash(json.dumps(self._config(), sort_keys=True))

  def __repr__(self) -> str:
    return f'{type(self).__name__}(vocab_size={self.vocab_size})'


class CharTokenizer(Tokenizer):
  """One id per character of a sorted vocabulary, plus a reserved UNK id."""

  kind = 'char'

  def __init__(self, chars: Iterable[str], unk_policy: str = 'replace'):
    """Builds the vocabulary ``sorted(set(chars))``.

    Args:
      chars: the characters (each a 1-character string).
      unk_policy: 'replace' maps unseen characters to ``unk_id``; 'error'
        raises ValueError naming the character and its position.
    """
    chars = sorted(set(chars))
    bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
    if bad:
      raise ValueError(f'Vocabulary entries must be single characters: {bad}')
    if not chars:
      raise ValueError('CharTokenizer needs at least one character.')
    if unk_policy not in UNK_POLICIES:
      raise ValueError(
        f'unk_policy must be one of {UNK_POLICIES}, got {unk_policy!r}.'
      )
    self.chars = tuple(chars)
    self.unk_policy = unk_policy
    self.unk_id = len(chars)
    self.vocab_size = len(chars) + 1
    # Codepoint -> id table, -1 for characters outside the vocabulary (one
    # gather per character: ~4x faster than a sorted search on a corpus).
    codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)
    self._ids_by_codepoint = np.full(int(codepoints.max()) + 2, -1, np.int32)
    self._ids_by_codepoint[codepoints] = np.arange(len(chars), dtype=np.int32)

  @classmethod
  def from_text(cls, text: str, unk_policy: str = 'replace') -> CharTokenizer:
    """Vocabulary = the distinct characters of ``text`` (the train split)."""
    if not text:
      raise ValueError('CharTokenizer.from_text needs non-empty text.')
    return cls(set(text), unk_policy=unk_policy)

  def encode(self, text: str) -> np.ndarray:
    cps = np.frombuffer(text.encode('utf-32-le'), dtype=np.uint32)
    beyond = len(self._ids_by_codepoint) - 1  # Maps to -1: not in the vocab.
    ids = self._ids_by_codepoint[np.minimum(cps, beyond)]
    known = ids >= 0
    if not known.all():
      if self.unk_policy == 'error':
        i = int(np.flatnonzero(~known)[0])
        line = text.count('\n', 0, i) + 1
        col = i - (text.rfind('\n', 0, i) + 1) + 1
        raise ValueError(
          f'Character {text[i]!r} (U+{ord(text[i]):04X}) at index {i} '
          f'(line {line}, column {col}) is not in the {self.vocab_size}-id '
          "vocabulary; use unk_policy='replace' to map unseen characters to "
          'the UNK id, or build the vocabulary from text that contains it.'
        )
      ids = np.where(known, ids, self.unk_id)
    return ids.astype(np.int32)

  def _decode_valid(self, ids: np.ndarray) -> str:
    table = self.chars + (UNK_CHAR,)
    return ''.join(table[i] for i in ids.tolist())

  def _config(self) -> dict[str, Any]:
    return {'chars': ''.join(self.chars), 'unk_policy': self.unk_policy}

  @classmethod
  def _from_config(cls, config: dict[str, Any]) -> CharTokenizer:
    return cls(config['chars'], unk_policy=config['unk_policy'])


class ByteTokenizer(Tokenizer):
  """The 256 byte values of the UTF-8 encoding; decode replaces bad UTF-8."""

  kind = 'byte'
  vocab_size = 256

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode('utf-8'), dtype=np.uint8).astype(np.int32)

  def _decode_valid(self, ids: np.ndarray) -> str:
    return ids.astype(np.uint8).tobytes().decode('utf-8', errors='replace')

  def _config(self) -> dict[str, Any]:
    return {}

  @classmethod
  def _from_config(cls, config: dict[str, Any]) -> ByteTokenizer:
    del config
    return cls()


class BPETokenizer(Tokenizer):
  """An HF ``tokenizers`` model: byte-level BPE trained here, or pretrained.

  ``train`` builds byte-level BPE (GPT-2 style byte alphabet); any other HF
  tokenizer (BERT's WordPiece, GPT-2's BPE) is wrapped as is. Encoding never
  adds special tokens; ``special_ids`` finds BOS/EOS/PAD by their usual names
  so that the data sources can add them.
  """

  kind = 'bpe'

  def __init__(self, hf_tokenizer: Any):
    """Wraps a ``tokenizers.Tokenizer`` (use ``train`` or ``from_file``)."""
    self._hf = hf_tokenizer
    self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))

  @classmethod
  def train(
    cls,
    text: str,
    vocab_size: int,
    *,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = (),
  ) -> BPETokenizer:
    """Trains byte-level BPE merges on ``text``.

    Args:
      text: training text (the train split).
      vocab_size: target size, including the 256 byte symbols and the special
        tokens; the result can be smaller if ``text`` runs out of merges.
      min_frequency: minimum count of a pair to be merged.
      special_tokens: optional specials (none by default); they get ids
        ``0 .. len(special_tokens) - 1``.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    floor = 256 + len(special_tokens)
    if vocab_size < floor:
      raise ValueError(
        f'BPE vocab_size {vocab_size} is below {floor} (256 byte symbols + '
        f'{len(special_tokens)} special tokens); use vocab_size >= {floor}.'
      )
    if not text:
      raise ValueError('BPETokenizer.train needs non-empty text.')
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      min_frequency=min_frequency,
      special_tokens=list(special_tokens),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
    )
    hf.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return cls(hf)

  @classmethod
  def from_file(cls, path: str | os.PathLike) -> BPETokenizer:
    """Loads an HF ``tokenizer.json``, a ``ddlm_tokenizer.json`` or its dir."""
    from tokenizers import Tokenizer as HFTokenizer

    path = paths.epath(path)
    if path.is_dir():
      path = path / TOKENIZER_FILENAME
    config = json.loads(path.read_text(encoding='utf-8'))
    if 'kind' in config:
      if config['kind'] != cls.kind:
        raise ValueError(f'{path} holds a {config["kind"]!r} tokenizer.')
      return cls._from_config(config)
    return cls(HFTokenizer.from_str(json.dumps(config)))

  def encode(self, text: str) -> np.ndarray:
    ids = self._hf.encode(text, add_special_tokens=False).ids
    return np.asarray(ids, dtype=np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """Ids of each text (no special tokens), encoded in parallel."""
    encodings = self._hf.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

  @property
  def special_ids(self) -> SpecialIds:
    def first(candidates):
      for token in candidates:
        i = self._hf.token_to_id(token)
        if i is not None:
          return int(i)
      return None

    eos = first(_EOS_CANDIDATES)
    pad = first(_PAD_CANDIDATES)
    return SpecialIds(
      bos=first(_BOS_CANDIDATES), eos=eos, pad=eos if pad is None else pad
    )

  def _decode_valid(self, ids: np.ndarray) -> str:
    return self._hf.decode(ids.tolist(), skip_special_tokens=False)

  def _config(self) -> dict[str, Any]:
    return {'hf_tokenizer': json.loads(self._hf.to_str())}

  @classmethod
  def _from_config(cls, config: dict[str, Any]) -> BPETokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    return cls(HFTokenizer.from_str(json.dumps(config['hf_tokenizer'])))

  def __getstate__(self) -> dict[str, Any]:
    return {'hf_json': self._hf.to_str()}

  def __setstate__(self, state: dict[str, Any]) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    self.__init__(HFTokenizer.from_str(state['hf_json']))


class Text8Tokenizer(Tokenizer):
  """The 27 text8 symbols: a-z -> 0-25, space -> 26; no UNK, no specials."""

  kind = 'text8'
  vocab_size = len(TEXT8_ALPHABET)

  def __init__(self):
    table = np.full(256, -1, np.int16)
    for i, ch in enumerate(TEXT8_ALPHABET):
      table[ord(ch)] = i
    self._table = table

  def encode_bytes(self, data: bytes) -> np.ndarray:
    """Ids (uint8) of text8-format bytes; raises on any other byte."""
    ids = self._table[np.frombuffer(data, np.uint8)]
    bad = np.flatnonzero(ids < 0)
    if bad.size:
      i = int(bad[0])
      raise ValueError(
        f'Byte {data[i : i + 1]!r} at offset {i} is not a text8 symbol '
        f'(a-z or space); {bad.size} such byte(s) in all. text8 files hold '
        'only those 27 symbols.'
      )
    return ids.astype(np.uint8)

  def encode(self, text: str) -> np.ndarray:
    try:
      data = text.encode('ascii')
    except UnicodeEncodeError as e:
      raise ValueError(f'text8 takes a-z and space only: {e}') from e
    return self.encode_bytes(data).astype(np.int32)

  def _decode_valid(self, ids: np.ndarray) -> str:
    return ''.join(TEXT8_ALPHABET[i] for i in ids.tolist())

  def _config(self) -> dict[str, Any]:
    return {'alphabet': TEXT8_ALPHABET}

  @classmethod
  def _from_config(cls, config: dict[str, Any]) -> Text8Tokenizer:
    if config.get('alphabet', TEXT8_ALPHABET) != TEXT8_ALPHABET:
      raise ValueError('saved text8 alphabet differs from this code.')
    return cls()


# Kinds that build_tokenizer fits to a corpus; load_tokenizer knows them all.
_BUILDABLE: dict[str, type[Tokenizer]] = {
  'char': CharTokenizer,
  'byte': ByteTokenizer,
  'bpe': BPETokenizer,
}
_KINDS: dict[str, type[Tokenizer]] = {**_BUILDABLE, 'text8': Text8Tokenizer}
TOKENIZER_KINDS = tuple(_BUILDABLE)
SAVED_KINDS = tuple(_KINDS)


def build_tokenizer(kind: str, train_text: str, **kwargs) -> Tokenizer:
  """Builds a tokenizer of ``kind`` from the training text.

  Args:
    kind: 'char' (kwargs: ``unk_policy``), 'byte' (no kwargs; ``train_text``
      is ignored) or 'bpe' (kwargs: ``vocab_size`` (required),
      ``min_frequency``, ``special_tokens``).
    train_text: the train split.
    **kwargs: see ``kind``.
  """
  if kind == 'char':
    return CharTokenizer.from_text(train_text, **kwargs)
  if kind == 'byte':
    if kwargs:
      raise ValueError(f'byte tokenizer takes no options, got {kwargs}.')
    return ByteTokenizer()
  if kind == 'bpe':
    if 'vocab_size' not in kwargs:
      raise ValueError('bpe tokenizer needs vocab_size=..., e.g. 4096.')
    return BPETokenizer.train(train_text, **kwargs)
  raise ValueError(
    f'Unknown tokenizer kind {kind!r}; choose one of {TOKENIZER_KINDS}.'
  )


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Loads the tokenizer that ``Tokenizer.save(directory)`` wrote, any kind.

  The one loader of saved tokenizers: a run directory's ``tokenizer/``, a
  ``ddlm_tokenizer.json`` path or its folder.
  """
  path = paths.epath(directory)  # Local or a URI (gs://...).
  if path.is_dir():
    path = path / TOKENIZER_FILENAME
  if not path.is_file():
    raise FileNotFoundError(
      f'No tokenizer file {path}; save one with tokenizer.save(directory).'
    )
  try:
    config = json.loads(path.read_text(encoding='utf-8'))
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    from ddlm_jax.errors import CorruptFileError

    raise CorruptFileError(
      f'{path} is corrupt or truncated ({err}); delete {path.parent} to '
      'rebuild the tokenizer from the data, or restore the file.'
    ) from None
  if not isinstance(config, dict):
    config = {}
  kind = config.get('kind')
  if kind not in _KINDS:
    raise ValueError(
      f'{path} names tokenizer kind {kind!r}; known kinds: {SAVED_KINDS}.'
    )
  if config.get('format_version', _FORMAT_VERSION) > _FORMAT_VERSION:
    raise ValueError(
      f'{path} has format_version {config["format_version"]}, newer than '
      f'this code ({_FORMAT_VERSION}); upgrade ddlm_jax.'
    )
  return _KINDS[kind]._from_config(config)


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
  """A short hash of the tokenizer's saved JSON (ids depend on nothing else).

  Token caches are named by it, so a cache is never read with other ids.
  """
  blob = json.dumps(
    {'kind': tokenizer.kind, **tokenizer._config()}, sort_keys=True
  )
  return hashlib.sha256(blob.encode('utf-8')).hexdigest()[:16]
