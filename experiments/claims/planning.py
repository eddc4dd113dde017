"""Planner -> executor pipelines (arXiv 2510.15244) and MDM planning
(arXiv 2410.14157), on arithmetic, Sudoku 4x4, paths and Countdown.

The papers' planners are pretrained 7B-scale diffusion LMs; ours are
width-64 MDLMs trained for 1000-9000 steps from scratch, which each
pipeline claim states as its budget fraction (parameters over the paper's).
The MDM planning claims carry none: that paper's model sizes are not
recorded here, so a result against them stands as a miss.
"""

import functools
from collections.abc import Mapping

from experiments.claims.spec import NAMED_BASELINE, Claim, Measurement
from experiments.claims.verdict import Compare

_PE = 'DDLM planner -> ARM executor'
_PE_ARXIV = '2510.15244'
_MDM = 'MDM planning (subgoal imbalance)'
_MDM_ARXIV = '2410.14157'
_SCALE = 2e5 / 7e9


def pe_accuracy(results: dict, arms: tuple[str, ...]) -> dict[str, float]:
  """sweep_planner_executor's results.json for one seed: each arm's
  accuracy (%) over the task's training levels."""
  out = {}
  for arm in arms:
    (summary,) = results[arm]  # One seed per process.
    out[arm] = 100.0 * summary['accuracy_train_levels']
  return out


def valid_plans(
  results: dict, arms: Mapping[str, str], level: int
) -> dict[str, float]:
  """sweep_planner_executor's results.json for one seed: the valid plans
  (%) at one test level of each claim arm's variant ({arm: variant})."""
  out = {}
  for arm, variant in arms.items():
    (summary,) = results[variant]  # One seed per process.
    share = summary['per_level'][str(level)]['plan_accuracy']
    if share is None:
      raise ValueError(f'variant {variant} writes no plan to check')
    out[arm] = 100.0 * share
  return out


# Each task's sweep runs the variants of all of its claims, so they share
# its processes.
_VARIANTS = {
  'arithmetic': 'latent,text,cot',
  'sudoku4': 'latent,text,cot',
  'paths': 'text,cot',
  'countdown': 'latent,text,cot',
}

# Minutes for one task's three seeds from nothing on 2 CPU cores, measured
# 2026-12-06: arithmetic 45 (9000-step planner), Sudoku 10, paths 8,
# Countdown 6 (1000-step stages).
_SWEEP_MINUTES = {'arithmetic': 50, 'sudoku4': 12, 'paths': 10, 'countdown': 10}


def _sweep(task: str, value) -> Measurement:
  """One seed of the task's sweep per process (--seeds={seed})."""
  args = (f'--task={task}', '--seeds={seed}', f'--variants={_VARIANTS[task]}')
  return Measurement(
    'experiments.sweep_planner_executor',
    ('--preset=cpu', *args),
    '',
    value,
    result_flag='--out',
    result_file='results.json',
    per_seed=True,
    smoke_args=('--preset=smoke', *args),
  )


def _pe(id_, statement, paper_value, arm, baseline, task, metric):
  return Claim(
    id=id_,
    family='planning',
    paper=_PE,
    arxiv=_PE_ARXIV,
    table='main results (DART-5, AIME24)',
    statement=statement,
    paper_value=paper_value,
    metric=metric,
    protocol=NAMED_BASELINE,
    rule=Compare(arm, baseline, 'higher'),
    measurement=_sweep(
      task, functools.partial(pe_accuracy, arms=(arm, baseline))
    ),
    command=f'python -m experiments.reproduce {id_}',
    budget_fraction=_SCALE,
    cost_minutes=_SWEEP_MINUTES[task],
  )


# The MDM planning claims: the masked planner's plans (the text
# pipeline's) against the CoT ARM's, which writes the same plan tokens
# before its answer.
_MDM_VS_AR = {'mdm': 'text', 'ar': 'cot'}

CLAIMS = (
  _pe(
    'pe-latent-beats-text-arithmetic',
    'The latent planner -> executor interface beats the text one '
    '(arithmetic, frozen executor).',
    'DART-5 27.0 -> 54.0%',
    'latent',
    'text',
    'arithmetic',
    'accuracy %, levels 1-4',
  ),
  _pe(
    'pe-hybrid-vs-cot-arithmetic',
    'The DDLM planner + ARM executor matches or beats an ARM with CoT '
    '(arithmetic).',
    '64 plan + ~5 tokens beat a 7B ARM with 44x more tokens',
    'text',
    'cot',
    'arithmetic',
    'accuracy %, levels 1-4',
  ),
  _pe(
    'pe-latent-beats-text-sudoku',
    'The latent interface beats the text one (Sudoku 4x4).',
    'DART-5 27.0 -> 54.0%',
    'latent',
    'text',
    'sudoku4',
    'accuracy %, levels 1-4',
  ),
  _pe(
    'pe-hybrid-vs-cot-sudoku',
    'The DDLM planner + ARM executor beats an ARM with CoT (Sudoku 4x4).',
    'hybrid ahead of CoT at fewer generated tokens',
    'text',
    'cot',
    'sudoku4',
    'accuracy %, levels 1-4',
  ),
  _pe(
    'pe-hybrid-vs-cot-paths',
    'The DDLM planner + ARM executor beats an ARM with CoT (paths).',
    'hybrid ahead of CoT at fewer generated tokens',
    'text',
    'cot',
    'paths',
    'accuracy %, levels 1-4',
  ),
  _pe(
    'pe-latent-beats-text-countdown',
    'The latent interface beats the text one (Countdown).',
    'DART-5 27.0 -> 54.0%',
    'latent',
    'text',
    'countdown',
    'accuracy %, levels 1-2',
  ),
  Claim(
    id='mdm-beats-ar-sudoku',
    family='planning',
    paper=_MDM,
    arxiv=_MDM_ARXIV,
    table='Sudoku',
    statement='A masked diffusion planner writes more valid Sudoku '
    'solutions than an AR model of the same budget.',
    paper_value='MDM far ahead of a same-size AR',
    metric='valid plans %, level 1',
    protocol=NAMED_BASELINE,
    rule=Compare('mdm', 'ar', 'higher'),
    measurement=_sweep(
      'sudoku4', functools.partial(valid_plans, arms=_MDM_VS_AR, level=1)
    ),
    command='python -m experiments.reproduce mdm-beats-ar-sudoku',
    cost_minutes=_SWEEP_MINUTES['sudoku4'],
  ),
  Claim(
    id='mdm-beats-ar-countdown',
    family='planning',
    paper=_MDM,
    arxiv=_MDM_ARXIV,
    table='Countdown',
    statement='A masked diffusion planner writes more valid Countdown '
    'plans than an AR model of the same budget.',
    paper_value='MDM far ahead of a same-size AR',
    metric='valid two-step plans %, level 2',
    protocol=NAMED_BASELINE,
    rule=Compare('mdm', 'ar', 'higher'),
    measurement=_sweep(
      'countdown', functools.partial(valid_plans, arms=_MDM_VS_AR, level=2)
    ),
    command='python -m experiments.reproduce mdm-beats-ar-countdown',
    cost_minutes=_SWEEP_MINUTES['countdown'],
  ),
)
