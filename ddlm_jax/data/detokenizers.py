"""Detokenizers of the zero-shot suite: undo each corpus's word tokenization.

PTB, WikiText and LM1B ship pre-tokenized text ("it 's" , "3 @.@ 5", "( a )").
The MDLM/SEDD zero-shot numbers tokenize the text with GPT-2 AFTER turning it
back into ordinary prose with the rules below (the same rules as MDLM's
``dataloader.py``, which in turn follow GPT-2/Megatron-LM), so reproducing
them needs the same rules in the same order. Each function is pure
``str -> str``; the rules are data (``(old, new)`` literal replacements and
``(pattern, replacement)`` regexes) applied in sequence.

* ``wikitext``: ``@-@``/``@,@``/``@.@`` number separators, spaces around
  punctuation and inside brackets/quotes, ``= = =`` headings,
  `` N `` -> `` 1 ``.
* ``ptb``: contractions, ``\\/`` -> ``/``, `` N `` -> `` 1 `` (repeated, as
  MDLM does, to catch overlapping matches), ``<unk>`` -> ``?``.
* ``lm1b``: URLs, contractions, sentence punctuation, quotes and brackets,
  currency signs.
* ``lambada``: curly double quotes to straight ones; a leading newline.
* ``scientific_papers`` (PubMed, ArXiv): ``wikitext`` then ``lm1b``.
* AG News has no detokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

# A step is (old, new) for a literal replacement, or ('re', pattern, repl).
Step = tuple[str, str] | tuple[str, str, str]


def _apply(text: str, steps: Sequence[Step]) -> str:
  for step in steps:
    if len(step) == 3:
      text = re.sub(step[1], step[2], text)
    else:
      text = text.replace(step[0], step[1])
  return text


_WIKITEXT: tuple[Step, ...] = (
  # Contractions.
  ("s '", "s'"),
  ('re', r"/' [0-9]/", r"/'[0-9]/"),
  # Number separators.
  (' @-@ ', '-'),
  (' @,@ ', ','),
  (' @.@ ', '.'),
  # Punctuation.
  (' : ', ': '),
  (' ; ', '; '),
  (' . ', '. '),
  (' ! ', '! '),
  (' ? ', '? '),
  (' , ', ', '),
  # Brackets and quotes.
  ('re', r'\(\s*([^\)]*?)\s*\)', r'(\1)'),
  ('re', r'\[\s*([^\]]*?)\s*\]', r'[\1]'),
  ('re', r'{\s*([^}]*?)\s*}', r'{\1}'),
  ('re', r'\"\s*([^\"]*?)\s*\"', r'"\1"'),
  ('re', r"'\s*([^']*?)\s*'", r"'\1'"),
  # Headings and the rest.
  ('= = = =', '===='),
  ('= = =', '==='),
  ('= =', '=='),
  (' \u00b0 ', '\u00b0'),
  (' \n', '\n'),
  ('\n ', '\n'),
  (' N ', ' 1 '),
  (" 's", "'s"),
)


def wikitext(text: str) -> str:
  """WikiText-2/103 raw text to prose."""
  return _apply(text, _WIKITEXT)


_PTB_HEAD: tuple[Step, ...] = (
  (" 's", "'s"),
  ("s ' ", "s' "),
  (" n't", "n't"),
  (' \n ', '\n'),
  ('\\/', '/'),
)
_PTB_TAIL: tuple[Step, ...] = (('$ 1', '$1'), ('# 1', '#1'), ('<unk>', '?'))


def ptb(text: str) -> str:
  """Penn Treebank (``ptb_text_only``) sentences to prose."""
  text = _apply(text, _PTB_HEAD)
  for _ in range(10):
    text = text.replace(' N ', ' 1 ')
  return _apply(text, _PTB_TAIL)


_LM1B: tuple[Step, ...] = (
  ('http : / / ', 'http://'),
  ('https : / / ', 'https://'),
  ('re', r' \'(\w+)', r"'\1"),
  ('re', r' (\w+) \. ', r' \1. '),
  ('re', r' (\w+) \.$', r' \1.'),
  (' ? ', '? '),
  ('re', r' \?$', '?'),
  (' ! ', '! '),
  ('re', r' \!$', '!'),
  (' , ', ', '),
  (' : ', ': '),
  (' ; ', '; '),
  (' / ', '/'),
  ('re', r'\" ([^\"]+) \"', r'"\1"'),
  ('re', r'\' ([^\']+) \'', r"'\1'"),
  ('re', r'\( ([^\(\)]+) \)', r'(\1)'),
  ('re', r'\[ ([^\[\]]+) \]', r'[\1]'),
  ('$ ', '$'),
  ('\u00a3 ', '\u00a3'),
)


def lm1b(text: str) -> str:
  """One Billion Word benchmark sentences to prose."""
  return _apply(text, _LM1B)


def lambada(text: str) -> str:
  """LAMBADA passages: straight quotes, one leading newline."""
  text = text.replace('\u201c', '"').replace('\u201d', '"')
  return '\n' + text.strip()


def scientific_papers(text: str) -> str:
  """PubMed / ArXiv articles: the WikiText rules, then the LM1B rules."""
  return lm1b(wikitext(text))


DETOKENIZERS: dict[str, Callable[[str], str]] = {
  'wikitext': wikitext,
  'ptb': ptb,
  'lm1b': lm1b,
  'lambada': lambada,
  'scientific_papers': scientific_papers,
}


def get_detokenizer(name: str) -> Callable[[str], str] | None:
  """The detokenizer called ``name``; '' or 'none' gives None."""
  if name in ('', 'none'):
    return None
  if name not in DETOKENIZERS:
    raise ValueError(
      f'Unknown detokenizer {name!r}; choose one of {sorted(DETOKENIZERS)}.'
    )
  return DETOKENIZERS[name]


__all__ = [
  'DETOKENIZERS',
  'get_detokenizer',
  'lambada',
  'lm1b',
  'ptb',
  'scientific_papers',
  'wikitext',
]
