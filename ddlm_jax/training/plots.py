"""curves.png: training loss and validation bits/token against step."""

from __future__ import annotations

import os

from ddlm_jax.training.metrics import read_metrics


def plot_curves(workdir: str) -> str | None:
  """Draws workdir/curves.png from metrics.jsonl; returns its path."""
  records = read_metrics(workdir)
  if not records:
    return None
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  train = [r for r in records if r['split'] == 'train']
  val = [r for r in records if r['split'] == 'validation']
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  ln2 = 0.6931471805599453
  if train:
    axes[0].plot(
      [r['step'] for r in train],
      [r['nelbo_per_token'] / ln2 for r in train],
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
  path = os.path.join(workdir, 'curves.png')
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
