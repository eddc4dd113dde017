"""docs/ARCHITECTURE.md names only things that exist.

Every backticked file path must exist; every backticked identifier that
looks like code (CamelCase, a call `name()`, or a dotted name) must be
defined somewhere in the project's sources (a class, function, method,
module or assignment). A page that drifts from the code fails here.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / 'docs' / 'ARCHITECTURE.md'
SOURCES = ('ddlm_jax', 'pallas_kernels', 'experiments', 'tests')
EXTERNAL = ('jax', 'flax', 'nnx', 'optax', 'orbax', 'grain', 'np', 'jnp')


def defined_names() -> set[str]:
  """Every class, function, assignment target and module name in SOURCES."""
  names = set()
  for package in SOURCES:
    for path in (ROOT / package).rglob('*.py'):
      names.update(path.relative_to(ROOT).with_suffix('').parts)
      for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(
          node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        ):
          names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
          targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target]
          )
          for target in targets:
            for sub in ast.walk(target):
              if isinstance(sub, ast.Name):
                names.add(sub.id)
              elif isinstance(sub, ast.Attribute):
                names.add(sub.attr)
  return names


def code_spans(text: str) -> list[str]:
  """Backticked spans outside fenced blocks."""
  text = re.sub(r'```.*?```', '', text, flags=re.S)
  return re.findall(r'`([^`\n]+)`', text)


def paths_and_names(spans):
  """(file paths, code identifiers) the spans name."""
  paths, names = set(), set()
  for span in spans:
    span = span.strip()
    if re.fullmatch(r'[\w./-]+\.(json|jsonl)', span):
      continue  # A run's output files (config.json, metrics.jsonl).
    if re.fullmatch(r'[\w./-]+\.(py|md|ipynb)', span):
      paths.add(span)
      continue
    head = re.match(r'@?([A-Za-z_][\w.]*)(\(|$)', span)
    if not head:
      continue
    ident, call = head.group(1), head.group(2) == '('
    if ident.split('.')[0] in EXTERNAL:
      continue  # jax.nn.dot_product_attention and the like.
    if '.' in ident:
      names.update(p for p in ident.split('.') if p)
    elif call or re.fullmatch(r'[A-Z][a-z]+[A-Z]\w*', ident):
      names.add(ident)
  return paths, names


def _exists(path: str) -> bool:
  """The path from the root, or a file anywhere in the project whose
  path ends with it (the page says `masked.py` inside its section)."""
  if (ROOT / path).exists():
    return True
  return any(
    str(found.relative_to(ROOT)).endswith(path)
    for base in (*SOURCES, 'docs')
    for found in (ROOT / base).rglob(pathlib.Path(path).name)
  )


def test_every_named_file_exists():
  paths, _ = paths_and_names(code_spans(DOC.read_text()))
  missing = sorted(p for p in paths if not _exists(p))
  assert not missing, f'ARCHITECTURE.md names missing files: {missing}'


def test_every_named_identifier_is_defined():
  _, names = paths_and_names(code_spans(DOC.read_text()))
  known = defined_names()
  missing = sorted(n for n in names if n not in known)
  assert not missing, f'ARCHITECTURE.md names undefined code: {missing}'


def test_the_checker_sees_a_missing_name():
  spans = code_spans('`NoSuchClassAnywhere` and `no_such_fn()` `x/y.py`')
  paths, names = paths_and_names(spans)
  assert paths == {'x/y.py'} and not _exists('x/y.py')
  assert {'NoSuchClassAnywhere', 'no_such_fn'} <= names
  assert not {'NoSuchClassAnywhere', 'no_such_fn'} & defined_names()
