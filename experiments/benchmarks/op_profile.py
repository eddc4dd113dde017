"""Where a compiled program's time goes, by source line of the model code.

  python -m experiments.benchmarks.train_step --time_conditioning \
    --mlp_dim=704 --profile=DIR     # writes DIR/<variant>/<program>/ops.md

A jax.profiler trace names each executed XLA op (a fusion, a dot, a copy);
the compiled HLO gives each op the Python stack it came from. Joining the
two attributes every op's time to the innermost frame inside ddlm_jax, to
forward or backward (ops under a `transpose(` are the backward of
jax.grad) and to matmul or elementwise work. This is how section 2.2 of
docs/RESULTS.md found where the train step spends its time.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re

# Trace events that are not XLA ops (the executor, Python, the thread pool).
_NOT_OPS = ('ThunkExecutor', '$', 'Slinky', 'end: ', 'PjitFunction')


def op_seconds(log_dir: str | pathlib.Path, calls: int) -> dict[str, float]:
  """Seconds per call of each XLA op in the perfetto trace under log_dir."""
  paths = sorted(pathlib.Path(log_dir).rglob('perfetto_trace.json.gz'))
  if not paths:
    raise FileNotFoundError(f'no perfetto_trace.json.gz under {log_dir}')
  trace = json.loads(gzip.open(paths[-1]).read())
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  out = collections.Counter()
  for e in events:
    if e.get('ph') == 'X' and not e['name'].startswith(_NOT_OPS):
      out[e['name']] += e.get('dur', 0) / 1e6 / calls
  return dict(out)


def _section(hlo: str, name: str) -> list[str]:
  """The lines of one of the HLO text's trailing tables (may be absent)."""
  match = re.search(rf'\n{name}\n(.*?)(?:\n\n|\Z)', hlo, re.S)
  return match.group(1).splitlines() if match else []


def _frames(hlo: str):
  """stack_frame_id -> list of (file, function, line), innermost first."""
  files = dict(x.split(' ', 1) for x in _section(hlo, 'FileNames'))
  funcs = dict(x.split(' ', 1) for x in _section(hlo, 'FunctionNames'))
  locs = {}
  for line in _section(hlo, 'FileLocations'):
    i, rest = line.split(' ', 1)
    m = re.search(r'file_name_id=(\d+) function_name_id=(\d+) line=(\d+)', rest)
    if m:
      locs[i] = (
        files.get(m[1], '?').strip('"'),
        funcs.get(m[2], '').strip('"'),
        int(m[3]),
      )
  parents = {}
  for line in _section(hlo, 'StackFrames'):
    i, rest = line.split(' ', 1)
    m = re.search(r'file_location_id=(\d+) parent_frame_id=(\d+)', rest)
    if m:
      parents[i] = (m[1], m[2])

  def stack(frame_id: str) -> list:
    chain = []
    while frame_id in parents and len(chain) < 64:
      loc, parent = parents[frame_id]
      chain.append(locs.get(loc, ('?', '', 0)))
      if parent == frame_id:
        break
      frame_id = parent
    return chain

  return stack


_OP = re.compile(
  r'^\s*(?:ROOT )?%([\w.\-]+) = .*?op_name="([^"]+)"(?: stack_frame_id=(\d+))?',
  re.M,
)


def op_table(seconds: dict[str, float], hlo: str, package='ddlm_jax'):
  """Rows (seconds, share, direction, kind, source) summed by source line,
  largest first. The source is the innermost frame inside `package`, else
  the innermost frame, else the op's jax name."""
  entry = hlo[hlo.find('\nENTRY') :] if '\nENTRY' in hlo else hlo
  stack = _frames(hlo)
  sums = collections.Counter()
  for name, op_name, frame_id in _OP.findall(entry):
    sec = seconds.get(name, 0.0)
    if not sec:
      continue
    chain = stack(frame_id) if frame_id else []
    ours = [c for c in chain if f'/{package}/' in c[0]]
    if ours or chain:
      file, func, line = (ours or chain)[0]
      source = f'{file.split(f"/{package}/")[-1]}:{line} {func}'
    else:
      source = op_name.split('/')[-1]
    direction = 'backward' if 'transpose(' in op_name else 'forward'
    kind = 'matmul' if 'dot_general' in op_name else 'elementwise'
    sums[(direction, kind, source)] += sec
  total = sum(sums.values()) or 1.0
  return [
    {
      'seconds': sec,
      'share': sec / total,
      'direction': d,
      'kind': k,
      'source': s,
    }
    for (d, k, s), sec in sums.most_common()
  ]


def markdown(rows: list[dict], limit: int = 40) -> str:
  lines = [
    '| ms per call | share | direction | kind | source |',
    '|---|---|---|---|---|',
  ]
  for r in rows[:limit]:
    lines.append(
      f'| {1e3 * r["seconds"]:.1f} | {100 * r["share"]:.1f}% | '
      f'{r["direction"]} | {r["kind"]} | {r["source"]} |'
    )
  return '\n'.join(lines)
