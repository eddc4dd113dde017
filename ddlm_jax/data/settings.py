"""The typed `config.data` block: what every corpus builder reads.

A run's data settings arrive as one frozen `DataConfig`, built once from
the config's `data` block (`DataConfig.from_dict`), so the corpus builders
(`ddlm_jax.data.text_source`, `text8`, `lm1b`, `openwebtext`) read typed
fields instead of probing a raw mapping. A key the block does not take is
refused naming the closest one; a key a run saved before it existed takes
its default, so old run directories still load.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

# Packed rows' framing, split kinds and OpenWebText's held-out rule; the
# modules that use them (`sources`, `openwebtext`) read them from here.
WRAPS = ('bos_eos', 'eos', 'none')
PACKINGS = ('packed', 'padded')
OWT_SPLITS = ('mdlm', 'md4')


@dataclasses.dataclass(frozen=True)
class TextFiles:
  """`config.data.files`: the user's own text per split ('' = absent)."""

  train: str = ''
  validation: str = ''
  test: str = ''

  def given(self) -> dict[str, str]:
    """The splits that name a file (what `corpus.text_file_splits` takes)."""
    return {k: v for k, v in dataclasses.asdict(self).items() if v}


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """`config.data`: the corpus, its tokenizer and how rows are cut.

  Attributes:
    corpus: text corpora 'shakespeare' | 'text_files'; dataset sources
      'text8' | 'lm1b' | 'openwebtext' (`ddlm_jax.data.source_registry`).
    files: the text files of corpus 'text_files'.
    tokenizer: text corpora's tokenizer: 'char' | 'byte' | 'bpe'.
    bpe_vocab_size: vocabulary of a fitted 'bpe' tokenizer.
    seq_len: tokens per row.
    data_dir: the dataset's folder (text8.zip; TFDS data_dir; OWT Parquet).
    cache_dir: where packed token streams are built ('' = the default).
    hf_tokenizer: lm1b/openwebtext tokenizer ('' = the dataset's own;
      'test:*' trains a test-only stand-in on the local data).
    test_tokenizer_vocab: vocabulary of that stand-in.
    packing: 'packed' | 'padded' (lm1b; adds a loss mask).
    wrap: packed rows' framing: 'bos_eos' (MDLM) | 'eos' (md4) | 'none'.
    detokenize: detokenize LM1B before tokenizing (MDLM's recipe).
    hf_dataset: OpenWebText's Hub dataset.
    owt_split: 'mdlm' (last documents held out) | 'md4' (a share of rows).
    owt_validation_docs: documents held out by the 'mdlm' split.
    owt_validation_fraction: rows held out by the 'md4' split.
    num_threads: grain reader threads.
    prep_processes: worker processes that tokenize a token cache (the
      cache's bytes do not depend on it).
    sft_levels: operations per problem of the 'sft_arithmetic' pairs.
    sft_pairs: pairs per split of 'sft_arithmetic' (None = its defaults).
  """

  corpus: str = 'shakespeare'
  files: TextFiles = TextFiles()
  tokenizer: str = 'char'
  bpe_vocab_size: int = 4096
  seq_len: int = 128
  data_dir: str = ''
  cache_dir: str = ''
  hf_tokenizer: str = ''
  test_tokenizer_vocab: int = 512
  packing: str = 'packed'
  wrap: str = 'bos_eos'
  detokenize: bool = False
  hf_dataset: str = 'Skylion007/openwebtext'
  owt_split: str = 'mdlm'
  owt_validation_docs: int = 100_000
  owt_validation_fraction: float = 0.02
  num_threads: int = 1
  prep_processes: int = 1
  sft_levels: tuple[int, ...] = (1, 2, 3)
  sft_pairs: Mapping[str, int] | None = None

  def __post_init__(self):
    # Refused here, before a tokenizer is fitted or downloaded.
    for key, value, allowed in (
      ('wrap', self.wrap, WRAPS),
      ('packing', self.packing, PACKINGS),
      ('owt_split', self.owt_split, OWT_SPLITS),
    ):
      if value not in allowed:
        raise ValueError(f'data.{key}={value!r}; choose one of {allowed}.')
    for key in ('seq_len', 'num_threads', 'bpe_vocab_size', 'prep_processes'):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
          f'data.{key}={value!r} must be an integer >= 1; set '
          f'--config.data.{key} to one.'
        )

  @classmethod
  def from_dict(cls, block: Mapping[str, Any]) -> DataConfig:
    """The typed block of a plain `config.data` mapping (nested dicts).

    Raises:
      ValueError: a key the block does not take, naming the closest one.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    values = dict(block)
    for key in values:
      if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f'; did you mean data.{close[0]}?' if close else ''
        raise ValueError(
          f'config.data.{key} is not a data setting{hint} '
          f'(the block takes {names}).'
        )
    files = values.get('files')
    if files is not None:
      file_names = [f.name for f in dataclasses.fields(TextFiles)]
      bad = sorted(set(dict(files)) - set(file_names))
      if bad:
        raise ValueError(
          f'config.data.files.{bad[0]} is not a split; the block takes '
          f'{file_names}.'
        )
      values['files'] = TextFiles(**dict(files))
    return cls(**values)


__all__ = ['OWT_SPLITS', 'PACKINGS', 'WRAPS', 'DataConfig', 'TextFiles']
