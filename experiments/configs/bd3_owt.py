"""BD3-LM block diffusion on OpenWebText (GPT-2 tokens, L = 1024).

Paper: Arriola et al. 2025, "Block Diffusion" (BD3-LM, arXiv 2503.09573),
OWT validation perplexity: AR 17.54, MDLM <= 22.98, BD3-LM L' = 16 / 8 / 4
<= 22.27 / 21.68 / 20.73. Recipe: MDLM's
OWT data and model (the suite's `mdlm_owt.py`), the block-diffusion process,
fine-tuned from an MDLM checkpoint (`--config.train.init_from`). Sampling:
block by block with the KV cache, nucleus 0.9, variable length (stop at
EOS or when the entropy of the last 256 tokens drops below 4).

Sized for: mdlm_owt.py's v5p-64 slice (32 chips, 16 sequences per chip),
but the network reads concat(z_t, x), 2L = 2048 tokens per row: ~1.0e15
FLOPs per step (2.3x mdlm_owt's) and about twice its activations (the CPU
plan: 115 GiB per chip, over a v5p's 95; docs/LAUNCH.md section 7). Launch
with ``--config.model.remat=True`` or ``--config.optim.grad_accum_steps=2``
unless the first steps on the target show that it fits (a CPU plan is an
upper bound on the accelerator's memory).

Launch:
  python -m experiments.run --config=experiments/configs/bd3_owt.py:16 \
    --workdir=$HOME/runs/bd3_owt_16 \
    --config.train.init_from=$HOME/runs/mdlm_owt

Argument: 'BLOCK[,smoke]' with BLOCK in 4, 8, 16; `bd3_owt.py:16,smoke`
runs in seconds on CPU on the OWT fixture.
"""

from experiments.configs import bd3_lm1b, common, mdlm_owt

SMOKE_ARG = '16,smoke'


def get_config(arg: str = '16'):
  block, preset = common.parse_arg(arg, *bd3_lm1b.ARGS)
  c = mdlm_owt.get_config(preset)
  c.sample.top_p = 0.9
  return bd3_lm1b.block_config(c, block)
