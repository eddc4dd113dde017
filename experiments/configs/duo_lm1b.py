"""Duo / UDLM on LM1B: uniform-state diffusion, bert-base-uncased, L = 128.

Paper: Sahoo et al. 2025, "The Diffusion Duality" (Duo, arXiv 2506.10892),
LM1B test perplexity bounds (Duo's Table 1, 33B tokens): Duo <= 33.68 and
UDLM <= 36.71 against MDLM <= 31.78 and AR 22.83 (numbers as reported in
the paper; not reproduced here). Recipe (s-sahoo/duo
`scripts/train_lm1b_duo.sh`): MDLM's LM1B data and 12 x 768 model (the
suite's `mdlm_lm1b.py`), uniform-state process with the log-linear
schedule, continuous-time NELBO, time conditioning, global batch 512;
curriculum for the first 500,000 of 1,000,000 steps with tau = 1e-3 and the
Gaussian window gamma in [-3.5, -1.75].

Launch:
  python -m experiments.run --config=experiments/configs/duo_lm1b.py \
    --workdir=$HOME/runs/duo_lm1b

Variants: `duo_lm1b.py:udlm` (no curriculum: the UDLM baseline);
`duo_lm1b.py:smoke`, `duo_lm1b.py:udlm,smoke` (seconds on CPU on the LM1B
fixture with a TEST-ONLY tokenizer).
"""

from experiments.configs import common, mdlm_lm1b

SMOKE_ARG = 'smoke'


ARGS = (common.Flag('udlm'),)  # '[udlm][,smoke]': udlm drops the curriculum.


def get_config(arg: str = ''):
  udlm, preset = common.parse_arg(arg, *ARGS)
  curriculum = not udlm
  c = mdlm_lm1b.get_config(preset)
  steps = c.train.num_steps
  common.uniform(c, curriculum_steps=steps // 2 if curriculum else 0)
  if curriculum:
    c.process.gamma_min = -3.5
    c.process.gamma_max = -1.75
  return c
