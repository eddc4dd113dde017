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
~7.1e13 FLOPs (92M parameters) and 131k tokens per step
(`--mode=plan`; docs/LAUNCH.md section 7).

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

from experiments.configs import common


def get_config(preset: str = ''):
  c = common.md4()
  c.data.corpus = 'text8'
  c.data.data_dir = f'{common.DATA_ROOT}/text8'
  c.data.seq_len = 256
  c.model.dtype = 'float32'
  c.train.eval_every = 5_000
  c.eval.final_time_samples = 4  # The whole 5M-character split, 4 t draws.
  return common.finish(c, preset)
