"""MDLM on OpenWebText: GPT-2 tokens, L = 1024, MDLM's data recipe.

Paper: Sahoo et al. 2024 (MDLM), OpenWebText validation perplexity
<= 23.21 after 1M steps. Recipe (MDLM repo: ``configs/config.yaml``,
``configs/model/small.yaml``, ``data=openwebtext-split``): the last 100,000
documents are validation (``data.owt_split='mdlm'``), documents +
``<|endoftext|>`` joined and cut into rows framed as ``[BOS] ... [EOS]``
(``data.wrap='bos_eos'``), log-linear schedule, SUBS, continuous time,
antithetic t with t >= 1e-3, NO time conditioning, 12 x 768 transformer,
global batch 512 x 1024, 1,000,000 steps, Adam (b2 0.999) lr 3e-4 with 2,500
warmup steps then constant, no weight decay, gradient clip 1.0, EMA 0.9999,
bf16. (MDLM's DiT has dropout 0.1; this suite's transformer has none.)

Sized for: a Cloud TPU v5p-64 slice (32 chips, 8 hosts; 16 sequences per
chip) or 8 x H100 80GB with ``--config.optim.grad_accum_steps=2``; ~4.5e14
FLOPs and 524k tokens per step.

Data: ``python -m ddlm_jax.data.openwebtext --save_to=~/ddlm_data/openwebtext``
(once), then on each host
  python -m experiments.prepare_data --config=experiments/configs/mdlm_owt.py

Launch:
  python -m experiments.run --config=experiments/configs/mdlm_owt.py \
    --workdir=$HOME/runs/mdlm_owt
Zero-shot suite (MDLM Table 3):
  python -m experiments.zero_shot --workdir=$HOME/runs/mdlm_owt \
    --data_dir=~/ddlm_data/zero_shot

Presets: ``mdlm_owt.py:smoke`` (seconds on CPU: tests/fixtures/openwebtext,
a TEST-ONLY byte-BPE tokenizer trained on it).
"""

from experiments import recipes
from experiments.configs.common import base_config


def get_config(preset: str = ''):
  recipes.check_preset(preset)
  c = base_config()
  c.seed = 1
  c.data.corpus = 'openwebtext'
  c.data.data_dir = f'{recipes.DATA_ROOT}/openwebtext'
  c.data.hf_tokenizer = 'gpt2'
  c.data.seq_len = 1024
  c.data.batch_size = 512
  c.data.wrap = 'bos_eos'
  c.data.owt_split = 'mdlm'
  c.data.owt_validation_docs = 100_000

  c.process.kind = 'mdlm'
  c.process.schedule = 'loglinear'
  c.process.num_steps = 0
  c.process.t_min = 1e-3
  c.process.antithetic = True

  recipes.small_model(c, time_conditioning=False)
  c.model.dtype = 'bfloat16'

  c.optim.learning_rate = 3e-4
  c.optim.warmup_steps = 2_500
  c.optim.weight_decay = 0.0
  c.optim.b2 = 0.999
  c.optim.grad_clip = 1.0
  c.optim.final_lr_fraction = 1.0  # Constant after warmup.
  c.optim.ema_decay = 0.9999

  c.train.num_steps = 1_000_000
  c.train.log_every = 500
  c.train.eval_every = 10_000
  c.train.checkpoint_every = 5_000

  c.eval.batch_size = 256
  c.eval.num_batches = 4
  c.eval.final_num_batches = 0  # All 100k validation documents.
  c.eval.final_time_samples = 1

  c.sample.num_samples = 8
  c.sample.steps = 1_000
  c.sample.use_cache = True  # Time-free network: MDLM's ddpm_cache.
  if preset == 'smoke':
    recipes.apply_paper_smoke(c)
  return c
