"""Variance of the bound's Monte-Carlo estimators on a trained run.

  python -m experiments.benchmarks.likelihood_variance --workdir=RUN \
    [--texts=8] [--repeats=32] [--reference=4096] [--out=FILE.json]

For each of --texts rows of held-out-style text (one row of data.seq_len
each, drawn from the run's tokenizer round trip of a fixed passage) it
estimates the bound --repeats times with each estimator of
`ddlm_jax.evaluation.estimators` at 16 draws, i.i.d. at 128 draws, and
once with a --reference-draw i.i.d. estimate. Reported per estimator
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
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import ddlm_jax
from ddlm_jax.evaluation import estimators as est

PASSAGE = (
  'KING: What say you, lords? Shall we go in to supper? QUEEN: My lord, '
  'the night is cold and the hour late. FIRST LORD: Let us attend the '
  'king, and keep the watch till morning. HAMLET: I have of late lost all '
  'my mirth, and know not why; this goodly frame, the earth, seems to me '
  'a sterile promontory. '
)


def rows_of(model, count: int) -> np.ndarray:
  """`count` full rows [count, L] cut from the passage repeated."""
  ids = np.asarray(model.tokenizer.encode(PASSAGE * 20), np.int32)
  rows, _ = model._rows(ids)
  return rows[:count]


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


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--texts', type=int, default=8)
  parser.add_argument('--repeats', type=int, default=32)
  parser.add_argument('--reference', type=int, default=4096)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  model = ddlm_jax.load(args.workdir)
  process = model.process.evaluation_process
  if not est.supports_estimators(process):
    raise SystemExit(
      f'{type(process).__name__}: the estimators steer masked diffusion '
      'draws; give a masked-diffusion run.'
    )
  x = rows_of(model, args.texts)
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
  result = {
    'workdir': args.workdir,
    'step': model.step,
    'seq_len': length,
    'texts': len(x),
    'repeats': args.repeats,
    'full': measure(
      model,
      x,
      full,
      None,
      repeats=args.repeats,
      reference=args.reference,
      estimators=kinds,
    ),
    'conditional': measure(
      model,
      x,
      1.0 - half,
      half,
      repeats=args.repeats,
      reference=args.reference,
      estimators=kinds,
    ),
  }
  text = json.dumps(result, indent=2)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')
  return result


if __name__ == '__main__':
  main()
