"""The speed-quality frontier of every sampler that applies to a run.

  python -m experiments.frontier \
    --config=experiments/configs/quickstart_bpe.py \
    --workdir=runs/quickstart_bpe [--scorer=runs/quickstart_bpe_ar] \
    [--samplers='threshold;approx_cache'] [--temperatures=0.8,0.9,1.0] \
    [--points=0] [--num_samples=16] [--seeds=0] [--out=DIR]

WORKDIR is a trained run of --config (the command refuses a config whose
process, model or tokenizer differ from the run's); samples have --config's
data.seq_len, which may differ from the training length (e.g.
--config.data.seq_len=512 for a run trained at 256). Every registered
sampler that applies to the run's process family (`samplers_for`) runs over
its natural knob (`knob_grid`): the step count of the step samplers, gamma
of 'eb', the threshold of 'threshold', the refresh period of
'approx_cache' (dual and prefix caches, for plain Transformers, beside its
uncached 'none' row: the caches' speed-up is against it), the threshold
and step count of the sampler inside 'block'; samplers without a knob run
once, and samplers that need a second network ('scheduled') are skipped.
--samplers keeps only the named ones; --points=K keeps K evenly spaced
knob values of each.

Every point runs at each --temperatures value. Quality is compared at
matched entropy: the AR twin's gen-NLL (nats per token, the log of the
corpus gen-ppl) is interpolated, over the temperature sweep, at the
unigram entropy of the validation text (`matched_value`; outside the swept
range the nearest value, with the entropy gap reported). Per point the
table holds NFE (batched calls), tokens per call (generated tokens / NFE),
tokens/s (wall clock of the compiled sampler), FLOPs per sample (the
caches' window calls counted at their size), gen-NLL and unigram entropy
at T = 1 and matched, and for the approximate caches the meter's KL
(mean, max, exact/approximate). Per sampler curve, `curve_area` gives the
area under matched gen-NLL against log2(tokens per call) from its first to
its last point, and that area over the width (the mean gen-NLL over the
parallelism range; lower is better). Without a scorer (smoke runs) the
quality columns are empty.

Writes OUT/frontier.json, OUT/frontier.md and OUT/frontier.png (matched
gen-NLL, unigram entropy and tokens/s against tokens per call); OUT
defaults to WORKDIR/frontier. Timing numbers mean something only on an
idle machine.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

import numpy as np

from ddlm_jax.diffusion.base import BlockProcess

STEP_FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1)
GAMMAS = (0.0, 0.5, 1.0, 2.0, 4.0)
THRESHOLDS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.5)
REFRESH = (1, 8, 4, 0)  # 1 = exact; 0 = at block starts only.
TWO_NETWORK = ('scheduled', 'ddpd')


@dataclasses.dataclass
class Options:
  """The command's settings (flags)."""

  scorer: str = ''
  samplers: str = ''
  temperatures: tuple = (0.8, 0.9, 1.0)
  points: int = 0
  num_samples: int = 16
  seeds: tuple = (0,)
  out: str = ''


# ----------------------------------------------------------- pure pieces --


def matched_value(entropies, values, target: float) -> tuple[float, float]:
  """(value at entropy `target`, entropy gap) over a temperature sweep.

  Linear interpolation in entropy between the two swept points around the
  target; outside the swept range, the value of the nearest point and the
  entropy distance to it (0 inside the range).
  """
  h = np.asarray(entropies, float)
  v = np.asarray(values, float)
  if h.size == 0:
    raise ValueError('matched_value needs at least one point.')
  order = np.argsort(h)
  h, v = h[order], v[order]
  if target <= h[0]:
    return float(v[0]), float(h[0] - target)
  if target >= h[-1]:
    return float(v[-1]), float(target - h[-1])
  return float(np.interp(target, h, v)), 0.0


def curve_area(xs, ys) -> tuple[float, float]:
  """(trapezoid area of y over x, area / width) after sorting by x.

  One point (or all at one x) has area 0 and its y as the mean.
  """
  x = np.asarray(xs, float)
  y = np.asarray(ys, float)
  order = np.argsort(x, kind='stable')
  x, y = x[order], y[order]
  width = float(x[-1] - x[0]) if x.size else 0.0
  if x.size < 2 or width <= 0:
    return 0.0, float(np.mean(y)) if y.size else math.nan
  area = float(np.sum(0.5 * (y[1:] + y[:-1]) * np.diff(x)))
  return area, area / width


def spread(values, points: int) -> list:
  """`points` evenly spaced entries of values (all when 0 or enough)."""
  values = list(values)
  if not points or points >= len(values):
    return values
  idx = np.unique(np.round(np.linspace(0, len(values) - 1, points)))
  return [values[int(i)] for i in idx]


def step_counts(length: int) -> list[int]:
  return sorted({max(1, round(length * f)) for f in STEP_FRACTIONS})


def knob_grid(name: str, length: int, *, block_size: int = 0, cache_ok=True):
  """[(curve label, knob name, params)] of one sampler over its knob.

  An empty list means the sampler does not run here (two networks, or an
  approximate cache without a cache-capable model).
  """
  from ddlm_jax.sampling.registry import sampler_params

  if name in TWO_NETWORK:
    return []
  params = sampler_params(name)
  if name == 'threshold':
    return [(name, 'threshold', {'threshold': t}) for t in THRESHOLDS]
  if name == 'eb':
    return [(name, 'gamma', {'gamma': g}) for g in GAMMAS]
  if name == 'approx_cache':
    if not cache_ok:
      return []
    # Fast-dLLM's 32-token blocks, at least 4 blocks on short sequences.
    size = max(1, min(32, length // 4))
    # 'none' is the same block-wise decoding without a cache: the baseline
    # of the caches' speed-up (Fast-dLLM's parallel-only row).
    return [(f'{name} none', '', {'cache': 'none', 'block_length': size})] + [
      (f'{name} {cache}', 'refresh',
       {'cache': cache, 'refresh': r, 'block_length': size})
      for cache in ('dual', 'prefix')
      for r in REFRESH
    ]  # fmt: skip
  if name == 'semi_ar':
    blocks = -(-length // 32)
    return [
      (name, 'num_steps', {
        'block_length': 32,
        'inner': 'confidence',
        'inner_params': {'num_steps': max(1, t // blocks)},
      })
      for t in step_counts(length)
    ]  # fmt: skip
  if name == 'block':
    size = block_size or length
    return [
      ('block+threshold', 'threshold',
       {'inner': 'threshold', 'inner_params': {'threshold': t}})
      for t in THRESHOLDS
    ] + [
      ('block+ancestral', 'num_steps',
       {'inner': 'ancestral', 'inner_params': {'num_steps': t}})
      for t in step_counts(size)
    ]  # fmt: skip
  if name == 'did':
    return [(name, 'refine_steps', {'refine_steps': r}) for r in (0, 1, 2)]
  if 'num_steps' in params:
    return [(name, 'num_steps', {'num_steps': t}) for t in step_counts(length)]
  return [(name, '', {})]


def sampler_names(text: str) -> list[str]:
  """The registered names in --samplers ('a;b'); specs with parameters are
  refused, since each sampler runs over its own knob grid."""
  from ddlm_jax.sampling.registry import parse_spec

  names = []
  for spec in filter(None, (s.strip() for s in text.split(';'))):
    name, params = parse_spec(spec)
    if params:
      raise ValueError(
        f'--samplers={text!r}: give sampler names only ({name!r}, not '
        f"{spec!r}); the frontier sets each sampler's parameters itself."
      )
    names.append(name)
  return names


def grid_for(run, opts: Options) -> tuple[list[dict], list[dict]]:
  """(points to run, skipped samplers with the reason) for a run."""
  from ddlm_jax.sampling.common import process_family
  from ddlm_jax.sampling.registry import samplers_for

  family = process_family(run.process)
  names = samplers_for(family)
  if opts.samplers:
    wanted = sampler_names(opts.samplers)
    unknown = sorted(set(wanted) - set(names))
    if unknown:
      raise ValueError(
        f'--samplers names {unknown}, which do not apply to this {family} '
        f'run; choose from {names}.'
      )
    names = [n for n in names if n in wanted]
  length = run.config.data.seq_len
  cache_why = cache_support(_network(run), length)
  block_size = (
    run.process.block_size if isinstance(run.process, BlockProcess) else 0
  )
  points, skipped = [], []
  for name in names:
    grid = knob_grid(
      name, length, block_size=block_size, cache_ok=cache_why is None
    )
    if not grid:
      why = 'needs a light network' if name in TWO_NETWORK else cache_why
      skipped.append({'name': name, 'reason': why})
      continue
    by_curve: dict[str, list] = {}
    for curve, knob, params in grid:
      by_curve.setdefault(curve, []).append((knob, params))
    for curve, entries in by_curve.items():
      for knob, params in spread(entries, opts.points):
        points.append(
          {'name': name, 'curve': curve, 'knob': knob, 'params': params}
        )
  return points, skipped


def cache_support(model, length: int) -> str | None:
  """None if the network runs the approximate caches, else the reason.

  Traced abstractly (no compute): kv_pass refuses block-diffusion,
  causal and state-space backbones with a one-line reason.
  """
  import jax
  import jax.numpy as jnp

  if not hasattr(model, 'kv_pass'):
    return f'{type(model).__name__} has no kv_pass (models.Transformer)'
  try:
    jax.eval_shape(lambda: model.kv_pass(jnp.zeros((1, length), jnp.int32)))
  except ValueError as err:
    return str(err)
  return None


def _network(run):
  from ddlm_jax.evaluation.sample_run import make_apply

  return make_apply(run.graphdef, run.eval_params())


def _knob_value(point):
  knob, params = point['knob'], point['params']
  if not knob:
    return None
  if knob in params:
    return params[knob]
  return params.get('inner_params', {}).get(knob)


def point_label(point) -> str:
  value = _knob_value(point)
  return point['curve'] + ('' if value is None else f' {point["knob"]}={value}')


# ------------------------------------------------------------ the run --


CHECKED_KEYS = (
  'process.kind',
  'model.backbone',
  'model.width',
  'model.depth',
  'data.tokenizer',
)


def check_config(config, saved, workdir: str) -> None:
  """ValueError when --config does not describe the run in --workdir.

  The sequence length may differ: the frontier samples at --config's
  data.seq_len (e.g. 512 from a run trained at 256; rotary positions
  extrapolate).
  """
  for key in CHECKED_KEYS:
    section, field = key.split('.')
    want = config[section].get(field)
    have = saved[section].get(field)
    if want != have:
      raise ValueError(
        f'--config sets {key}={want!r} but the run in {workdir} has '
        f'{have!r}; pass the config the run was trained with.'
      )


def _metered(run, sampler, num_samples: int, seed: int) -> dict:
  """The cache meter's summary for one batch of an approx_cache sampler."""
  import jax

  metered = dataclasses.replace(sampler, meter=True)
  model = _network(run)
  length = run.config.data.seq_len
  out = jax.jit(
    lambda k: metered.generate(
      model, k, run.process, batch=num_samples, length=length
    )
  )(jax.random.key(seed))
  return out.meter.summary(sampler.kind_for(length))


def _measure(run, point, temperature, opts, scorer, same) -> dict:
  from ddlm_jax.evaluation.sample_metrics import sample_quality
  from ddlm_jax.evaluation.sample_run import draw_samples
  from ddlm_jax.sampling.registry import get_sampler

  sampler = get_sampler(
    point['name'], **{**point['params'], 'temperature': temperature}
  )
  rows = []
  for seed in opts.seeds:
    tokens, stats = draw_samples(
      run, sampler, num_samples=opts.num_samples, seed=seed
    )
    texts = [run.data.tokenizer.decode(r) for r in tokens]
    quality = sample_quality(texts, tokens, scorer=scorer, same_tokenizer=same)
    nfe = float(stats['nfe'])
    row = {
      'nfe': nfe,
      'tokens_per_call': tokens.shape[1] / max(nfe, 1.0),
      'tokens_per_sec': stats['tokens_per_sec'],
      'flops_per_sample': stats['flops_per_sample'],
      'entropy': quality['unigram_entropy_nats'],
    }
    if 'gen_ppl_corpus' in quality:
      row['gen_nll'] = math.log(quality['gen_ppl_corpus'])
    rows.append(row)
  out = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
  if point['name'] == 'approx_cache':
    out['meter'] = _metered(run, sampler, opts.num_samples, opts.seeds[0])
  return out


@dataclasses.dataclass
class Loaded:
  """A run ready to sample at --config's length, with its scorer."""

  run: Any
  scorer: Any  # ARScorer or None
  scorer_dir: str
  same_tokenizer: bool
  target_entropy: float  # Unigram entropy of the validation text (nats).
  trained_length: int


def load(config, workdir: str, opts: Options) -> Loaded:
  """The run in `workdir` at config.data.seq_len, its scorer and target."""
  from ddlm_jax.evaluation.sample_metrics import ARScorer, sample_quality
  from ddlm_jax.evaluation.sample_run import reference_texts
  from ddlm_jax.tasks.language_model import load_config, load_run

  if not opts.temperatures or min(opts.temperatures) <= 0:
    raise ValueError(
      f'--temperatures={opts.temperatures}: give positive values, e.g. '
      '0.8,0.9,1.0.'
    )
  if opts.num_samples < 1 or opts.points < 0 or not opts.seeds:
    raise ValueError(
      f'--num_samples={opts.num_samples} must be >= 1, --points='
      f'{opts.points} >= 0 and --seeds non-empty.'
    )
  sampler_names(opts.samplers)  # Bad names are refused before any load.
  saved = load_config(workdir)
  check_config(config, saved, workdir)
  length = int(config.data.seq_len)
  trained_length = int(saved.data.seq_len)
  overrides = {'data.seq_len': length} if length != trained_length else None
  run = load_run(workdir, overrides)
  if run.process.causal:
    raise ValueError(
      f'{workdir} is an autoregressive run; the frontier compares diffusion '
      'samplers (pass the AR twin as --scorer).'
    )
  scorer_dir = opts.scorer or config.sample.get('scorer', '')
  scorer = ARScorer.from_run(load_run(scorer_dir)) if scorer_dir else None
  same = scorer is not None and scorer.tokenizer == run.data.tokenizer
  refs = reference_texts(run, opts.num_samples)
  ref_tokens = [run.data.tokenizer.encode(t) for t in refs]
  reference = sample_quality(refs, ref_tokens)
  return Loaded(
    run, scorer, scorer_dir, same, reference['unigram_entropy_nats'],
    trained_length,
  )  # fmt: skip


def measure(loaded: Loaded, points, opts: Options, skipped: list) -> list:
  """One row per point (over opts.temperatures); failures go to skipped."""
  rows = []
  for point in points:
    sweep = {}
    for temperature in opts.temperatures:
      try:
        sweep[temperature] = _measure(
          loaded.run,
          point,
          temperature,
          opts,
          loaded.scorer,
          loaded.same_tokenizer,
        )
      except (ValueError, TypeError) as err:
        skipped.append({'name': point_label(point), 'reason': str(err)})
        break
    if len(sweep) < len(opts.temperatures):
      continue
    row = _summarise(point, sweep, loaded.target_entropy)
    rows.append(row)
    print(_line(row), flush=True)
  return rows


def frontier(config, workdir: str, opts: Options) -> dict:
  """Runs the frontier; writes and returns {'rows', 'curves', ...}."""
  loaded = load(config, workdir, opts)
  points, skipped = grid_for(loaded.run, opts)
  rows = measure(loaded, points, opts, skipped)
  return write(loaded, workdir, rows, skipped, opts)


def write(loaded: Loaded, workdir: str, rows, skipped, opts: Options) -> dict:
  """OUT/frontier.json, .md and .png of measured rows; returns the JSON."""
  curves = _curves(rows)
  target = loaded.target_entropy
  result = {
    'workdir': workdir,
    'scorer': loaded.scorer_dir,
    'length': int(loaded.run.settings.data.seq_len),
    'trained_length': loaded.trained_length,
    'target_entropy': target,
    'temperatures': list(opts.temperatures),
    'seeds': list(opts.seeds),
    'num_samples': opts.num_samples,
    'rows': rows,
    'curves': curves,
    'skipped': skipped,
  }
  out = opts.out or os.path.join(workdir, 'frontier')
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, 'frontier.json'), 'w') as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(out, 'frontier.md'), 'w') as f:
    f.write(table(rows, curves, target))
  plot(rows, os.path.join(out, 'frontier.png'))
  print(f'wrote {out}/frontier.json, frontier.md, frontier.png')
  return result


def _summarise(point, sweep: dict, target: float) -> dict:
  """One row: the T = 1 (or highest T) values and the matched ones."""
  temps = sorted(sweep)
  base = sweep[1.0] if 1.0 in sweep else sweep[temps[-1]]
  row = {
    'label': point_label(point),
    'name': point['name'],
    'curve': point['curve'],
    'knob': point['knob'],
    'knob_value': _knob_value(point),
    'params': point['params'],
    **{k: v for k, v in base.items() if k != 'meter'},
    'by_temperature': {str(t): sweep[t] for t in temps},
  }
  if 'meter' in base:
    row['meter'] = base['meter']
  if all('gen_nll' in sweep[t] for t in temps):
    value, gap = matched_value(
      [sweep[t]['entropy'] for t in temps],
      [sweep[t]['gen_nll'] for t in temps],
      target,
    )
    row['gen_nll_matched'] = value
    row['entropy_gap'] = gap
  return row


def _curves(rows) -> dict:
  """Per curve: area under matched gen-NLL vs log2(tokens per call)."""
  out = {}
  for curve in dict.fromkeys(r['curve'] for r in rows):
    pts = [r for r in rows if r['curve'] == curve]
    entry = {
      'points': len(pts),
      'log2_tokens_per_call': [
        min(math.log2(r['tokens_per_call']) for r in pts),
        max(math.log2(r['tokens_per_call']) for r in pts),
      ],
    }
    if all('gen_nll_matched' in r for r in pts):
      area, mean = curve_area(
        [math.log2(r['tokens_per_call']) for r in pts],
        [r['gen_nll_matched'] for r in pts],
      )
      entry.update(auc=area, auc_per_octave=mean)
    out[curve] = entry
  return out


COLUMNS = [
  ('label', 'sampler', '{}'),
  ('nfe', 'NFE', '{:g}'),
  ('tokens_per_call', 'tokens/call', '{:.2f}'),
  ('tokens_per_sec', 'tokens/s', '{:.0f}'),
  ('flops_per_sample', 'FLOPs/sample', '{:.3g}'),
  ('gen_nll', 'gen-NLL (T=1)', '{:.3f}'),
  ('gen_nll_matched', 'gen-NLL (matched H)', '{:.3f}'),
  ('entropy', 'entropy nats (T=1)', '{:.3f}'),
  ('entropy_gap', 'H gap', '{:.3f}'),
]


def table(rows, curves, target: float) -> str:
  cols = [c for c in COLUMNS if any(c[0] in r for r in rows)]
  lines = [
    f'Matched entropy: {target:.3f} nats (validation text).',
    '',
    '| ' + ' | '.join(c[1] for c in cols) + ' | cache KL mean / max |',
    '|' + '---|' * (len(cols) + 1),
  ]
  for r in rows:
    cells = ['' if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in cols]
    meter = r.get('meter')
    cells.append(
      ''
      if meter is None
      else f'{meter["kl_mean"]:.2e} / {meter["kl_max"]:.2e} '
      f'({meter["cache_kind"]})'
    )
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', '| curve | points | log2 tokens/call | AUC | AUC / octave |',
            '|---|---|---|---|---|']  # fmt: skip
  for curve, c in curves.items():
    lo, hi = c['log2_tokens_per_call']
    auc = '' if 'auc' not in c else f'{c["auc"]:.3f}'
    per = '' if 'auc' not in c else f'{c["auc_per_octave"]:.3f}'
    lines.append(
      f'| {curve} | {c["points"]} | {lo:.2f}..{hi:.2f} | {auc} | {per} |'
    )
  return '\n'.join(lines) + '\n'


def plot(rows, path: str) -> None:
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
  quality = (
    'gen_nll_matched' if any('gen_nll_matched' in r for r in rows) else None
  )
  panels = [
    (quality, 'AR-twin gen-NLL at matched entropy (nats/token)'),
    ('entropy', 'unigram entropy at T=1 (nats)'),
    ('tokens_per_sec', 'tokens/s'),
  ]
  curves = list(dict.fromkeys(r['curve'] for r in rows))
  colors = plt.cm.tab20(np.linspace(0, 1, max(len(curves), 1)))
  for ax, (key, ylabel) in zip(axes, panels):
    for curve, color in zip(curves, colors):
      pts = sorted(
        (r['tokens_per_call'], r[key])
        for r in rows
        if r['curve'] == curve and key and r.get(key) is not None
      )
      if pts:
        ax.plot(*zip(*pts), 'o-', color=color, label=curve, alpha=0.85)
    ax.set_xscale('log', base=2)
    ax.set_xlabel('tokens per network call')
    ax.set_ylabel(ylabel if key else 'no scorer: gen-NLL not measured')
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _line(row) -> str:
  q = row.get('gen_nll_matched')
  quality = '' if q is None else f', gen-NLL(matched) {q:.3f}'
  return (
    f'{row["label"]}: NFE {row["nfe"]:g}, {row["tokens_per_call"]:.2f} '
    f'tokens/call, {row["tokens_per_sec"]:.0f} tokens/s, entropy '
    f'{row["entropy"]:.3f}{quality}'
  )


# ---------------------------------------------------------------- CLI --


def _floats(text: str) -> tuple:
  return tuple(float(x) for x in text.split(',') if x.strip())


def _ints(text: str) -> tuple:
  return tuple(int(x) for x in text.split(',') if x.strip())


def main(argv=None):
  from absl import app, flags, logging
  from ml_collections import config_flags

  from experiments.flag_errors import parse_flags

  config_flag = config_flags.DEFINE_config_file(
    'config', None, 'The run config (path[:preset]).', lock_config=True
  )
  workdir = flags.DEFINE_string('workdir', None, 'The trained run.')
  scorer = flags.DEFINE_string('scorer', '', 'AR twin run (default: '
                               'config.sample.scorer).')  # fmt: skip
  samplers = flags.DEFINE_string('samplers', '', "names, e.g. 'eb;threshold'")
  temps = flags.DEFINE_string('temperatures', '0.8,0.9,1.0', '')
  points = flags.DEFINE_integer('points', 0, 'knob values per sampler (0: all)')
  num = flags.DEFINE_integer('num_samples', 16, '')
  seeds = flags.DEFINE_string('seeds', '0', 'sampling seeds, e.g. 0,1,2')
  out = flags.DEFINE_string('out', '', 'default WORKDIR/frontier')
  flags.mark_flags_as_required(['config', 'workdir'])

  def run_main(_):
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs restores at INFO.
    opts = Options(
      scorer=scorer.value,
      samplers=samplers.value,
      temperatures=_floats(temps.value),
      points=points.value,
      num_samples=num.value,
      seeds=_ints(seeds.value),
      out=out.value,
    )
    try:
      frontier(config_flag.value, workdir.value, opts)
    except (ValueError, FileNotFoundError) as err:
      print(f'error: {type(err).__name__}: {err}', file=sys.stderr)
      sys.exit(2)

  app.run(run_main, argv=argv, flags_parser=parse_flags)


if __name__ == '__main__':
  main()
