"""What a person watching a run sees: progress bars and the closing summary.

`batches(items, what)` shows a tqdm bar (count, rate, ETA) over the batches
of a long phase such as a final evaluation; `timed(what)` reports how long
a phase without steps took (compiling a sampler). `mode_summary(result,
mode, workdir)` is the few lines `python -m experiments.run` prints at
the end of a mode: the bound, the speed, the first samples and where the
files are; the full record stays in the workdir's JSON files.

Only process 0 of a multi-host run prints.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import sys
import time

from ddlm_jax import paths
from ddlm_jax.training.metrics import format_duration

# Fewer batches than this pass without a bar (a periodic evaluation).
MIN_BATCHES = 4
# Samples shown in a closing summary, and characters of each.
SHOWN_SAMPLES = 2
SHOWN_CHARS = 240


def _is_main() -> bool:
  import jax

  return jax.process_index() == 0


def batches(items, what: str, *, total: int | None = None):
  """`items` with a progress bar named `what` (none for a few batches)."""
  from tqdm.auto import tqdm

  if total is None and hasattr(items, '__len__'):
    total = len(items)
  quiet = (total is not None and total < MIN_BATCHES) or not _is_main()
  terminal = sys.stdout.isatty()
  return tqdm(
    items,
    desc=what,
    total=total,
    unit='batch',
    # A terminal's bar disappears when done; a log keeps the final line.
    leave=not terminal,
    file=sys.stdout,
    disable=quiet,
    # A log file gets an update every 10 s, not every batch.
    mininterval=0.5 if terminal else 10.0,
  )


@contextlib.contextmanager
def timed(what: str):
  """Prints `what...` now and `what: 12.3s` when the block ends."""
  main = _is_main()
  if main:
    print(f'{what}...', flush=True)
  t0 = time.perf_counter()
  yield
  if main:
    print(f'{what}: {time.perf_counter() - t0:.1f}s', flush=True)


# ----------------------------------------------------------- the summary


def _bound(ev: dict) -> str:
  if not ev.get('loss_is_bound', True):
    return (
      f'{ev["bits_per_token"]:.4f} +- {ev["bits_per_token_stderr"]:.4f} '
      'bits/token of the training loss (not a likelihood bound; '
      f'{ev.get("num_sequences", "?")} sequences)'
    )
  ppl = ev.get('perplexity_bound', float('nan'))
  shown = f'{ppl:.3f}' if math.isfinite(ppl) else 'inf'
  return (
    f'{ev["bits_per_token"]:.4f} +- {ev["bits_per_token_stderr"]:.4f} '
    f'bits/token (perplexity <= {shown}; {ev.get("num_sequences", "?")} '
    'sequences)'
  )


def _newest(workdir: str, pattern: str) -> str | None:
  if paths.is_remote(workdir):  # An object store: listed through epath.
    hits = paths.epath(workdir).glob(pattern)
    found = [(p.stat().mtime, str(p)) for p in hits]
    return max(found)[1] if found else None
  found = glob.glob(os.path.join(workdir, pattern))
  return max(found, key=os.path.getmtime) if found else None


def first_samples(path: str, n: int = SHOWN_SAMPLES) -> list[str]:
  """The first `n` samples of a samples file, each cut to SHOWN_CHARS."""
  text = paths.read_text(path)
  parts = [p for p in text.split('=== sample ')[1:] if p.strip()]
  out = []
  for part in parts[:n]:
    body = part.split('===\n', 1)[-1].strip()
    if len(body) > SHOWN_CHARS:
      body = body[:SHOWN_CHARS] + '...'
    out.append(body)
  return out


def _sample_lines(stats: dict, workdir: str) -> list[str]:
  lines = [
    f'samples: {stats.get("num_samples", "?")} from {stats.get("sampler")} '
    f'({stats.get("steps")} steps, NFE {stats.get("nfe")}, '
    f'{stats.get("tokens_per_sec", float("nan")):.0f} tokens/s)'
  ]
  if 'gen_ppl_corpus' in stats:
    lines[-1] += f', gen-ppl {stats["gen_ppl_corpus"]:.2f}'
  path = _newest(workdir, 'samples*.txt')
  if path:
    for i, text in enumerate(first_samples(path)):
      lines.append(f'  [{i}] {text!r}')
    lines.append(f'  all samples: {path}')
  return lines


def _train_lines(result: dict, workdir: str) -> list[str]:
  steps, total = result.get('steps', '?'), result.get('num_steps', '?')
  rate = result.get('train_tokens_per_sec', float('nan'))
  lines = [
    f'trained {steps}/{total} steps ({result.get("status", "?")}) in '
    f'{format_duration(result.get("train_seconds", float("nan")))}, '
    f'{rate / 1e3:.1f}k tokens/s; wall '
    f'{format_duration(result.get("wall_seconds", float("nan")))}'
  ]
  if 'validation' in result:
    lines.append(f'final validation: {_bound(result["validation"])}')
  elif 'best_val_accuracy' in result or 'test_accuracy' in result:
    for key in ('best_val_accuracy', 'test_accuracy'):
      if key in result:
        lines.append(f'{key.replace("_", " ")}: {result[key]:.4f}')
  if isinstance(result.get('samples'), dict):
    lines += _sample_lines(result['samples'], workdir)
  return lines


def _eval_lines(result: dict, workdir: str, split: str) -> list[str]:
  if 'bits_per_token' in result:
    return [
      f'{split} at step {result.get("step", "?")}: {_bound(result)}',
      f'record: {os.path.join(workdir, f"eval_{split}.json")}',
    ]
  return _scalar_lines(result)


def _scalar_lines(result: dict, limit: int = 8) -> list[str]:
  scalars = [
    (k, v)
    for k, v in result.items()
    if isinstance(v, (int, float, str)) and not isinstance(v, bool)
  ]
  return [
    f'{k}: {v:.4g}' if isinstance(v, float) else f'{k}: {v}'
    for k, v in scalars[:limit]
  ]


def mode_summary(
  result, mode: str, workdir: str, split: str = 'validation'
) -> str:
  """A few human-readable lines closing `mode` (train, eval, sample)."""
  if not isinstance(result, dict):
    return str(result)
  if 'preempted_at_step' in result:
    return (
      f'preempted at step {result["preempted_at_step"]}: checkpoint saved in '
      f'{workdir}; start the same command again to resume.'
    )
  if mode == 'train':
    lines = _train_lines(result, workdir)
  elif mode == 'eval':
    lines = _eval_lines(result, workdir, split)
  elif mode == 'sample' and 'sampler' in result:
    lines = _sample_lines(result, workdir)
    lines.insert(0, f'sampled step {result.get("step", "?")}')
  else:
    lines = _scalar_lines(result)
  for name in ('summary.json', 'metrics.jsonl', 'curves.png'):
    if mode == 'train' and paths.exists(paths.join(workdir, name)):
      lines.append(f'{name}: {paths.join(workdir, name)}')
  return '\n'.join(['--- ' + mode + ' done ---', *lines])


__all__ = ['batches', 'first_samples', 'mode_summary', 'timed']
