"""Sweeps samplers and step counts on one checkpoint: quality vs cost.

  python -m experiments.sweep_samplers --workdir=runs/quickstart \
    --scorer=runs/ar_quickstart [--light=runs/light] \
    [--samplers='ancestral;confidence;eb;remdm'] [--steps=16,32,64,128] \
    [--gammas=0,0.5,1,2] [--num_samples=16] [--batch=B] [--seeds=0,1,2] \
    [--mauve] [--out=DIR]

Works on any run directory (character or BPE quickstart, paper configs): the
run's own tokenizer decodes the samples and the scorer's re-encodes them
unless both runs share one. Each entry of --samplers is a name or spec
('remdm:eta=0.02,strategy=loop'); samplers that take num_steps run at every
--steps value, 'eb' at every --gammas value, others once;
--grid='[{"name": ..., "params": {...}}]' (inline JSON or a file) lists runs
explicitly instead. Every run draws --num_samples sequences and is scored by
the AR run (gen-ppl corpus-level and per-sample mean, unigram entropy,
repeated 4-grams, MAUVE with --mauve against as many evenly spaced
validation windows), with NFE, FLOPs and wall time. --batch=B draws them in
ceil(N / B) calls of B (the last call's surplus is dropped), so N = 1000 for
MAUVE fits in memory; NFE counts batched calls, so an adaptive sampler's
NFE is its slowest row's and --batch=1 gives the mean NFE per sample.
--seeds repeats every run with disjoint sampling keys (seed s draws keys
s * calls ... (s + 1) * calls - 1); each row then holds the mean over seeds,
its standard error (KEY_se) and the per-seed values (per_seed). The
validation text is scored the same way as a reference row. Writes
OUT/results.json, OUT/table.md and OUT/pareto.png (gen-ppl vs NFE, gen-ppl
vs seconds per sample, entropy vs NFE; Pareto fronts in black). OUT
defaults to WORKDIR/sweep.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ddlm_jax.evaluation.sample_metrics import (
  ARScorer,
  mauve_score,
  sample_quality,
)
from ddlm_jax.evaluation.sample_run import draw_samples, reference_texts
from ddlm_jax.sampling import sweep as sampler_sweep
from ddlm_jax.sampling.registry import get_sampler
from ddlm_jax.tasks.language_model import load_run


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
# Metrics averaged over --seeds (mean, standard error, per-seed values).
SEEDED = tuple(k for k, _, _ in COLUMNS[1:]) + ('nfe_per_sample',)


def table(rows, reference) -> str:
  cols = [c for c in COLUMNS if any(c[0] in r for r in rows)]
  lines = ['| ' + ' | '.join(c[1] for c in cols) + ' |',
           '|' + '---|' * len(cols)]  # fmt: skip
  for r in ([reference] if reference else []) + rows:
    cells = []
    for key, _, fmt in cols:
      v, se = r.get(key), r.get(f'{key}_se')
      if key == 'flops_per_sample' and v is not None:
        v, se = v / 1e9, None if se is None else se / 1e9
      cell = '' if v is None else fmt.format(v)
      if v is not None and se is not None:
        cell += ' +- ' + fmt.format(se)
      cells.append(cell)
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def combine_seeds(per_seed: list[dict]) -> dict:
  """One row from the rows of each sampling seed: mean, s.e., per-seed.

  The standard error is std(ddof=1) / sqrt(n) over the seeds (None for one
  seed); non-metric fields come from the first seed's row.
  """
  row = dict(per_seed[0])
  n = len(per_seed)
  if n == 1:
    return row
  for key in SEEDED:
    vals = [r[key] for r in per_seed if r.get(key) is not None]
    if len(vals) != n:
      continue
    v = np.asarray(vals, float)
    row[key] = float(v.mean())
    row[f'{key}_se'] = float(v.std(ddof=1) / np.sqrt(n))
  row['per_seed'] = [
    {'seed': r['sample_seed'], **{k: r.get(k) for k in SEEDED if k in r}}
    for r in per_seed
  ]
  return row


def parse_seeds(text: str) -> list[int]:
  seeds = [int(s) for s in text.split(',') if s.strip()]
  if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
    raise ValueError(
      f'--seeds={text!r}: give distinct non-negative integers, e.g. 0,1,2.'
    )
  return seeds


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
  p.add_argument('--seed', type=int, default=0, help='= --seeds=SEED')
  p.add_argument('--seeds', default='', help='sampling seeds, e.g. 0,1,2')
  p.add_argument(
    '--batch',
    type=int,
    default=0,
    help='samples per call (default all); 1 gives per-sample NFE',
  )
  p.add_argument('--mauve', action='store_true')
  p.add_argument('--out', default='')
  args = p.parse_args()
  seeds = parse_seeds(args.seeds or str(args.seed))
  if args.num_samples < 1 or args.batch < 0:
    raise ValueError(
      f'--num_samples={args.num_samples} must be >= 1 and --batch='
      f'{args.batch} >= 0 (0: all samples in one call).'
    )
  if args.mauve and args.num_samples < 20:
    raise ValueError(
      f'--mauve with --num_samples={args.num_samples}: MAUVE clusters the '
      'features into num_samples / 10 buckets; use >= 20 (papers: 1000+).'
    )

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
  batch = min(args.batch or args.num_samples, args.num_samples)
  calls = -(-args.num_samples // batch)

  rows = []
  for entry in build_grid(args):
    sampler = get_sampler(entry['name'], **entry['params'])
    per_seed = []
    for seed in seeds:
      tokens, stats = draw_samples(
        run, sampler, num_samples=batch, seed=seed * calls, light_run=light,
        calls=calls,
      )  # fmt: skip
      tokens = tokens[: args.num_samples]
      stats['num_samples'] = len(tokens)
      texts = [run.data.tokenizer.decode(r) for r in tokens]
      quality = sample_quality(texts, tokens, scorer=scorer,
                               same_tokenizer=same)  # fmt: skip
      if ref_feats is not None:
        rows_s = list(tokens) if same else scorer.encode(texts)
        quality['mauve'] = mauve_score(ref_feats, scorer.features(rows_s))
      per_seed.append({**entry, **stats, **quality, 'sample_seed': seed,
                       'example': texts[0][:200]})  # fmt: skip
    row = combine_seeds(per_seed)
    rows.append(row)
    mauve = f', MAUVE {row["mauve"]:.3f}' if 'mauve' in row else ''
    print(
      f'{entry["label"]}: NFE {row["nfe"]:g} gen-ppl '
      f'{row["gen_ppl_corpus"]:.3f}'
      f' (sample-mean {row["gen_ppl_sample_mean"]:.3f}) entropy '
      f'{row["unigram_entropy_bits"]:.3f} bits{mauve}, '
      f'{row["seconds_per_sample"]:.3f} s/sample ({len(seeds)} seed(s))',
      flush=True,
    )
  slim = lambda r: {
    k: v for k, v in r.items() if not isinstance(v, list) or k == 'per_seed'
  }
  with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump({'reference': slim(reference), 'seeds': seeds,
               'rows': [slim(r) for r in rows]}, f, indent=2)  # fmt: skip
  with open(os.path.join(out, 'table.md'), 'w') as f:
    f.write(table(rows, reference))
  plot(rows, reference, os.path.join(out, 'pareto.png'))
  print(table(rows, reference))
  print(f'wrote {out}/results.json, table.md, pareto.png')


if __name__ == '__main__':
  main()
