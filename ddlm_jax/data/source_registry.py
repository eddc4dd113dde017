"""Every corpus's ``Source`` by its ``config.data.corpus`` name.

The text corpora (``text_source``) and the dataset modules (``text8``,
``lm1b``, ``openwebtext``) build on the shared base
``ddlm_jax.data.sources``; this module is the one place that knows all of
them, so no module of the base imports a dataset module, and a run reads
every corpus through one batch path (``Source``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from ddlm_jax.data import lm1b, openwebtext, sft_pairs, text8, text_source
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.settings import DataConfig
from ddlm_jax.data.sources import Source

# The dataset sources: large corpora read lazily, framed by config.data.wrap.
DATASETS: dict[str, Callable[..., Source]] = {
  'text8': text8.text8_source,
  'lm1b': lm1b.lm1b_source,
  'openwebtext': openwebtext.openwebtext_source,
}
CORPORA = tuple(DATASETS)
TEXT_CORPORA = text_source.TEXT_CORPORA
# Prompt -> response pair sets: one pair per row, framed by the pair itself.
PAIR_SETS: dict[str, Callable[..., Source]] = {
  'sft_arithmetic': sft_pairs.arithmetic_source,
}
BUILDERS: dict[str, Callable[..., Source]] = {
  **dict.fromkeys(TEXT_CORPORA, text_source.text_source),
  **DATASETS,
  **PAIR_SETS,
}


def build_source(
  cfg: DataConfig, tokenizer: tok_lib.Tokenizer | None = None
) -> Source:
  """The Source of ``cfg.corpus`` (a text corpus or a dataset).

  Args:
    cfg: the run's typed data settings.
    tokenizer: reuse this tokenizer (a resumed run's saved one) instead of
      loading or building it.
  """
  if not isinstance(cfg, DataConfig):
    raise TypeError(
      f'build_source takes a DataConfig, got {type(cfg).__name__}; build it '
      'with DataConfig.from_dict(block).'
    )
  if cfg.corpus not in BUILDERS:
    close = difflib.get_close_matches(str(cfg.corpus), list(BUILDERS), n=1)
    hint = f' (did you mean {close[0]!r}?)' if close else ''
    raise ValueError(
      f'corpus {cfg.corpus!r} is not a source{hint}; have {tuple(BUILDERS)}.'
    )
  return BUILDERS[cfg.corpus](cfg, tokenizer)


__all__ = [
  'BUILDERS',
  'CORPORA',
  'DATASETS',
  'PAIR_SETS',
  'TEXT_CORPORA',
  'build_source',
]
