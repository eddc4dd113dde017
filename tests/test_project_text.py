"""The project speaks of itself: no development labels or outside paths.

README, docs/*.md and the Python sources of the library, the kernels and
the experiments (docstrings and comments included) must not name
development periods ('session 9'), issue-tracker numbers ('issue 18',
'issues 13, 14') or files outside the repository ('../shared',
'REFERENCE section 2', absolute scratch paths): a user of the repository
has none of them. Dates and commits say when something was measured.
"""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERNS = {
  'development label': re.compile(r'\b[Ss]essions?[- ]\d+'),
  'issue number': re.compile(r'\b[Ii]ssues?[- ]#?\d+'),
  'path outside the repository': re.compile(
    r'\.\./shared|\bREFERENCE(?:\.md)? (?:section|sec\.|§)|\bREFERENCE\.md'
    r'|/work/|/tmp/repro'
  ),
}


def _files():
  out = [os.path.join(ROOT, 'README.md')]
  docs = os.path.join(ROOT, 'docs')
  out += [os.path.join(docs, n) for n in os.listdir(docs) if n.endswith('.md')]
  for top in ('ddlm_jax', 'experiments', 'pallas_kernels', 'tests'):
    for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
      out += [os.path.join(dirpath, n) for n in names if n.endswith('.py')]
  # This file spells out what the guard catches.
  return sorted(f for f in out if f != os.path.abspath(__file__))


def find_labels(text: str) -> list[tuple[int, str, str]]:
  """(line number, kind, matched text) for every forbidden phrase."""
  hits = []
  for number, line in enumerate(text.splitlines(), 1):
    for kind, pattern in PATTERNS.items():
      for m in pattern.finditer(line):
        hits.append((number, kind, m.group(0)))
  return hits


def test_the_guard_catches_each_kind():
  text = (
    'measured in session 9\nsee issues 13, 14\nas issue 18 asks\n'
    'REFERENCE section 2 says\n../shared/DESIGN.md\nthe session-10 host\n'
  )
  kinds = [k for _, k, _ in find_labels(text)]
  assert kinds.count('development label') == 2
  assert kinds.count('issue number') == 2
  assert kinds.count('path outside the repository') == 2
  assert not find_labels('measured on 2026-12-02 at commit 9e70170\n')


@pytest.mark.parametrize(
  'path', _files(), ids=lambda p: os.path.relpath(p, ROOT)
)
def test_no_development_labels_or_outside_paths(path):
  with open(path, encoding='utf-8') as f:
    hits = find_labels(f.read())
  where = os.path.relpath(path, ROOT)
  assert not hits, '\n'.join(f'{where}:{n}: {k}: {t!r}' for n, k, t in hits)
