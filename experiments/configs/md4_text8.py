"""MD4 on text8: masked diffusion, linear schedule, 27 characters, L = 256.

Paper: Shi et al. 2024 (MD4), text8 test bits/char <= 1.37 (GenMD4 <= 1.34),
standard 90M / 5M / 5M split. Recipe (md4's ``configs/md4/text8.py``):
"small" transformer (12 x 768, 12 heads, GLU MLP, adaLN time conditioning),
linear schedule alpha(t) = 1 - t (with MD4's eps = 1e-4), continuous time,
antithetic t, global batch 512 x 256 characters, 1,000,000 steps, Adam
(b2 = 0.999) lr 3e-4 with 2,000 warmup steps then cosine to 0, weight decay
0.03, no gradient clipping, EMA 0.9999. (md4 also uses dropout 0.05; this
suite's transformer has no dropout.)

Sized for: a Cloud TPU v5p-32 slice (16 chips, 4 hosts; 32 sequences per
chip) or one 8-GPU host (64 per GPU), pure data parallelism (mesh (-1, 1, 1));
~1.3e14 FLOPs and 131k tokens per step.

Data: text8.zip in ~/ddlm_data/text8 (docs/LAUNCH.md: ``wget -P
~/ddlm_data/text8 http://mattmahoney.net/dc/text8.zip``).

Launch (single host; on a multi-host slice run the same on every worker):
  python -m experiments.run --config=experiments/configs/md4_text8.py \
    --workdir=$HOME/runs/md4_text8
Test-set BPC of the final checkpoint:
  python -m experiments.run --config=experiments/configs/md4_text8.py \
    --workdir=$HOME/runs/md4_text8 --mode=eval --split=test

Presets: ``md4_text8.py:smoke`` runs seconds on CPU on
tests/fixtures/text8/text8.zip (20k characters, same zip layout).
"""

from experiments import recipes
from experiments.configs.common import base_config


def get_config(preset: str = ''):
  recipes.check_preset(preset)
  c = base_config()
  c.seed = 42
  c.data.corpus = 'text8'
  c.data.data_dir = f'{recipes.DATA_ROOT}/text8'
  c.data.seq_len = 256
  c.data.batch_size = 512

  c.process.kind = 'md4'
  c.process.schedule = 'linear'
  c.process.num_steps = 0
  c.process.t_min = 0.0
  c.process.antithetic = True

  recipes.small_model(c, time_conditioning=True)
  c.model.dtype = 'float32'

  c.optim.learning_rate = 3e-4
  c.optim.warmup_steps = 2_000
  c.optim.weight_decay = 0.03
  c.optim.b2 = 0.999
  c.optim.grad_clip = 0.0
  c.optim.final_lr_fraction = 0.0
  c.optim.ema_decay = 0.9999

  c.train.num_steps = 1_000_000
  c.train.log_every = 500
  c.train.eval_every = 5_000
  c.train.checkpoint_every = 5_000

  c.eval.batch_size = 512
  c.eval.num_batches = 4
  c.eval.final_num_batches = 0  # The whole 5M-character split.
  c.eval.final_time_samples = 4

  c.sample.num_samples = 8
  c.sample.steps = 1_000
  c.sample.use_cache = False  # Time-conditioned network.
  if preset == 'smoke':
    recipes.apply_paper_smoke(c)
  return c
