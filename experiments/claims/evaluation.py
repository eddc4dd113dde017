"""Likelihood evaluation: estimator variance and the lm-eval backend.

The project's own targets for scoring runs the way the field compares
models: Monte-Carlo bound estimates whose spread is measured and cut
(`ddlm_jax.evaluation.estimators`), and lm-evaluation-harness through the
`ddlm_jax` backend (`ddlm_jax.interop.lm_eval_backend`). The estimator
claims are measured by `experiments/benchmarks/likelihood_variance.py`
on each training seed's quickstart run; the lm-eval claim by lm-eval's
own evaluator (`experiments/benchmarks/lm_eval_runs.py`) on the local
tasks of tests/fixtures/lm_eval.
"""

import functools

from experiments.claims.project import QUICKSTART
from experiments.claims.spec import (
  AR_SCORER,
  EQUAL_STEPS,
  NAMED_BASELINE,
  TARGET,
  Arm,
  Claim,
  Measurement,
)
from experiments.claims.verdict import Compare, Threshold


def best_of_16(case: dict) -> str:
  """The 16-draw estimator with the smallest spread in one case."""
  at_16 = {k: v for k, v in case.items() if k.endswith('@16')}
  return min(at_16, key=lambda k: at_16[k]['stderr'])


def estimator_values(result: dict, claim: str) -> dict[str, float]:
  """One training seed's arms of an estimator claim, from the JSON of
  `experiments.benchmarks.likelihood_variance` on that seed's run (full
  bound): the spreads of the best 16-draw estimator and of 128 i.i.d.
  draws, or the best one's |bias| over its standard error."""
  full = result['full']
  best = full[best_of_16(full)]
  if claim == 'best-16-draws-beat-iid-128':
    return {'best@16': best['stderr'], 'iid@128': full['iid@128']['stderr']}
  if claim == 'estimators-unbiased':
    return {'best@16': abs(best['bias']) / best['bias_stderr']}
  raise KeyError(f'{claim} is not an estimator claim')


def estimator_notes(results, claim: str) -> str:
  """The setting and the per-estimator table behind an estimator claim's
  values, from likelihood_variance's JSON of every training seed."""
  first = results[0]
  setup = (
    f'{first["texts"]} validation rows of {first["seq_len"]} tokens, '
    f'{first["repeats"]} repeats per estimator, reference '
    f'{first["full"]["reference"]["samples"]} i.i.d. draws; runs at step '
    + ', '.join(str(r['step']) for r in results)
  )
  best = ', '.join(best_of_16(r['full']) for r in results)

  def table(fmt):
    """'seed S, case: name value, ...; ...' over the runs and cases."""
    parts = []
    for r in results:
      for case in ('full', 'conditional'):
        if case in r:
          cells = ', '.join(
            f'{k} {fmt(v)}' for k, v in r[case].items() if k != 'reference'
          )
          parts.append(f'seed {r["seed"]}, {case}: {cells}')
    return '; '.join(parts)

  if claim == 'best-16-draws-beat-iid-128':
    return (
      f'Best 16-draw estimator per seed: {best}. {setup}. Draws of each '
      'that match 128 i.i.d. draws (S (its spread / the iid@128 '
      'spread)^2): '
      + table(lambda v: f'{v["draws_to_match_iid_128"]:.0f}')
      + '. Standard error (spread over repeats, nats per row): '
      + table(lambda v: f'{v["stderr"]:.3f}')
      + '.'
    )
  if claim == 'estimators-unbiased':
    return (
      'Values: |mean of the repeats - reference| / its standard error, '
      f'for the best 16-draw estimator ({best}; full bound). {setup}. '
      'Bias (nats per row) +- its standard error: '
      + table(lambda v: f'{v["bias"]:+.3f} +- {v["bias_stderr"]:.3f}')
      + '.'
    )
  raise KeyError(f'{claim} is not an estimator claim')


# One process per training seed of the quickstart (the runs of
# quickstart-bound), measuring every estimator on its validation rows.
_VARIANCE = functools.partial(
  Measurement,
  'experiments.benchmarks.likelihood_variance',
  ('--workdir={run:quickstart}', '--texts=4', '--repeats=16',
   '--reference=4096', '--cases=full,conditional'),
  '',
  result_flag='--out',
  per_seed=True,
  smoke_args=('--workdir={run:quickstart}', '--texts=1', '--repeats=2',
              '--reference=16', '--cases=full'),
)  # fmt: skip
_QUICKSTART = Arm('quickstart', QUICKSTART)


def _variance(claim: str) -> Measurement:
  """The estimator measurement with the claim's reader and notes."""
  return _VARIANCE(
    functools.partial(estimator_values, claim=claim),
    describe=functools.partial(estimator_notes, claim=claim),
  )


def lm_eval_bits_per_byte(scores: dict) -> dict[str, float]:
  """Each run's bits per byte on the local perplexity task, from the JSON
  of `experiments.benchmarks.lm_eval_runs` (one training seed)."""
  return {
    name: tasks['ddlm_local_ppl']['bits_per_byte,none']
    for name, tasks in scores.items()
  }


# lm-eval's evaluator on both runs of one training seed: the quickstart
# (quickstart-bound's runs) and its AR twin (the sampling claims' scorer).
_LM_EVAL_RUNS = ('--run=mdlm={run:mdlm}', '--run=ar={run:ar}')
_LM_EVAL = Measurement(
  'experiments.benchmarks.lm_eval_runs',
  (*_LM_EVAL_RUNS, '--samples=64'),
  '',
  lm_eval_bits_per_byte,
  per_seed=True,
  smoke_args=(*_LM_EVAL_RUNS, '--samples=2', '--tasks=ddlm_local_ppl'),
)

CLAIMS = (
  Claim(
    id='best-16-draws-beat-iid-128',
    family='bounds',
    paper='project target',
    arxiv='',
    table='README (lm-evaluation-harness)',
    statement=(
      "On the quickstart model's validation rows, 16 draws of the best "
      'estimator estimate the full bound with a smaller standard error '
      'than 128 i.i.d. draws.'
    ),
    paper_value='target: stderr(best@16) < stderr(iid@128)',
    metric='standard error of the full bound, nats per 128-token row',
    protocol=NAMED_BASELINE,
    rule=Compare('best@16', 'iid@128', 'lower'),
    arms=(_QUICKSTART,),
    measurement=_variance('best-16-draws-beat-iid-128'),
    command='python -m experiments.reproduce best-16-draws-beat-iid-128',
    bound='full',
    cost_minutes=85,  # The quickstart's 3 runs, then ~20 min per seed.
  ),
  Claim(
    id='estimators-unbiased',
    family='bounds',
    paper='project target',
    arxiv='',
    table='README (lm-evaluation-harness)',
    statement=(
      'The best 16-draw estimator agrees with a 4096-draw i.i.d. '
      'reference on the quickstart model: its bias is within 3 standard '
      'errors.'
    ),
    paper_value='target: |bias| <= 3 standard errors',
    metric='|bias| / its standard error (full bound)',
    protocol=TARGET,
    rule=Threshold('best@16', 3.0, '<='),
    arms=(_QUICKSTART,),
    measurement=_variance('estimators-unbiased'),
    command='python -m experiments.reproduce estimators-unbiased',
    bound='full',
    cost_minutes=85,
  ),
  Claim(
    id='lm-eval-ar-below-mdlm',
    family='quickstart',
    paper='project observation (MDLM as the masked model)',
    arxiv='2406.07524',
    table='not in the paper (the local lm-eval tasks)',
    statement=(
      "Through lm-eval's evaluator on the local perplexity task, the AR "
      "twin's exact bits per byte are below the quickstart MDLM's bound."
    ),
    paper_value='-',
    metric='ddlm_local_ppl bits_per_byte (AR exact, MDLM bound)',
    protocol=EQUAL_STEPS,
    rule=Compare('ar', 'mdlm', 'lower'),
    arms=(Arm('mdlm', QUICKSTART), AR_SCORER),
    measurement=_LM_EVAL,
    command='python -m experiments.reproduce lm-eval-ar-below-mdlm',
    bound='full / exact NLL',
    cost_minutes=60,  # 6 quickstart runs (shared), then ~3 min per seed.
  ),
)
