"""Sampler papers: EB-sampler (arXiv 2505.24857), ReMDM (arXiv 2503.00307)
and model scheduling (arXiv 2604.02340), on the quickstart models.

Sample quality is AR-twin generative perplexity; each comparison of it is
entropy-matched (``ENTROPY_TOL``) unless the sampler's own output fixes the
entropy. The models are 0.9M-parameter CPU models against the papers'
billion-parameter ones, which the EB claims state as their budget.
"""

from experiments.claims.spec import (
  ENTROPY_TOL,
  EQUAL_NFE,
  MATCHED_ENTROPY,
  TARGET,
  Claim,
)
from experiments.claims.verdict import Compare, Threshold

_SWEEP = 'python -m experiments.sweep_samplers'
# Parameters of our models over the papers' (LLaDA / Dream, ~8B).
_SCALE = 1e6 / 8e9

CLAIMS = (
  Claim(
    id='eb-fewer-calls-char',
    family='samplers',
    paper='EB-sampler',
    arxiv='2505.24857',
    table='main results',
    statement='The entropy-bounded sampler needs 2-3x fewer calls than '
    'one token per step at equal quality (character level).',
    paper_value='2-3x fewer calls',
    metric='calls of one-per-step / calls of EB at equal gen-ppl (x)',
    protocol=TARGET,
    rule=Threshold('eb', 2.0, '>='),
    seeds=(0,),
    command=(
      f'{_SWEEP} --workdir=runs/mdlm_quickstart '
      '--scorer=runs/ar_quickstart --num_samples=32 --batch=1 '
      "--samplers='eb' --gammas=0,0.25,0.5,1,2,4,8"
    ),
    budget_fraction=_SCALE,
    cost_minutes=40,
  ),
  Claim(
    id='eb-fewer-calls-bpe',
    family='word level',
    paper='EB-sampler',
    arxiv='2505.24857',
    table='main results',
    statement='The entropy-bounded sampler needs 2-3x fewer calls at '
    'equal quality (2048-token BPE).',
    paper_value='2-3x fewer calls',
    metric='calls of one-per-step / calls of EB at equal gen-ppl (x)',
    protocol=TARGET,
    rule=Threshold('eb', 2.0, '>='),
    seeds=(0, 1, 2),
    command=(
      f'{_SWEEP} --workdir=runs/quickstart_bpe '
      '--scorer=runs/quickstart_bpe_ar --steps=48 --gammas=0,1,2,4,8 '
      "--samplers='eb;ancestral' --num_samples=64 --batch=1 --seeds=0,1,2"
    ),
    budget_fraction=_SCALE,
    cost_minutes=60,
  ),
  Claim(
    id='remdm-capped-beats-ancestral',
    family='samplers',
    paper='ReMDM',
    arxiv='2503.00307',
    table='OWT sampling, max-capped schedule',
    statement='ReMDM with the max-capped schedule (eta 0.04) gives lower '
    'gen-ppl than ancestral sampling at equal NFE (T = 128).',
    paper_value='better MAUVE / gen-ppl at equal NFE',
    metric='AR-twin gen-ppl',
    protocol=MATCHED_ENTROPY,
    rule=Compare('remdm', 'ancestral', 'lower', entropy_tol=ENTROPY_TOL),
    command=(
      f'{_SWEEP} --workdir=runs/mdlm_quickstart --scorer=runs/ar_quickstart'
      ' --num_samples=32 --steps=128 --seeds=0,1,2 '
      "--samplers='ancestral:use_cache=False;remdm:eta=0.04'"
    ),
    cost_minutes=20,
  ),
  Claim(
    id='remdm-loop-beats-ancestral',
    family='samplers',
    paper='ReMDM',
    arxiv='2503.00307',
    table='OWT sampling, loop schedule',
    statement='ReMDM loop (eta 0.02, alpha_on 0.9) gives lower gen-ppl '
    'than ancestral sampling at equal NFE (T = 128).',
    paper_value='best of the ReMDM schedules at equal NFE',
    metric='AR-twin gen-ppl',
    protocol=MATCHED_ENTROPY,
    rule=Compare('loop', 'ancestral', 'lower', entropy_tol=ENTROPY_TOL),
    command=(
      f'{_SWEEP} --workdir=runs/mdlm_quickstart --scorer=runs/ar_quickstart'
      ' --num_samples=32 --steps=128 --seeds=0,1,2 '
      "--samplers='ancestral:use_cache=False;remdm:eta=0.02,strategy=loop'"
    ),
    cost_minutes=20,
  ),
  Claim(
    id='scheduling-middle-most-sensitive',
    family='samplers',
    paper='Model scheduling',
    arxiv='2604.02340',
    table='sensitivity by step segment',
    statement='Replacing the heavy model by a light one hurts most in the '
    'middle third of the sampling steps (character level).',
    paper_value='middle steps most sensitive',
    metric='AR-twin gen-ppl (higher = more sensitive)',
    protocol=EQUAL_NFE,
    rule=Compare('light_middle', 'light_late', 'higher'),
    seeds=(0,),
    command=(
      f'{_SWEEP} --workdir=runs/mdlm_quickstart --scorer=runs/ar_quickstart'
      " --light=runs/light --samplers='scheduled:pattern=...'"
    ),
    cost_minutes=30,
  ),
  Claim(
    id='scheduling-middle-most-sensitive-bpe',
    family='word level',
    paper='Model scheduling',
    arxiv='2604.02340',
    table='sensitivity by step segment',
    statement='The middle third of the steps is the most sensitive to the '
    'light model (2048-token BPE).',
    paper_value='middle steps most sensitive',
    metric='AR-twin gen-ppl (higher = more sensitive)',
    protocol=EQUAL_NFE,
    rule=Compare('light_middle', 'light_late', 'higher'),
    seeds=(0, 1, 2),
    command=(
      f'{_SWEEP} --workdir=runs/quickstart_bpe '
      '--scorer=runs/quickstart_bpe_ar --light=runs/quickstart_bpe_light '
      "--num_samples=128 --seeds=0,1,2 --samplers='scheduled:...'"
    ),
    cost_minutes=40,
  ),
  Claim(
    id='scheduling-saves-flops',
    family='samplers',
    paper='Model scheduling',
    arxiv='2604.02340',
    table='sensitivity by step segment',
    statement='Scheduling a light model into one third of the steps saves '
    '>= 17% of the sampling FLOPs.',
    paper_value='~17% FLOPs saved at small quality cost',
    metric='% of sampling FLOPs saved (best pattern)',
    protocol=TARGET,
    rule=Threshold('light_early', 17.0, '>='),
    seeds=(0,),
    command=(
      f'{_SWEEP} --workdir=runs/mdlm_quickstart --scorer=runs/ar_quickstart'
      " --light=runs/light --samplers='scheduled:pattern=...'"
    ),
    cost_minutes=30,
  ),
)
