"""BD3-LM block diffusion on LM1B (bert-base-uncased, L = 128).

Paper: Arriola et al. 2025, "Block Diffusion" (BD3-LM, arXiv 2503.09573,
ICLR 2025), LM1B test perplexity: AR 22.83, MDLM <= 31.78, BD3-LM
L' = 16 / 8 / 4 <= 30.60 / 29.83 / 28.23.
Recipe: MDLM's 12 x 768 time-free transformer and optimiser (the suite's
`mdlm_lm1b.py`) with sentences packed into rows of 128 (`data.packing=
'packed'`; the paper's LM1B rows are wrapped, which is why its MDLM number
differs from MDLM's own 27.04), the block-diffusion process with the
log-linear schedule, fine-tuned from an MDLM checkpoint
(`--config.train.init_from=$HOME/runs/mdlm_lm1b`), and the clipped
training band found by `BlockDiffusion.clip_search`; reported bounds are
always unclipped.

Launch:
  python -m experiments.run --config=experiments/configs/bd3_lm1b.py:16 \
    --workdir=$HOME/runs/bd3_lm1b_16 \
    --config.train.init_from=$HOME/runs/mdlm_lm1b

Argument: 'BLOCK[,smoke]' with BLOCK in 4, 8, 16; `bd3_lm1b.py:16,smoke`
runs in seconds on CPU on the LM1B fixture (TEST-ONLY tokenizer).
"""

from experiments.configs import common, mdlm_lm1b

BLOCKS = (4, 8, 16)
SMOKE_ARG = '16,smoke'


ARGS = (common.Choice('block', BLOCKS),)  # 'BLOCK[,smoke]'


def block_config(c, block: int):
  """The BD3 settings on top of an MDLM paper config."""
  common.set_process(c, 'bd3', block_size=block)
  c.model.time_conditioning = False
  c.sample.sampler = 'block'
  return c


def get_config(arg: str = '16'):
  block, preset = common.parse_arg(arg, *ARGS)
  c = mdlm_lm1b.get_config(preset)
  c.data.packing = 'packed'
  return block_config(c, block)
