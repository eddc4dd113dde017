"""Variance of the bound's Monte-Carlo estimators on a trained run.

  python -m experiments.benchmarks.likelihood_variance --workdir=RUN \
    [--texts=8] [--repeats=32] [--reference=4096] [--out=FILE.json]

For each of --texts rows of the run's validation text (one row of
data.seq_len each, framed as in training, spaced evenly over the split;
`--text=passage` uses a fixed passage instead, for runs whose corpus is
not a local text corpus) it estimates the bound --repeats times with each
estimator of `ddlm_jax.evaluation.estimators` at 16 draws, i.i.d. at 128
draws, and once with a --reference-draw i.i.d. estimate. Reported per estimator
(nats per text, averaged over texts):

  stderr_16 / stderr_128   the spread (standard deviation over repeats) of
                           an estimate, i.e. its actual standard error;
  reported_stderr          the mean standard error the estimator reports;
  bias                     mean over repeats minus the reference, with the
                           reference's own standard error beside it;
  draws_to_match_iid_128   S * (its spread / the iid@128 spread)^2: the
                           draws it needs to be as precise as 128 i.i.d.

The conditional case (first half of the row kept, second half scored) is
reported too, as lm-eval's loglikelihood computes it, and stratified
times with one mask draw shared by all samples (`+shared_mask`). Spreads
only, no timing: the figures do not depend on machine load.

`--workdir` may be given once per training seed. `python -m
experiments.reproduce best-16-draws-beat-iid-128` (or
`estimators-unbiased`; experiments/claims/evaluation.py) trains the
quickstart's seeds and runs this once per seed.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import ddlm_jax
from ddlm_jax.data import corpus
from ddlm_jax.evaluation import estimators as est
from ddlm_jax.training.config import ConfigError

PASSAGE = (
  'KING: What say you, lords? Shall we go in to supper? QUEEN: My lord, '
  'the night is cold and the hour late. FIRST LORD: Let us attend the '
  'king, and keep the watch till morning. HAMLET: I have of late lost all '
  'my mirth, and know not why; this goodly frame, the earth, seems to me '
  'a sterile promontory. '
)


def validation_text(config) -> str:
  """The run's validation split, for the local text corpora."""
  data = config.data
  if data.corpus == 'shakespeare':
    return corpus.load_text_splits('shakespeare')['validation']
  if data.corpus == 'text_files':
    files = {k: v for k, v in data.files.items() if v}
    return corpus.load_text_splits('text_files', **files)['validation']
  raise ConfigError(
    f'data.corpus={data.corpus!r} is not a local text corpus; give '
    '--text=passage.'
  )


def rows_of(model, count: int, text: str = 'validation') -> np.ndarray:
  """`count` full rows [count, L], spaced evenly over the text."""
  source = validation_text(model.config) if text == 'validation' else PASSAGE
  ids = np.asarray(model.tokenizer.encode(source), np.int32)
  if text != 'validation':
    ids = np.asarray(model.tokenizer.encode(source * 20), np.int32)
  rows, masks = model._rows(ids)
  full = np.flatnonzero(masks.min(-1) > 0)  # Rows without padding.
  if len(full) < count:
    raise ConfigError(
      f'--texts={count}: the text gives {len(full)} full rows; ask for fewer.'
    )
  pick = full[np.linspace(0, len(full) - 1, count).round().astype(int)]
  return rows[pick]


def draws(
  model, x_BxL, loss_BxL, keep_BxL, key, samples, estimator, share=False
):
  return np.asarray(
    est.bound_draws(
      model.params,
      key,
      x_BxL,
      loss_BxL,
      keep_BxL,
      graphdef=model.graphdef,
      process=model.process.evaluation_process,
      samples=samples,
      estimator=estimator,
      share_across_samples=share,
    ),
    np.float64,
  )


def measure(model, x, loss, keep, *, repeats, reference, estimators):
  """{estimator@S: spread, reported stderr, bias} averaged over rows."""
  key = jax.random.key(0)
  ref_S = draws(
    model, x, loss, keep, jax.random.fold_in(key, 99), reference, 'iid'
  )
  ref_mean, ref_err = est.mean_and_stderr(ref_S, 'iid')
  out = {}
  for name, samples, share in estimators:
    means, errs = [], []
    for r in range(repeats):
      k = jax.random.fold_in(key, r)
      y = draws(model, x, loss, keep, k, samples, name, share)
      m, e = est.mean_and_stderr(y, name)
      means.append(m)
      errs.append(e)
    means, errs = np.stack(means), np.stack(errs)
    out[f'{name}{"+shared_mask" if share else ""}@{samples}'] = {
      'stderr': float(means.std(0, ddof=1).mean()),
      'reported_stderr': float(errs.mean()),
      'bias': float((means.mean(0) - ref_mean).mean()),
      'bias_stderr': float(
        np.sqrt(np.mean(means.var(0, ddof=1) / repeats + ref_err**2))
      ),
    }
  base = out['iid@128']['stderr']
  for name, row in out.items():
    samples = int(name.split('@')[1])
    row['draws_to_match_iid_128'] = samples * (row['stderr'] / base) ** 2
  out['reference'] = {
    'samples': reference,
    'mean': float(ref_mean.mean()),
    'stderr': float(np.sqrt(np.mean(ref_err**2))),
  }
  return out


def measure_run(workdir, *, texts, repeats, reference, text, cases) -> dict:
  """The benchmark's output (see the module docstring) for one run."""
  model = ddlm_jax.load(workdir)
  process = model.process.evaluation_process
  if not est.supports_estimators(process):
    raise ConfigError(
      f'{type(process).__name__}: the estimators steer masked diffusion '
      'draws; give a masked-diffusion run.'
    )
  x = rows_of(model, texts, text)
  length = x.shape[1]
  kinds = [
    ('iid', 128, False),
    ('iid', 16, False),
    ('stratified', 16, False),
    ('stratified', 16, True),  # One mask draw shared by the 16 samples.
    ('antithetic', 16, False),
  ]
  if not model.config.model.get('time_conditioning', False):
    kinds.append(('counts', 16, False))
  full = np.ones(x.shape, np.float32)
  half = np.zeros(x.shape, np.float32)
  half[:, : length // 2] = 1.0
  masks = {'full': (full, None), 'conditional': (1.0 - half, half)}
  result = {
    'workdir': workdir,
    'seed': int(model.config.seed),
    'step': model.step,
    'text': text,
    'seq_len': length,
    'texts': len(x),
    'repeats': repeats,
  }
  for case in cases:
    loss, keep = masks[case]
    result[case] = measure(
      model,
      x,
      loss,
      keep,
      repeats=repeats,
      reference=reference,
      estimators=kinds,
    )
  return result


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', action='append', default=[])
  parser.add_argument('--texts', type=int, default=8)
  parser.add_argument('--repeats', type=int, default=32)
  parser.add_argument('--reference', type=int, default=4096)
  parser.add_argument(
    '--text', choices=('validation', 'passage'), default='validation'
  )
  parser.add_argument('--cases', default='full,conditional')
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  cases = [c for c in args.cases.split(',') if c]
  bad = [c for c in cases if c not in ('full', 'conditional')]
  if bad or 'full' not in cases:
    raise ConfigError(
      f'--cases={args.cases}: list full and optionally conditional.'
    )
  if not args.workdir:
    raise ConfigError('give --workdir=RUN (once per run to measure).')
  runs = [
    measure_run(
      workdir,
      texts=args.texts,
      repeats=args.repeats,
      reference=args.reference,
      text=args.text,
      cases=cases,
    )
    for workdir in args.workdir
  ]
  result = runs[0] if len(runs) == 1 else {'runs': runs}
  text = json.dumps(result, indent=2)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')
  return result


if __name__ == '__main__':
  main()
