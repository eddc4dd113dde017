"""Import structure: no cycles, and the packages depend one way only.

Import cycles only work while every module in them defers its import to a
function or reads names late, so one moved line breaks them; they also
hide which layer owns what. The scan reads every .py file's AST, so it
sees function-level imports too, which a runtime check of sys.modules
would miss. `import a.b` and `from a import b` (b a submodule) are edges
to module a.b; `import a` or `from a import name` (name not a module) is
an edge to a/__init__.py. Parent packages that Python initialises on the
way are not edges: a package's __init__ re-exporting its submodules would
otherwise make every sibling import a cycle.
"""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ('ddlm_jax', 'pallas_kernels')


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = list(path.relative_to(root).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts.pop()
  return '.'.join(parts)


def scan(root: pathlib.Path, packages=PACKAGES):
  """Module name -> (path, is_package) for every .py file under packages."""
  modules = {}
  for package in packages:
    for path in sorted((root / package).rglob('*.py')):
      modules[_module_name(path, root)] = (path, path.name == '__init__.py')
  return modules


def _resolve(name: str, modules) -> str:
  """The longest prefix of dotted `name` that is a scanned module."""
  parts = name.split('.')
  while parts and '.'.join(parts) not in modules:
    parts.pop()
  return '.'.join(parts) if parts else name


def imports_of(module: str, path: pathlib.Path, is_package: bool, modules):
  """[(imported module, line)] for every import statement in the file."""
  tree = ast.parse(path.read_text(), filename=str(path))
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(_resolve(a.name, modules), node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        package = module.split('.') if is_package else module.split('.')[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = '.'.join(package + ([node.module] if node.module else []))
      for alias in node.names:
        sub = f'{base}.{alias.name}'
        target = sub if sub in modules else _resolve(base, modules)
        out.append((target, node.lineno))
  return out


def import_graph(root: pathlib.Path = ROOT, packages=PACKAGES):
  """(graph, lines, raw, modules) of the scanned packages.

  graph: module -> the scanned modules it imports; lines: (a, b) -> lines
  where a imports b; raw: module -> every (import, line), scanned or not.
  """
  modules = scan(root, packages)
  graph = {m: set() for m in modules}
  lines, raw = collections.defaultdict(list), {}
  for module, (path, is_package) in modules.items():
    raw[module] = imports_of(module, path, is_package, modules)
    for target, line in raw[module]:
      if target in modules and target != module:
        graph[module].add(target)
        lines[module, target].append(line)
  return graph, lines, raw, modules


def _strongly_connected(graph):
  """Tarjan's components, each a sorted list; iterative, so no recursion."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph.get(child, ())))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        out.append(sorted(component))
  return out


def _shortest_path(graph, src, dst, within):
  """Shortest path src -> ... -> dst inside `within` (BFS)."""
  parent = {src: None}
  queue = collections.deque([src])
  while queue:
    node = queue.popleft()
    if node == dst:
      path = [node]
      while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
      return path[::-1]
    for child in sorted(graph.get(node, ())):
      if child in within and child not in parent:
        parent[child] = node
        queue.append(child)
  return None


def find_cycles(graph):
  """Readable cycles [a, b, ..., a], together using every cyclic edge.

  Per strongly connected component, each edge a -> b not yet shown gets
  the shortest cycle a -> b -> ... -> a, so every import that must go to
  break the component appears in some cycle.
  """
  cycles = []
  for component in _strongly_connected(graph):
    members = set(component)
    covered = set()
    for a in component:
      for b in sorted(graph.get(a, ())):
        if b not in members or (a, b) in covered:
          continue
        cycle = [a] + _shortest_path(graph, b, a, members)
        covered.update(zip(cycle, cycle[1:]))
        cycles.append(cycle)
  return cycles


def forbidden_imports(raw, modules, root=ROOT, rules=None):
  """'path:line imports X' for each import a package must not make."""
  rules = rules or {'ddlm_jax': 'experiments', 'pallas_kernels': 'ddlm_jax'}
  bad = []
  for module, found in raw.items():
    banned = rules.get(module.split('.')[0])
    for target, line in found:
      if banned and (target == banned or target.startswith(banned + '.')):
        path = modules[module][0].relative_to(root)
        bad.append(f'{path}:{line} imports {target}')
  return bad


def _describe(cycle, lines, modules):
  text = ' -> '.join(cycle)
  for a, b in zip(cycle, cycle[1:]):
    path = modules[a][0].relative_to(ROOT)
    where = ', '.join(str(n) for n in sorted(set(lines[a, b])))
    text += f'\n    {path}:{where} imports {b}'
  return text


def test_cycle_finder_finds_a_planted_cycle():
  graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a', 'd'}, 'd': set(), 'e': {'a'}}
  assert find_cycles(graph) == [['a', 'b', 'c', 'a']]
  graph['d'] = {'d'}
  assert ['d', 'd'] in find_cycles(graph)
  assert find_cycles({'a': {'b'}, 'b': {'c'}, 'c': set()}) == []


def test_scan_sees_function_level_relative_and_submodule_imports(tmp_path):
  pkg = tmp_path / 'pkg'
  (pkg / 'sub').mkdir(parents=True)
  (pkg / '__init__.py').write_text('from pkg.a import f\n')
  (pkg / 'a.py').write_text('def f():\n  from . import b\n')
  (pkg / 'b.py').write_text('from pkg import sub\nimport pkg.sub.c\n')
  (pkg / 'sub' / '__init__.py').write_text('from .. import a\n')
  (pkg / 'sub' / 'c.py').write_text('from ..b import x\nimport pkg\n')
  (pkg / 'd.py').write_text('def g():\n  from experiments import sweeps\n')
  graph, _, raw, modules = import_graph(tmp_path, ('pkg',))
  assert forbidden_imports(raw, modules, tmp_path, {'pkg': 'experiments'}) == [
    'pkg/d.py:2 imports experiments'
  ]
  assert graph == {
    'pkg': {'pkg.a'},
    'pkg.a': {'pkg.b'},
    'pkg.b': {'pkg.sub', 'pkg.sub.c'},
    'pkg.sub': {'pkg.a'},
    'pkg.sub.c': {'pkg.b', 'pkg'},
    'pkg.d': set(),
  }
  assert find_cycles(graph) == [
    ['pkg', 'pkg.a', 'pkg.b', 'pkg.sub.c', 'pkg'],
    ['pkg.b', 'pkg.sub', 'pkg.a', 'pkg.b'],
    ['pkg.sub.c', 'pkg.b', 'pkg.sub.c'],
  ]


def test_no_import_cycles():
  graph, lines, _, modules = import_graph()
  cycles = find_cycles(graph)
  assert not cycles, 'import cycles:\n  ' + '\n  '.join(
    _describe(c, lines, modules) for c in cycles
  )


def test_imports_point_one_way():
  """ddlm_jax never imports experiments; pallas_kernels never ddlm_jax."""
  _, _, raw, modules = import_graph()
  bad = forbidden_imports(raw, modules)
  assert not bad, '\n'.join(bad)


def private_imports(
  root: pathlib.Path = ROOT, packages=(*PACKAGES, 'experiments')
):
  """['file:line name'] for every `from <project module> import _name`.

  A private helper used from another module is an interface nobody
  declared; make it public where it is shared, or move it. Importing a
  package's private submodule (pallas_kernels.scan._validate) is allowed.
  """
  modules = scan(root, packages)
  bad = []
  for path, _ in modules.values():
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      if (
        isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.split('.')[0] in packages
      ):
        bad += [
          f'{path.relative_to(root)}:{node.lineno} {a.name}'
          for a in node.names
          if a.name.startswith('_')
          # A package-private module (scan/_validate.py) is for its siblings.
          and f'{node.module}.{a.name}' not in modules
        ]
  return bad


def test_private_names_stay_in_their_module(tmp_path):
  pkg = tmp_path / 'pkg'
  pkg.mkdir()
  (pkg / '__init__.py').write_text('')
  (pkg / 'a.py').write_text('def _helper():\n  return 1\n')
  (pkg / 'b.py').write_text('from pkg.a import _helper\n')
  assert private_imports(tmp_path, ('pkg',)) == ['pkg/b.py:1 _helper']
  assert private_imports() == []


# Inside ddlm_jax the foundation layers (the math, the networks, the data)
# import nothing from the layers built on them; `tasks` and `interop` sit on
# top with the loop. A new family or backbone therefore cannot reach into a
# sampler or the trainer, which is what keeps it two files and no edits.
LOWER = ('diffusion', 'models', 'data', 'parallel')
UPPER = ('sampling', 'evaluation', 'training', 'tasks', 'interop', 'planning')
# The tasks (what is trained: language models, state tracking, the planner
# stages) sit on the generic machinery: the loop, the samplers, the
# evaluators and the planning pipelines know no task, so a new task is a
# new module in `tasks` and no edit below it.
GENERIC = ('training', 'evaluation', 'sampling', 'planning', *LOWER)
TASKS = ('tasks',)


def layer_violations(raw, modules, root=ROOT, lower=LOWER, upper=UPPER):
  """'path:line imports X' for each module of a `lower` package of
  ddlm_jax importing from an `upper` one."""
  bad = []
  for module, found in raw.items():
    parts = module.split('.')
    if parts[0] != 'ddlm_jax' or len(parts) < 2 or parts[1] not in lower:
      continue
    for target, line in found:
      tparts = target.split('.')
      if tparts[0] == 'ddlm_jax' and len(tparts) > 1 and tparts[1] in upper:
        path = modules[module][0].relative_to(root)
        bad.append(f'{path}:{line} imports {target}')
  return bad


def test_foundation_layers_import_nothing_above_them():
  _, _, raw, modules = import_graph()
  bad = layer_violations(raw, modules)
  assert not bad, 'foundation layer imports an upper layer:\n' + '\n'.join(bad)


def test_the_generic_layers_import_no_task():
  _, _, raw, modules = import_graph()
  bad = layer_violations(raw, modules, lower=GENERIC, upper=TASKS)
  assert not bad, 'a generic layer imports a task:\n' + '\n'.join(bad)


def test_task_rule_catches_the_loop_importing_a_task(tmp_path):
  pkg = tmp_path / 'ddlm_jax'
  for sub in ('training', 'tasks'):
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / '__init__.py').write_text('')
  (pkg / '__init__.py').write_text('')
  (pkg / 'training' / 'fit.py').write_text(
    'def f():\n  from ddlm_jax.tasks import lm\n'
  )
  (pkg / 'tasks' / 'lm.py').write_text('from ddlm_jax.training import fit\n')
  _, _, raw, modules = import_graph(tmp_path, ('ddlm_jax',))
  bad = layer_violations(raw, modules, tmp_path, GENERIC, TASKS)
  assert bad == ['ddlm_jax/training/fit.py:2 imports ddlm_jax.tasks.lm']


def test_layer_rule_catches_a_planted_upward_import(tmp_path):
  pkg = tmp_path / 'ddlm_jax'
  for sub in ('diffusion', 'sampling'):
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / '__init__.py').write_text('')
  (pkg / '__init__.py').write_text('')
  (pkg / 'diffusion' / 'x.py').write_text(
    'def f():\n  from ddlm_jax.sampling import y\n'
  )
  (pkg / 'sampling' / 'y.py').write_text('')
  _, _, raw, modules = import_graph(tmp_path, ('ddlm_jax',))
  assert layer_violations(raw, modules, tmp_path) == [
    'ddlm_jax/diffusion/x.py:2 imports ddlm_jax.sampling.y'
  ]
