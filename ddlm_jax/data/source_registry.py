"""The dataset sources by ``config.data.corpus`` name.

The dataset modules (``text8``, ``lm1b``, ``openwebtext``) build on the
shared base ``ddlm_jax.data.sources``; this module is the one place that
knows all of them, so no module of the base imports a dataset module.
"""

from __future__ import annotations

from collections.abc import Callable

from ddlm_jax.data import lm1b, openwebtext, sft_pairs, text8
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.sources import Source

BUILDERS: dict[str, Callable[..., Source]] = {
  'text8': text8.text8_source,
  'lm1b': lm1b.lm1b_source,
  'openwebtext': openwebtext.openwebtext_source,
  'sft_arithmetic': sft_pairs.arithmetic_source,
}
CORPORA = tuple(BUILDERS)


def build_source(cfg, tokenizer: tok_lib.Tokenizer | None = None) -> Source:
  """The Source of ``cfg.corpus`` ('text8', 'lm1b' or 'openwebtext').

  Args:
    cfg: the ``config.data`` block.
    tokenizer: reuse this tokenizer (a resumed run's saved one) instead of
      loading or building it.
  """
  if cfg.corpus not in BUILDERS:
    raise ValueError(f'corpus {cfg.corpus!r} is not a source; have {CORPORA}.')
  return BUILDERS[cfg.corpus](cfg, tokenizer)


__all__ = ['BUILDERS', 'CORPORA', 'build_source']
