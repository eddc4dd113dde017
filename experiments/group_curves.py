"""Learning curves of the PD-SSM group claims, with their group diagnostics.

  python -m experiments.group_curves \
    --claims=pdssm-s3-all-six,pdssm-a4-all-twelve,pdssm-a5 \
    --out=docs/images/pdssm_groups_curves.png

For each claim, the runs of its newest record (the workdirs it lists) are
read from their metrics.jsonl and drawn in one row of three panels against
the training step: accuracy (validation words of lengths 40-256, solid;
the training batch's best restart, dashed), the fraction of token maps that
are bijections on the reachable states, and faithful_relations (the
fraction of the group's relations the maps satisfy, 0 unless the maps
tell every element apart; see ``ddlm_jax.evaluation.group_maps``). A run on
its way to the group shows the diagnostics rising before the validation
accuracy jumps; a run that memorises short words shows training accuracy
rising alone. Validation records carry the restart validation chose at that
step, so the curves follow the kept restart, not one initialisation.
"""

from __future__ import annotations

import argparse
import os

from ddlm_jax.training.metrics import read_metrics
from experiments import claims as registry
from experiments.claims import records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PANELS = (
  ('accuracy', 'accuracy (%)'),
  ('bijective_frac', 'bijective maps (fraction)'),
  ('faithful_relations', 'faithful relations (fraction)'),
)


def run_curves(workdir: str) -> dict[str, tuple[list[int], list[float]]]:
  """{series: (steps, values)} of one run: validation accuracy (%) and the
  group diagnostics at every evaluation, and 'train' (the training
  batch's best-restart accuracy, %) at every log step."""
  rows = read_metrics(workdir)
  by_step = {}  # A resumed run repeats a step: the later record counts.
  for r in rows:
    if r.get('split') == 'validation':
      by_step[r['step']] = r
  val = [by_step[s] for s in sorted(by_step)]
  out = {}
  for key, _ in PANELS:
    scale = 100.0 if key == 'accuracy' else 1.0
    pts = [(r['step'], scale * r[key]) for r in val if key in r]
    out[key] = ([s for s, _ in pts], [x for _, x in pts])
  train = [r for r in rows if r.get('split') == 'train']
  key = 'acc_best' if any('acc_best' in r for r in train) else 'acc'
  pts = [(r['step'], 100.0 * r[key]) for r in train if key in r]
  out['train'] = ([s for s, _ in pts], [x for _, x in pts])
  return out


def claim_runs(claim_id: str, records_dir: str) -> list[tuple[int, str]]:
  """(seed, workdir) of every run the claim's newest record lists."""
  registry.get(claim_id)  # A clear error for an unknown id.
  rec = records.latest(records_dir).get(claim_id)
  if rec is None:
    raise ValueError(
      f'{claim_id} has no record yet: python -m experiments.reproduce '
      f'{claim_id}'
    )
  runs = []
  for arm in rec['arms'].values():
    for seed, workdir in zip(arm['seeds'], arm.get('workdirs', ())):
      runs.append((seed, os.path.join(ROOT, workdir)))
  if not runs:
    raise ValueError(f'the newest record of {claim_id} lists no workdirs')
  return runs


def plot(curves: dict[str, dict[int, dict]], path: str) -> str:
  """One row per claim, one panel per PANELS entry, one line per seed."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(
    len(curves),
    len(PANELS),
    figsize=(3.6 * len(PANELS), 2.6 * len(curves)),
    squeeze=False,
  )
  for row, (claim_id, runs) in zip(axes, curves.items(), strict=True):
    for ax, (key, label) in zip(row, PANELS, strict=True):
      for i, (seed, series) in enumerate(sorted(runs.items())):
        steps, values = series[key]
        ax.plot(steps, values, color=f'C{i}', marker='.', label=f's{seed}')
        if key == 'accuracy':
          steps, values = series['train']
          ax.plot(steps, values, color=f'C{i}', ls='--', lw=0.8, alpha=0.7)
      ax.set_ylim(
        -2 if key == 'accuracy' else -0.02, 101 if key == 'accuracy' else 1.02
      )
      ax.set_title(f'{claim_id}: {label}', fontsize=8)
      ax.grid(alpha=0.3)
    row[0].legend(fontsize=6)
  for ax in axes[-1]:
    ax.set_xlabel('step')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def parse(argv=None) -> argparse.Namespace:
  # argparse, not absl flags: absl's flag names are global to the process,
  # and other experiment modules (imported beside this one in tests) define
  # --out too.
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument(
    '--claims',
    default='pdssm-s3-all-six,pdssm-a4-all-twelve,pdssm-a5',
    help='Comma-separated claim ids whose newest record lists the runs.',
  )
  p.add_argument(
    '--out', default='docs/images/pdssm_groups_curves.png', help='The PNG.'
  )
  p.add_argument(
    '--records_dir',
    default=records.RECORDS_DIR,
    help='Where the claim records are.',
  )
  return p.parse_args(argv)


def main(argv=None) -> None:
  args = parse(argv)
  curves = {
    claim_id: {
      seed: run_curves(workdir)
      for seed, workdir in claim_runs(claim_id, args.records_dir)
    }
    for claim_id in args.claims.split(',')
  }
  print(plot(curves, args.out))


if __name__ == '__main__':
  main()
