"""Data: text corpora, tokenizers and the grain batch pipeline.

``corpus`` gives train/validation/test texts (Shakespeare split by whole
play, or the user's own files), ``tokenizers`` turns text into int32 ids
(char, byte, HF BPE/WordPiece, text8; saved as JSON in the run directory,
and ``load_tokenizer`` reloads any kind) and ``pipeline`` turns ids into
checkpointable training batches and deterministic evaluation batches.
Every corpus, the text ones (``text_source``) and the datasets (text8,
LM1B, OpenWebText), is a ``sources.Source`` named in ``source_registry``,
built from the typed ``settings.DataConfig``.
Importing this package reads no files.
"""

from ddlm_jax.data.corpus import (
  INSTALL_HINT,
  CorpusNotFoundError,
  load_text_splits,
  shakespeare_splits,
)
from ddlm_jax.data.pipeline import eval_batches, train_iterator
from ddlm_jax.data.tokenizers import (
  BPETokenizer,
  ByteTokenizer,
  CharTokenizer,
  Tokenizer,
  build_tokenizer,
  load_tokenizer,
)

__all__ = [
  'INSTALL_HINT',
  'BPETokenizer',
  'ByteTokenizer',
  'CharTokenizer',
  'CorpusNotFoundError',
  'Tokenizer',
  'build_tokenizer',
  'eval_batches',
  'load_text_splits',
  'load_tokenizer',
  'shakespeare_splits',
  'train_iterator',
]
