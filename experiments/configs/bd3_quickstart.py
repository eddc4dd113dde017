"""Block diffusion (BD3-LM, arXiv 2503.09573) on the quickstart corpus.

Blocks of L' characters are generated left to right, each by masked
diffusion conditioned on the clean blocks before it; training runs one
vectorised pass over concat(x_t, x) (length 2L) under the block-diffusion
attention mask. L' = 1 is the AR twin, L' = L = 128 is the MDLM quickstart.
As in the paper, the default fine-tunes the quickstart's transformer MDLM
(train it first: `--config=experiments/configs/mdlm_quickstart.py
--workdir=runs/mdlm_quickstart`).

Command:
  python -m experiments.run --config=experiments/configs/bd3_quickstart.py:16 \
    --workdir=runs/bd3_quickstart_16

Argument: 'BLOCK[,scratch][,smoke]' with BLOCK in 4, 8, 16 (any divisor of
the length works through --config.process.block_size): fine-tuned from
runs/mdlm_quickstart for 500 steps (`--config.train.init_from=DIR` for another
MDLM run), or `scratch` for 1000 steps from random initialisation.
`bd3_quickstart.py:16,smoke` is the seconds-long test preset (from scratch).

Expected (the paper's claim, docs/HISTORY.md section 11): the validation
bound moves from MDLM's toward the AR twin's as L' shrinks.
"""

from experiments.configs import common, quickstart

BLOCKS = (4, 8, 16)
SMOKE_ARG = '16,smoke'


# 'BLOCK[,scratch][,smoke]'; smoke always trains from scratch.
ARGS = (common.Choice('block', BLOCKS), common.Flag('scratch'))


def get_config(arg: str = '16'):
  block, scratch, preset = common.parse_arg(arg, *ARGS)
  scratch = scratch or preset == 'smoke'
  c = quickstart.recipe(preset)
  common.set_process(c, 'bd3', block_size=block)
  c.model.time_conditioning = False  # BD3 is time-free, like MDLM.
  if not scratch:
    c.train.init_from = 'runs/mdlm_quickstart'
    c.train.num_steps = 500
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 20
    c.train.eval_every = 250
  c.sample.sampler = 'block'
  c.sample.use_cache = True
  return c
