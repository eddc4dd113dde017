"""Likelihood evaluation: estimator variance and the lm-eval backend.

The project's own targets for scoring runs the way the field compares
models: Monte-Carlo bound estimates whose spread is measured and cut
(`ddlm_jax.evaluation.estimators`), and lm-evaluation-harness through the
`ddlm_jax` backend (`ddlm_jax.interop.lm_eval_backend`). The estimator
claims are measured by `experiments/benchmarks/likelihood_variance.py`
(one value per training seed of the quickstart); the lm-eval claim by
lm-eval's own evaluator on the local tasks of tests/fixtures/lm_eval.
"""

from experiments.claims.spec import EQUAL_STEPS, NAMED_BASELINE, TARGET, Claim
from experiments.claims.verdict import Compare, Threshold

_VARIANCE = (
  'python -m experiments.benchmarks.likelihood_variance '
  '--workdir=runs/quickstart_s0 --workdir=runs/quickstart_s1 '
  '--workdir=runs/quickstart_s2 --record'
)
_LM_EVAL = (
  'python -m ddlm_jax.interop.lm_eval_backend --model ddlm_jax '
  '--model_args workdir=RUN,samples=64 --tasks ddlm_local_mc,ddlm_local_ppl '
  '--include_path tests/fixtures/lm_eval (RUN: runs/quickstart and '
  'runs/ar_quickstart)'
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
    command=_VARIANCE,
    bound='full',
    cost_minutes=60,
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
    command=_VARIANCE,
    bound='full',
    cost_minutes=60,
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
    command=_LM_EVAL,
    bound='full / exact NLL',
    cost_minutes=30,
  ),
)
