"""Supervised fine-tuning: prompt -> response, the prompt never masked.

Command (fine-tune a converted checkpoint; experiments.convert wrote DIR):
  python -m experiments.run --config=experiments/configs/sft.py:DIR \
    --workdir=runs/sft

LLaDA's SFT recipe (`process.kind = 'mdlm_sft'`, ddlm_jax/diffusion/sft.py)
on the instruction set `data.corpus = 'sft_arithmetic'`
(ddlm_jax/data/sft_pairs.py): modular-arithmetic problems as prompts, their
running results as responses, EOS-padded rows whose loss_mask marks the
response. Only response tokens are masked, under the linear schedule
(weight 1/t), and each row's loss is divided by its response length.

With DIR (a converted or trained run directory) the model block is DIR's
and `train.init_from = DIR`: the run starts from DIR's parameters and its
tokenizer. Without one it trains the smoke-sized transformer from scratch
on a character tokenizer (a check of the recipe, not a fine-tune).
`:DIR,smoke` and `:smoke` train for a few steps (seconds, for tests).
Prompted samples of the result:
  python -m experiments.run --workdir=runs/sft --mode=sample \
    --prompt_file=prompts.txt --max_new_tokens=16
"""

import os

from experiments.configs.common import (
  Directory,
  apply_smoke,
  base_config,
  parse_arg,
  set_process,
)

ARGS = (Directory('run'),)  # '[DIR][,smoke]'

# Prompt of the end-of-run samples: one problem of the instruction set.
SAMPLE_PROMPT = 'Compute mod 10: 3+4*2='


def get_config(arg: str = ''):
  source, preset = parse_arg(arg, *ARGS)
  if source:
    from ddlm_jax.tasks.language_model import load_config

    c = load_config(source)
    # JSON keeps the mesh shape a list, which a --config.mesh.shape
    # override (a tuple) cannot replace.
    c.mesh = type(c.mesh)({**c.mesh.to_dict(), 'shape': tuple(c.mesh.shape)})
    c.train.init_from = os.path.abspath(source)
  else:
    c = base_config()
    c.model.time_conditioning = False
  set_process(c, 'mdlm_sft', schedule='linear', loss_type='elbo')
  c.data.corpus = 'sft_arithmetic'
  c.data.sft_levels = (1, 2, 3)  # Operations per problem (1-5).
  # Pairs per split; drawn with a fixed seed per split.
  c.data.sft_pairs = {'train': 4096, 'validation': 256, 'test': 256}
  c.data.seq_len = 64  # Prompt + response + EOS fill (rotary: any length).
  c.optim.learning_rate = 1e-4 if source else 2e-3
  c.optim.warmup_steps = 50
  c.train.batch_size = 32
  c.train.num_steps = 1000
  c.train.eval_every = 250
  c.train.checkpoint_every = 250
  c.sample.sampler = 'llada:block_length=8'
  c.sample.steps = 16
  c.sample.prefix = SAMPLE_PROMPT
  c.sample.num_samples = 4
  if preset == 'smoke':
    model = c.model.to_dict()
    apply_smoke(c)
    if source:  # The imported model keeps its own sizes.
      c.model = type(c.model)(model)
    c.data.seq_len = 40
    c.data.sft_pairs = {'train': 64, 'validation': 16, 'test': 16}
    c.sample.steps = 8
  return c
