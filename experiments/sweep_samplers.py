"""Sweeps samplers and step counts on one checkpoint: quality vs cost.

  python -m experiments.sweep_samplers --workdir=runs/quickstart \
    --scorer=runs/ar_quickstart [--light=runs/light] \
    [--samplers='ancestral;confidence;eb;remdm'] [--steps=16,32,64,128] \
    [--gammas=0,0.5,1,2] [--num_samples=16] [--out=DIR]

Each entry of --samplers is a name or spec ('remdm:eta=0.02,strategy=loop');
samplers that take num_steps run at every --steps value, 'eb' at every
--gammas value, others once; --grid='[{"name": ..., "params": {...}}]'
(inline JSON or a file) lists runs explicitly instead. Every run draws
--num_samples sequences with the same seed and is scored by the AR run
(gen-ppl corpus-level and per-sample mean, unigram entropy, repeated 4-grams,
MAUVE with --mauve), with NFE, FLOPs and wall time. NFE counts batched calls,
so an adaptive sampler's NFE is its slowest row's; --batch=1 draws the
samples one by one (NFE = mean per sample). The validation text is
scored the same way as a reference row. Writes OUT/results.json,
OUT/table.md and OUT/pareto.png (gen-ppl vs NFE, gen-ppl vs seconds per
sample, entropy vs NFE; Pareto fronts in black). OUT defaults to
WORKDIR/sweep.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ddlm_jax.evaluation.sample_metrics import ARScorer, sample_quality
from ddlm_jax.evaluation.sample_run import draw_samples, reference_texts
from ddlm_jax.sampling import sweep as sampler_sweep
from ddlm_jax.sampling.registry import get_sampler
from ddlm_jax.training.run import load_run


def build_grid(args) -> list[dict]:
  """[{'name', 'params', 'label'}] from the flags."""
  if args.grid:
    text = args.grid
    if os.path.exists(text):
      with open(text) as f:
        text = f.read()
    entries = json.loads(text)
  else:
    entries = sampler_sweep.expand_specs(
      args.samplers.split(';'),
      steps=[int(s) for s in args.steps.split(',') if s],
      gammas=[float(g) for g in args.gammas.split(',') if g],
      length=args.length,
    )
  return sampler_sweep.label_entries(entries)


def pareto_front(xs, ys):
  """Indices of points no other point beats in both x and y (lower)."""
  order = np.lexsort((ys, xs))
  front, best = [], np.inf
  for i in order:
    if ys[i] < best:
      front.append(int(i))
      best = ys[i]
  return front


def plot(rows, reference, path):
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
  panels = [
    ('nfe', 'gen_ppl_corpus', 'NFE (network calls)', 'gen-ppl (corpus)'),
    ('seconds_per_sample', 'gen_ppl_corpus', 'wall seconds per sample',
     'gen-ppl (corpus)'),
    ('nfe', 'unigram_entropy_bits', 'NFE (network calls)',
     'unigram entropy (bits)'),
  ]  # fmt: skip
  names = sorted({r['name'] for r in rows})
  colors = dict(zip(names, plt.cm.tab10.colors))
  for ax, (xk, yk, xl, yl) in zip(axes, panels):
    for name in names:
      pts = sorted((r[xk], r[yk]) for r in rows if r['name'] == name)
      ax.plot(*zip(*pts), 'o-', color=colors[name], label=name, alpha=0.8)
    if yk == 'gen_ppl_corpus':
      xs = np.array([r[xk] for r in rows], float)
      ys = np.array([r[yk] for r in rows], float)
      idx = pareto_front(xs, ys)
      ax.step(xs[idx], ys[idx], 'k--', where='post', lw=1, label='Pareto')
    if reference and yk in reference:
      ax.axhline(reference[yk], color='gray', ls=':', label='validation text')
    ax.set_xscale('log')
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


COLUMNS = [
  ('label', 'sampler', '{}'),
  ('nfe', 'NFE', '{:g}'),
  ('gen_ppl_corpus', 'gen-ppl corpus', '{:.3f}'),
  ('gen_ppl_sample_mean', 'gen-ppl sample-mean', '{:.3f}'),
  ('unigram_entropy_bits', 'entropy bits', '{:.3f}'),
  ('repetition_rate_4gram', 'rep 4-gram', '{:.3f}'),
  ('mauve', 'MAUVE', '{:.3f}'),
  ('flops_per_sample', 'GFLOPs/sample', '{:.3g}'),
  ('seconds_per_sample', 's/sample', '{:.3f}'),
  ('tokens_per_sec', 'tokens/s', '{:.0f}'),
]


def table(rows, reference) -> str:
  cols = [c for c in COLUMNS if any(c[0] in r for r in rows)]
  lines = ['| ' + ' | '.join(c[1] for c in cols) + ' |',
           '|' + '---|' * len(cols)]  # fmt: skip
  for r in ([reference] if reference else []) + rows:
    cells = []
    for key, _, fmt in cols:
      v = r.get(key)
      if key == 'flops_per_sample' and v is not None:
        v = v / 1e9
      cells.append('' if v is None else fmt.format(v))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--workdir', required=True, help='diffusion run directory')
  p.add_argument('--scorer', required=True, help='AR run directory')
  p.add_argument('--light', default='', help="light run for 'scheduled'")
  p.add_argument('--samplers', default='ancestral;confidence;eb;remdm')
  p.add_argument('--steps', default='16,32,64,128')
  p.add_argument('--gammas', default='0,0.5,1,2,4')
  p.add_argument('--grid', default='', help='JSON list (or file) of runs')
  p.add_argument('--num_samples', type=int, default=16)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument(
    '--batch',
    type=int,
    default=0,
    help='samples per call (default all); 1 gives per-sample NFE',
  )
  p.add_argument('--mauve', action='store_true')
  p.add_argument('--out', default='')
  args = p.parse_args()

  run = load_run(args.workdir)
  args.length = run.config.data.seq_len
  scorer_run = load_run(args.scorer)
  scorer = ARScorer.from_run(scorer_run)
  same = scorer.tokenizer == run.data.tokenizer
  light = load_run(args.light) if args.light else None
  out = args.out or os.path.join(args.workdir, 'sweep')
  os.makedirs(out, exist_ok=True)

  refs = reference_texts(run, args.num_samples)
  ref_tokens = [run.data.tokenizer.encode(t) for t in refs]
  reference = sample_quality(refs, ref_tokens, scorer=scorer,
                             same_tokenizer=same)  # fmt: skip
  reference['label'] = 'validation text (reference)'
  ref_feats = scorer.features(scorer.encode(refs)) if args.mauve else None

  rows = []
  for entry in build_grid(args):
    sampler = get_sampler(entry['name'], **entry['params'])
    batch = args.batch or args.num_samples
    tokens, stats = draw_samples(
      run, sampler, num_samples=batch, seed=args.seed, light_run=light,
      calls=max(1, args.num_samples // batch),
    )  # fmt: skip
    texts = [run.data.tokenizer.decode(r) for r in tokens]
    quality = sample_quality(texts, tokens, scorer=scorer,
                             same_tokenizer=same)  # fmt: skip
    if ref_feats is not None:
      from ddlm_jax.evaluation.sample_metrics import mauve_score

      rows_s = list(tokens) if same else scorer.encode(texts)
      quality['mauve'] = mauve_score(ref_feats, scorer.features(rows_s))
    row = {**entry, **stats, **quality, 'example': texts[0][:200]}
    rows.append(row)
    print(
      f'{entry["label"]}: NFE {row["nfe"]:g} gen-ppl '
      f'{row["gen_ppl_corpus"]:.3f}'
      f' (sample-mean {row["gen_ppl_sample_mean"]:.3f}) entropy '
      f'{row["unigram_entropy_bits"]:.3f} bits, '
      f'{row["seconds_per_sample"]:.3f} s/sample',
      flush=True,
    )
  slim = lambda r: {k: v for k, v in r.items() if not isinstance(v, list)}
  with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump({'reference': slim(reference),
               'rows': [slim(r) for r in rows]}, f, indent=2)  # fmt: skip
  with open(os.path.join(out, 'table.md'), 'w') as f:
    f.write(table(rows, reference))
  plot(rows, reference, os.path.join(out, 'pareto.png'))
  print(table(rows, reference))
  print(f'wrote {out}/results.json, table.md, pareto.png')


if __name__ == '__main__':
  main()
