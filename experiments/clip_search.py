"""BD3-LM's data-driven noise band: the clip width with the least variance.

  python -m experiments.clip_search --workdir=runs/bd3_quickstart_16 \
    [--clips='0,1;0.3,0.8;0.45,0.95;0.5,1'] [--num_batches=8] [--seed=0]

Restores a block-diffusion run (process.kind=bd3), draws the per-sequence
NELBO per token of --num_batches validation batches under every candidate
band (beta, omega) (training t ~ U[beta, omega] per block) with the same
keys for every band, and prints each band's mean and variance and the band
with the smallest variance (BlockDiffusion.clip_search). Train with it by
`--config.process.clip_low=BETA --config.process.clip_high=OMEGA`; the
reported bound always uses the unclipped process. Writes
WORKDIR/clip_search.json.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

from ddlm_jax.diffusion.block import select_clip
from ddlm_jax.evaluation.sample_run import make_apply
from ddlm_jax.tasks.language_model import load_run

DEFAULT_CLIPS = '0,1;0.3,0.8;0.45,0.95;0.5,1;0.2,0.7'


def parse_clips(text: str) -> list[tuple[float, float]]:
  """'b,o;b,o' -> [(b, o), ...], each 0 <= b < o <= 1."""
  clips = []
  for item in filter(None, (p.strip() for p in text.split(';'))):
    parts = [float(x) for x in item.split(',')]
    if len(parts) != 2 or not 0.0 <= parts[0] < parts[1] <= 1.0:
      raise ValueError(
        f'clip {item!r}: expected BETA,OMEGA with 0 <= BETA < OMEGA <= 1, '
        "e.g. '0.3,0.8'."
      )
    clips.append((parts[0], parts[1]))
  if not clips:
    raise ValueError('--clips lists no band; e.g. --clips="0,1;0.3,0.8".')
  return clips


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--workdir', required=True)
  p.add_argument('--clips', default=DEFAULT_CLIPS)
  p.add_argument('--num_batches', type=int, default=8)
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args()
  clips = parse_clips(args.clips)
  run = load_run(args.workdir)
  process = run.process.evaluation_process
  if process.family != 'block':
    raise SystemExit(
      f'error: {args.workdir} is a {run.config.process.kind} run; the clip '
      'search is for block diffusion (process.kind=bd3).'
    )
  batches = run.data.eval_batches(
    'validation',
    seq_len=run.config.data.seq_len,
    batch_size=run.config.eval.batch_size,
    max_batches=args.num_batches,
  )
  apply = make_apply(run.graphdef, run.eval_params())
  draws = process.nelbo_draws(
    apply,
    jax.random.key(args.seed),
    [b['tokens'] for b in batches],
    clips,
  )
  best = select_clip(draws)
  rows = []
  for clip, values in draws.items():
    values = np.asarray(values, np.float64)
    rows.append(
      {
        'clip': list(clip),
        'mean_nats_per_token': float(values.mean()),
        'variance': float(values.var(ddof=1)),
        'num_sequences': int(values.size),
      }
    )
    mark = '  <- least variance' if clip == best else ''
    print(
      f'clip {clip}: NELBO {values.mean():.4f} nats/token, variance '
      f'{values.var(ddof=1):.5f} ({values.size} sequences){mark}',
      flush=True,
    )
  with open(os.path.join(args.workdir, 'clip_search.json'), 'w') as f:
    json.dump({'best': list(best), 'rows': rows}, f, indent=2)


if __name__ == '__main__':
  main()
