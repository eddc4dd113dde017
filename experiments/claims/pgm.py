"""PGM, partition generative modeling (arXiv 2505.18883).

The bound comparison trains `experiments/configs/pgm.py` against the MDLM
quickstart (`mdlm_quickstart.py`): the same corpus, length, steps,
optimiser and schedule, and the same parameter count within 2% (4 blocks
of width 128: 2 encoder + 2 decoder blocks against 4 transformer
blocks). "Within a few percent" is a non-inferiority margin of 0.1
bits/char, 3% of MDLM's 3.30.

The sampling comparisons time the bound claim's trained pairs (the same
seed of each arm, L = 128) with `experiments.benchmarks.pgm_sampling` at
T = L = 128: MDLM's cached ancestral sampler (the suite's default, which
skips calls that reveal nothing) against PGM's random-order sampler (one
position per decoder call, the encoder on the clean tokens so far), both
compiled first and timed in alternating rounds. The paper's OpenWebText
networks (L = 1024, ~170M parameters) see ~1.6e4 times more tokens than
these runs, and its 5-5.5x throughput is on a GPU.
"""

import functools

from experiments.claims.spec import (
  EQUAL_STEPS,
  NAMED_BASELINE,
  Arm,
  Claim,
  Measurement,
)
from experiments.claims.verdict import Compare, Threshold

_PAPER = 'PGM'
_ARXIV = '2505.18883'
_MDLM = Arm('mdlm', 'experiments/configs/mdlm_quickstart.py')
_PGM = Arm('pgm', 'experiments/configs/pgm.py')
# Tokens seen: 1000 x 32 x 128 here over the paper's 1M x 512 x 1024.
_BUDGET = 1000 * 32 * 128 / (1e6 * 512 * 1024)


def sampling_ratio(rows: list[dict], key: str) -> float:
  """One seed's ratio ('flops_ratio' or 'speed_ratio') from the JSON rows
  of `experiments.benchmarks.pgm_sampling`."""
  (row,) = rows
  return float(row[key])


def sampling_notes(results) -> str:
  """What each seed's ratio came from, from the JSON rows of
  `experiments.benchmarks.pgm_sampling` of every seed."""
  parts = []
  for (row,) in results:
    mdlm, pgm = row['mdlm'], row['pgm']
    parts.append(
      f'seed {row["seed"]}: FLOPs per sample {mdlm["flops_per_sample"]:.3g} '
      f'/ {pgm["flops_per_sample"]:.3g}, tokens/s '
      f'{mdlm["sample_tokens_per_sec"]:.0f} / '
      f'{pgm["sample_tokens_per_sec"]:.0f}, NFE {mdlm["nfe"]} / '
      f'{pgm["nfe"]}, load average {row["load_average"]:.2f}'
    )
  return (
    f'MDLM / PGM at T = L = {results[0][0]["pgm"]["steps"]}, best of '
    f'alternating rounds after compiling; {"; ".join(parts)}.'
  )


def _timing(key: str) -> Measurement:
  """The sampling benchmark on the bound claim's runs of one seed."""
  runs = ('--mdlm={run:mdlm}', '--pgm={run:pgm}', '--seeds={seed}')
  return Measurement(
    'experiments.benchmarks.pgm_sampling',
    (*runs, '--num_samples=4', '--repeats=4'),
    'ratio',
    functools.partial(sampling_ratio, key=key),
    per_seed=True,
    smoke_args=(*runs, '--num_samples=1', '--repeats=1'),
    describe=sampling_notes,
  )


_SAMPLING = dict(
  family='throughput',
  paper=_PAPER,
  arxiv=_ARXIV,
  table='Sec. 5 (OWT sampling throughput)',
  paper_value='5-5.5x the sampling throughput of MDLM on OpenWebText, '
  'with lower gen-PPL',
  protocol=NAMED_BASELINE,
  arms=(_MDLM, _PGM),
  cost_minutes=70,  # The bound claim's runs (~60 min), then the timing.
)

CLAIMS = (
  Claim(
    id='pgm-bound-near-mdlm',
    family='bounds',
    paper=_PAPER,
    arxiv=_ARXIV,
    table='Table 1 (OWT perplexity)',
    statement='At the same parameter count, steps and data, PGM reaches a '
    'validation bound within 0.1 bits/char (3%) of MDLM on the quickstart '
    'corpus.',
    paper_value='similar perplexity bound to MDLM at matched size',
    metric='validation bound, bits/char',
    protocol=EQUAL_STEPS,
    rule=Compare('pgm', 'mdlm', 'lower', min_effect=-0.1),
    arms=(_MDLM, _PGM),
    command='python -m experiments.reproduce pgm-bound-near-mdlm',
    bound='full',
    budget_fraction=_BUDGET,
    cost_minutes=60,
  ),
  Claim(
    id='pgm-sampling-flops',
    statement='At T = L = 128, PGM spends >= 2x fewer FLOPs per sample '
    "than MDLM's cached ancestral sampler (the work each sampler counts).",
    metric='MDLM / PGM FLOPs per sample (x)',
    rule=Threshold('ratio', 2.0, '>='),
    measurement=_timing('flops_ratio'),
    command='python -m experiments.reproduce pgm-sampling-flops',
    **_SAMPLING,
  ),
  Claim(
    id='pgm-sampling-speed',
    statement='At T = L = 128, PGM samples >= 1.5x the tokens/s of '
    "MDLM's cached ancestral sampler on this CPU.",
    metric='PGM / MDLM sample tokens/s (x)',
    rule=Threshold('ratio', 1.5, '>='),
    measurement=_timing('speed_ratio'),
    command='python -m experiments.reproduce pgm-sampling-speed',
    **_SAMPLING,
  ),
)
