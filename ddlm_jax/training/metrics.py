"""Run records: JSON-lines metrics (plus the configured log backends),
progress lines.

Records go to local paths or to any `etils.epath` URI (``gs://bucket/run``)
through ddlm_jax.paths: remote files are written whole (object stores have
no append), local ones are appended to.
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np

from ddlm_jax import paths

# The path functions records use, here for callers that import them from
# the records module.
is_remote = paths.is_remote
join = paths.join
exists = paths.exists
read_text = paths.read_text
write_text = paths.write_text


def _plain(value):
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.item() if np.ndim(value) == 0 else np.asarray(value).tolist()
  if hasattr(value, 'item') and not isinstance(value, (list, dict)):
    try:
      value = value.item()
    except (TypeError, ValueError):
      pass
  return value


class MetricsWriter:
  """Appends {'step', 'split', ...} records to workdir/metrics.jsonl.

  The numbers of each record also go to the backends of the run's
  `log.backends` (TensorBoard, W&B: ddlm_jax.training.log_backends) when
  `config` (the run's config dict) names any; metrics.jsonl stays the
  record of truth.
  """

  def __init__(
    self, workdir: str, *, enabled: bool = True, config: dict | None = None
  ):
    self.path = join(workdir, 'metrics.jsonl')
    self.enabled = enabled
    self._remote = is_remote(workdir)
    self._records = None  # Remote: the file's records, rewritten whole.
    self._backends = []
    if enabled and config:
      from ddlm_jax.training import log_backends

      self._backends = log_backends.make_writers(workdir, config)

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    record = {'step': int(step), 'split': split}
    record.update({k: _plain(v) for k, v in metrics.items()})
    if self._remote:
      if self._records is None:
        self._records = (
          _parse(read_text(self.path)) if exists(self.path) else []
        )
      self._records.append(record)
      write_text(
        self.path, ''.join(json.dumps(r) + '\n' for r in self._records)
      )
    else:
      with open(self.path, 'a') as f:
        f.write(json.dumps(record) + '\n')
    if self._backends:
      scalars = {
        k: float(v)
        for k, v in record.items()
        if k not in ('step', 'split')
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
      }
      for backend in self._backends:
        backend.write(int(step), split, scalars)

  def drop_after(self, step: int):
    """Forgets records a resumed run will write again (no duplicates).

    Keeps training and validation records up to the restored `step` and
    everything earlier; final records (test, final validation) at or past
    it are dropped, as the run recomputes them.
    """
    if not self.enabled or not exists(self.path):
      return
    records = _parse(read_text(self.path))
    keep = [
      r
      for r in records
      if r['step'] < step
      or (r['step'] == step and r['split'] in ('train', 'validation'))
    ]
    self._records = keep if self._remote else None
    if len(keep) == len(records):
      return
    write_text(self.path, ''.join(json.dumps(r) + '\n' for r in keep))

  def close(self):
    for backend in self._backends:
      backend.close()
    self._backends = []


def write_json(path: str, obj) -> None:
  """Writes obj as JSON atomically (a reader never sees half a file)."""
  write_text(path, json.dumps(obj, indent=2, sort_keys=True))


def _parse(text: str) -> list[dict]:
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_metrics(workdir: str) -> list[dict]:
  path = join(workdir, 'metrics.jsonl')
  return _parse(read_text(path)) if exists(path) else []


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds) or seconds < 0:
    return '?'
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else f'{m}m{s:02d}s'


class Progress:
  """One line per report: step, loss, steps/s, tokens/s and ETA."""

  def __init__(self, total_steps: int, tokens_per_step: int, stream=None):
    self.total = total_steps
    self.tokens_per_step = tokens_per_step
    self.stream = stream or sys.stdout
    self._t0 = self._last_t = time.perf_counter()
    self._last_step = None
    self.steps_per_sec = float('nan')

  def start(self, step: int):
    """Starts the clock before the first step (which compiles)."""
    self._last_step = step
    self._last_t = time.perf_counter()
    print(
      f'compiling the train step (from step {step}/{self.total})...',
      file=self.stream,
      flush=True,
    )

  def compiled(self, step: int):
    """The first step is done: reports its time and restarts the clock, so
    rates and ETAs from the first report on measure training alone."""
    now = time.perf_counter()
    print(
      f'compiled and ran the first step in {now - self._last_t:.1f}s',
      file=self.stream,
      flush=True,
    )
    self._last_step, self._last_t = step, now

  def report(self, step: int, metrics: dict, extra: str = '') -> dict:
    now = time.perf_counter()
    done = step - (self._last_step if self._last_step is not None else step)
    dt = now - self._last_t
    if done > 0 and dt > 0:
      self.steps_per_sec = done / dt
    self._last_step, self._last_t = step, now
    tok_s = self.steps_per_sec * self.tokens_per_step
    eta = (self.total - step) / self.steps_per_sec
    parts = [f'step {step}/{self.total}']
    parts += [f'{k} {float(v):.4f}' for k, v in metrics.items()]
    parts += [
      f'{self.steps_per_sec:.2f} steps/s',
      f'{tok_s / 1e3:.1f}k tok/s',
      f'ETA {format_duration(eta)}',
    ]
    if extra:
      parts.append(extra)
    print(' | '.join(parts), file=self.stream, flush=True)
    return {'steps_per_sec': self.steps_per_sec, 'tokens_per_sec': tok_s}
