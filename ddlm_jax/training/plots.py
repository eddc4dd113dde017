"""curves.png: training loss and validation bits/token against step.

Drawn through matplotlib's object API (a `Figure` rendered by the Agg
canvas), never through pyplot's global state or `matplotlib.use`: a
notebook that trains a run keeps its own backend, so its plots still show
inline. `curves_figure` returns the figure for a notebook to display.
"""

from __future__ import annotations

import math

from ddlm_jax.training.metrics import is_remote, join, read_metrics


def curves_figure(records: list[dict]):
  """A matplotlib Figure of metrics.jsonl records (train and validation)."""
  from matplotlib.figure import Figure

  train = [r for r in records if r['split'] == 'train']
  val = [r for r in records if r['split'] == 'validation']
  fig = Figure(figsize=(10, 3.6))
  axes = fig.subplots(1, 2)
  if train:
    axes[0].plot(
      [r['step'] for r in train],
      [r['nelbo_per_token'] / math.log(2) for r in train],
      label='train NELBO',
    )
  axes[0].set_xlabel('step')
  axes[0].set_ylabel('bits / token')
  axes[0].set_title('training loss')
  if val:
    axes[1].errorbar(
      [r['step'] for r in val],
      [r['bits_per_token'] for r in val],
      yerr=[r['bits_per_token_stderr'] for r in val],
      marker='o',
      capsize=3,
    )
  axes[1].set_xlabel('step')
  axes[1].set_ylabel('bits / token')
  axes[1].set_title('validation')
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig


def save_figure(fig, path: str, dpi: int = 110) -> str:
  """Writes `fig` as PNG to `path` (local or an epath URI) with the Agg
  canvas; no backend is chosen."""
  import io

  from matplotlib.backends.backend_agg import FigureCanvasAgg

  if not is_remote(path):
    FigureCanvasAgg(fig).print_figure(path, dpi=dpi)
    return path
  from etils import epath

  buffer = io.BytesIO()
  FigureCanvasAgg(fig).print_figure(buffer, dpi=dpi, format='png')
  epath.Path(path).write_bytes(buffer.getvalue())
  return path


def plot_curves(workdir: str) -> str | None:
  """Draws workdir/curves.png from metrics.jsonl; returns its path."""
  records = read_metrics(workdir)
  if not records:
    return None
  return save_figure(curves_figure(records), join(workdir, 'curves.png'))
