"""Soft-masking continued pretraining from the quickstart MDLM.

Three arms from the same checkpoint (train.init_from, default
runs/mdlm_quickstart, trained by `mdlm_quickstart.py`), chosen by the
config argument ARM[,smoke]:

  sm           MDLM + soft-masking: two passes with probability sm_prob.
  plain        plain MDLM, the same number of steps.
  plain_equal  plain MDLM at SM's training compute: a two-pass batch costs
               one extra forward (~1/3 of a forward+backward), so
               steps * (1 + sm_prob / 3).

With `bpe` (`sm,bpe`, `plain,bpe`, ...) the arms continue the word-level
quickstart's MDLM instead (`quickstart_bpe.py`, default runs/quickstart_bpe):
its tokenizer, sequence length and batch, the same continued training.

Commands (docs/HISTORY.md section 7):
  python -m experiments.run --config=experiments/configs/sm_continue.py:sm \
    --workdir=runs/sm/sm_s0 --config.seed=0
  python -m experiments.run --config=experiments/configs/sm_continue.py:plain \
    --workdir=runs/sm/plain_s0 --config.seed=0

Settings follow the paper's where they carry over (model LR 3e-4,
SM scalars 1e-2, sm_prob 0.8, k 3); w_s starts at 0.2 instead of ~0 because
300 steps are too few for it to grow from 0 (REFERENCE: ~1.4k Adam steps to
reach 0.5).
"""

from experiments.configs import quickstart, quickstart_bpe
from experiments.configs.common import Choice, Flag, parse_arg

ARMS = ('sm', 'plain', 'plain_equal')
ARGS = (Choice('arm', ARMS), Flag('bpe'))  # 'ARM[,bpe][,smoke]'
SMOKE_ARG = 'sm,smoke'
STEPS = 300


def equal_compute_steps(steps: int, sm_prob: float) -> int:
  """Plain steps with the training FLOPs of `steps` soft-masking steps."""
  return round(steps * (1.0 + sm_prob / 3.0))


def get_config(arg: str = 'sm'):
  arm, bpe, preset = parse_arg(arg, *ARGS)
  c = quickstart.recipe(preset)
  c.train.init_from = 'runs/mdlm_quickstart'
  if bpe:  # The word-level regime: continue quickstart_bpe.py's MDLM.
    quickstart_bpe.apply_bpe(c, preset)
    c.train.init_from = 'runs/quickstart_bpe'
  c.optim.learning_rate = 3e-4
  c.optim.warmup_steps = 20
  c.soft_mask.w_s_init = 0.2
  steps = c.train.num_steps if preset == 'smoke' else STEPS
  c.soft_mask.enabled = arm == 'sm'
  if arm == 'plain_equal':
    steps = equal_compute_steps(steps, c.soft_mask.sm_prob)
  c.train.num_steps = steps
  if preset != 'smoke':
    c.train.eval_every = 100
    c.train.checkpoint_every = 100
  return c
