"""The text corpora ('shakespeare', 'text_files') as a dataset ``Source``.

A text corpus is small enough to read and tokenize whole: its splits are
read by ``ddlm_jax.data.corpus``, the tokenizer is fitted on the train text
(or a run's saved one is reused), and each non-empty split becomes one
unframed ``PackedSplit``. So it serves batches through the same
``Source`` methods as text8, LM1B and OpenWebText, and the rows are the
ones ``pipeline.train_iterator`` and ``pipeline.eval_batches`` cut from
the encoded split.
"""

from __future__ import annotations

import numpy as np

from ddlm_jax.data import corpus
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.pipeline import PackedSplit
from ddlm_jax.data.settings import DataConfig
from ddlm_jax.data.sources import Source

TEXT_CORPORA = ('shakespeare', 'text_files')


def fit_tokenizer(cfg: DataConfig, train_text: str) -> tok_lib.Tokenizer:
  """The corpus's tokenizer (`cfg.tokenizer`) fitted on the train text."""
  kwargs = {}
  if cfg.tokenizer == 'bpe':
    kwargs['vocab_size'] = cfg.bpe_vocab_size
  return tok_lib.build_tokenizer(cfg.tokenizer, train_text, **kwargs)


def text_source(
  cfg: DataConfig, tokenizer: tok_lib.Tokenizer | None = None
) -> Source:
  """The Source of a text corpus: its texts read and encoded now.

  Args:
    cfg: the run's data settings (corpus 'shakespeare' or 'text_files').
    tokenizer: reuse this tokenizer (a resumed run's saved one) instead of
      fitting one on the train text.
  """
  kwargs = cfg.files.given() if cfg.corpus == 'text_files' else {}
  texts = corpus.load_text_splits(cfg.corpus, **kwargs)
  tok = (
    tokenizer if tokenizer is not None else fit_tokenizer(cfg, texts['train'])
  )
  ids = {
    name: np.asarray(tok.encode(text), np.int32)
    for name, text in texts.items()
    if text
  }
  return Source(
    cfg.corpus,
    tok,
    {name: (lambda s=stream: PackedSplit(s)) for name, stream in ids.items()},
    notes='whole text encoded in memory; unframed rows.',
  )


__all__ = ['TEXT_CORPORA', 'fit_tokenizer', 'text_source']
