"""text8: 100M characters of Wikipedia, 27 symbols, the standard split.

text8 (Mahoney) is the file ``text8`` inside ``text8.zip``
(http://mattmahoney.net/dc/text8.zip, 31 MB): 100,000,000 bytes of lower-case
letters ``a``-``z`` and the space. The standard split (D3PM, SEDD, MDLM, MD4)
is by position: the first 90M characters train, the next 5M validation, the
last 5M test. ``split_bounds`` computes the cuts as 90% / 95% of the length,
which is exactly 90M / 95M for the real file and lets tiny text8-format files
(tests, smoke presets) split the same way.

The tokenizer (``Text8Tokenizer``, defined with the other kinds in
``ddlm_jax.data.tokenizers`` so that ``load_tokenizer`` reloads it) has
exactly the 27 symbols, ``a``-``z`` -> 0-25 and space -> 26 (MD4's ids),
with no UNK: any other byte in the archive is an error. Each split is held
in memory as uint8 (100 MB) and served as a packed stream without framing
tokens (text8 has no documents).
"""

from __future__ import annotations

import os
import pathlib
import zipfile

import numpy as np

from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.pretrained import DataUnavailableError
from ddlm_jax.data.settings import DataConfig
from ddlm_jax.data.sources import PackedSplit, Source
from ddlm_jax.data.tokenizers import Text8Tokenizer

ALPHABET = tok_lib.TEXT8_ALPHABET
URL = 'http://mattmahoney.net/dc/text8.zip'
STANDARD_LENGTH = 100_000_000
ARCHIVE_MEMBER = 'text8'


def split_bounds(length: int) -> tuple[int, int]:
  """(end of train, end of validation): 90% and 95% of ``length``."""
  return length * 9 // 10, length * 19 // 20


def archive_path(data_dir: str) -> pathlib.Path:
  """``data_dir`` itself if it is a file, else ``data_dir/text8.zip``."""
  path = pathlib.Path(os.path.expanduser(data_dir or '.'))
  return path if path.is_file() else path / 'text8.zip'


def download_hint(data_dir: str) -> str:
  folder = os.path.expanduser(data_dir or '~/ddlm_data/text8')
  if folder.endswith('.zip'):
    folder = os.path.dirname(folder) or '.'
  return (
    f'mkdir -p {folder} && wget -O {folder}/text8.zip {URL}\n'
    f'  (or: curl -L -o {folder}/text8.zip {URL}), then pass '
    f'--config.data.data_dir={folder}'
  )


def read_text8(data_dir: str) -> np.ndarray:
  """All of text8 as uint8 ids, read from ``text8.zip`` (module docstring).

  Raises:
    DataUnavailableError: no archive; the message gives the download command.
    ValueError: the archive lacks the ``text8`` member or has other bytes.
  """
  path = archive_path(data_dir)
  if not path.is_file():
    raise DataUnavailableError(
      f'text8 archive not found at {path}. Download it with:\n  '
      + download_hint(data_dir)
    )
  with zipfile.ZipFile(path) as archive:
    names = archive.namelist()
    if ARCHIVE_MEMBER not in names:
      raise ValueError(
        f'{path} has no member {ARCHIVE_MEMBER!r} (has {names[:5]}); it is '
        f'not the text8 archive from {URL}.'
      )
    data = archive.read(ARCHIVE_MEMBER)
  return Text8Tokenizer().encode_bytes(data)


def text8_splits(ids: np.ndarray) -> dict[str, np.ndarray]:
  """train/validation/test views of the text8 ids (90% / 5% / 5%)."""
  a, b = split_bounds(ids.size)
  return {'train': ids[:a], 'validation': ids[a:b], 'test': ids[b:]}


def text8_source(
  cfg: DataConfig, tokenizer: tok_lib.Tokenizer | None = None
) -> Source:
  """The text8 Source of a run's data settings (reads ``data_dir``)."""
  if tokenizer is not None and not isinstance(tokenizer, Text8Tokenizer):
    raise ValueError(
      f'text8 needs its 27-symbol tokenizer, got {tokenizer!r} (from the run '
      "directory's tokenizer/); use a fresh workdir."
    )
  cache: dict[str, dict[str, np.ndarray]] = {}

  def factory(name):
    def build():
      if 'splits' not in cache:
        ids = read_text8(cfg.data_dir)
        if ids.size != STANDARD_LENGTH:
          print(
            f'Note: text8 file has {ids.size} characters, not '
            f'{STANDARD_LENGTH}; splitting it 90/5/5 by position.',
            flush=True,
          )
        cache['splits'] = text8_splits(ids)
      return PackedSplit(cache['splits'][name])

    return build

  return Source(
    'text8',
    Text8Tokenizer(),
    {name: factory(name) for name in ('train', 'validation', 'test')},
    notes='27 symbols; first 90M / next 5M / last 5M characters.',
  )


__all__ = [
  'ALPHABET',
  'Text8Tokenizer',
  'archive_path',
  'read_text8',
  'split_bounds',
  'text8_source',
  'text8_splits',
]
