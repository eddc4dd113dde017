"""What can be run: `--list` (configs, presets) and `--describe=CONFIG`.

`python -m experiments.run --list` prints one line per config file under
experiments/configs: its name, the argument it takes after the colon
(presets, variants) and the first line of its docstring.
`--describe=CONFIG[:ARG]` prints every key of that config with its value
and the comment that explains it, read from the source of
`common.base_config` and of the config file (a comment on the key's line,
or the comment block right above it); keys the config sets differently
from the base are marked `*`.

Both run before absl parses flags (so --config and --workdir are not
required with them); `handle(argv)` is the hook.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import pathlib
import pkgutil
import re
import sys
import textwrap
import tokenize

CONFIG_DIR = pathlib.Path(__file__).resolve().parent / 'configs'
_NOT_CONFIGS = ('common',)
# A probe no config accepts: its error message states the argument form.
_PROBE = '?'


def config_names() -> list[str]:
  """Config modules under experiments/configs that define get_config."""
  names = []
  for info in pkgutil.iter_modules([str(CONFIG_DIR)]):
    if info.name.startswith('_') or info.name in _NOT_CONFIGS:
      continue
    source = (CONFIG_DIR / f'{info.name}.py').read_text()
    if re.search(r'^def get_config\(', source, re.M):
      names.append(info.name)
  return sorted(names)


def _module(name: str):
  return importlib.import_module(f'experiments.configs.{name}')


def argument_form(module) -> str:
  """The argument a config takes after ':' (e.g. 'BLOCK[,smoke]').

  Read from the config's own one-line error for an argument nobody uses,
  so the form shown is the one the parser enforces.
  """
  try:
    module.get_config(_PROBE)
  except ValueError as err:
    message = str(err)
  else:
    return ''
  expected = re.search(r'expected (.+?)(?:, e\.g\. |\.$|$)', message)
  if expected:
    return expected.group(1)
  choices = re.search(r"unknown (\w+) '\?'; choose one of \((.*)\)", message)
  if not choices:
    return ''
  what, values = choices.groups()
  values = [v.strip(" '") for v in values.split(',') if v.strip(" '")]
  if what == 'preset':
    return f'[{"|".join(values)}]'
  presets = [p for p in getattr(module, 'PRESETS', ()) if p]
  tail = f'[,{"|".join(presets)}]' if presets else ''
  return f'{what.upper()}{tail} with {what.upper()} one of {tuple(values)}'


def summary_line(module) -> str:
  doc = (module.__doc__ or '').strip()
  return doc.splitlines()[0] if doc else ''


def list_configs() -> str:
  """One line per config: name, its argument after ':', what it is."""
  rows = []
  for name in config_names():
    module = _module(name)
    rows.append((name, argument_form(module), summary_line(module)))
  width = max(len(n) for n, _, _ in rows)
  lines = [
    'Configs (--config=experiments/configs/NAME.py[:ARG]; '
    '--describe=NAME for its keys):'
  ]
  for name, form, summary in rows:
    shown = f':{form}' if form else ''
    lines.append(f'  {name:<{width}}  {shown}')
    if summary:
      lines[-1] += f'\n  {"":<{width}}    {summary}'
  return '\n'.join(lines)


# ------------------------------------------------------------- describe


def _dotted(node) -> str | None:
  """'data.corpus' for the target `c.data.corpus` (None otherwise)."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name) and node.id == 'c' and parts:
    return '.'.join(reversed(parts))
  return None


def key_comments(source: str) -> dict[str, str]:
  """{dotted key: comment} for the `c.a.b = ...` lines of a config source.

  A key's comment is the one on its own line, else the block of comment
  lines right above it; a block above a group of keys with no comments
  of their own explains the first of them only.
  """
  comments: dict[int, str] = {}
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = tok.string.lstrip('#').strip()
  lines = source.splitlines()
  found = {}
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, (ast.Assign, ast.AnnAssign)):
      continue
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
      key = _dotted(target)
      if key is None:
        continue
      own = [
        comments[n]
        for n in range(node.lineno, node.end_lineno + 1)
        if n in comments
      ]
      above, n = [], node.lineno - 1
      while n >= 1 and n in comments and lines[n - 1].lstrip().startswith('#'):
        above.insert(0, comments[n])
        n -= 1
      text = ' '.join(above + own)
      if text:
        found[key] = text
  return found


def _flat(config, prefix='') -> dict:
  out = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if hasattr(value, 'items') and not isinstance(value, dict):
      sub = _flat(value, name + '.')
      out.update(sub if sub else {name: {}})
    else:
      out[name] = value
  return out


def describe(spec: str) -> str:
  """Every key of config `spec` ('quickstart' or 'bd3_quickstart:8,smoke')
  with its value and the comment that explains it."""
  from experiments.configs import common

  path, _, arg = spec.partition(':')
  name = pathlib.Path(path).name.removesuffix('.py')
  if name not in config_names():
    raise ValueError(
      f'--describe={spec}: no config {name!r}; choose one of '
      f'{", ".join(config_names())} (--list shows them).'
    )
  module = _module(name)
  config = module.get_config(arg) if arg else module.get_config()
  # The base's comments explain every key; the config file's own explain
  # the values it changes.
  comments = key_comments(
    textwrap.dedent(inspect.getsource(common.base_config))
  )
  comments.update(key_comments((CONFIG_DIR / f'{name}.py').read_text()))
  # Language-model configs start from base_config; the other kinds have
  # their own defaults (the config without an argument).
  if config.get('kind', 'lm') == 'lm':
    base = _flat(common.base_config())
    against = 'base_config in experiments/configs/common.py'
  else:
    base = _flat(module.get_config())
    against = f"{name}'s default"
  flat = _flat(config)
  # Top-level keys first, then each block's keys.
  rows = {k: flat[k] for k in sorted(flat, key=lambda k: ('.' in k, k))}
  lines = [
    f'{name}{":" + arg if arg else ""}: {summary_line(module)}',
    f'(* = differs from {against}; set any key with --config.KEY=VALUE)',
  ]
  width = min(max(len(f'{k} = {v!r}') for k, v in rows.items()), 40)
  block = None
  for key, value in rows.items():
    head = key.split('.')[0] if '.' in key else ''
    if head != block:
      block = head
      if head:
        about = comments.get(head, '')
        lines.append(f'[{head}]' + (f'  # {about}' if about else ''))
    mark = '*' if key not in base or base[key] != value else ' '
    shown = f'{key} = {value!r}'
    comment = comments.get(key, '')
    line = f'{mark} {shown:<{width}}'
    lines.append(f'{line}  # {comment}' if comment else line.rstrip())
  return '\n'.join(lines)


# ----------------------------------------------------------------- hook


def _wanted(argv) -> tuple[bool, str | None]:
  listing, spec = False, None
  for i, arg in enumerate(argv[1:], 1):
    if arg in ('--list', '-list'):
      listing = True
    elif arg.startswith(('--describe=', '-describe=')):
      spec = arg.partition('=')[2]
    elif arg in ('--describe', '-describe'):
      spec = argv[i + 1] if i + 1 < len(argv) else ''
  return listing, spec


def define_flags(module_name: str = '__main__', flag_values=None):
  """--list and --describe, shown by --help of `module_name`'s flags.

  handle() acts on them before absl parses anything; absl lists the main
  module's flags under its sys.argv[0] name.
  """
  from absl import flags

  fv = flags.FLAGS if flag_values is None else flag_values
  if module_name == '__main__':
    module_name = sys.argv[0]
  flags.DEFINE_bool(
    'list',
    False,
    'List the configs and their presets, then exit.',
    flag_values=fv,
    module_name=module_name,
  )
  flags.DEFINE_string(
    'describe',
    None,
    'CONFIG[:ARG]: print every key of a config with its value and '
    'explaining comment, then exit.',
    flag_values=fv,
    module_name=module_name,
  )


def handle(argv) -> None:
  """Prints --list / --describe output and exits if asked; else returns."""
  listing, spec = _wanted(argv)
  if not listing and spec is None:
    return
  try:
    print(list_configs() if listing else describe(spec))
  except ValueError as err:
    print(f'error: {err}', file=sys.stderr)
    sys.exit(2)
  sys.exit(0)


__all__ = [
  'argument_form',
  'config_names',
  'define_flags',
  'describe',
  'handle',
  'key_comments',
  'list_configs',
]
