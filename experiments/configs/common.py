"""Shared defaults for every language-model config (presets override)."""

from __future__ import annotations

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  """All keys a run reads; each experiment file changes what it needs."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.corpus = 'shakespeare'  # 'shakespeare' | 'text_files'
  c.data.files = ml_collections.ConfigDict(
    {'train': '', 'validation': '', 'test': ''}
  )
  c.data.tokenizer = 'char'  # 'char' | 'byte' | 'bpe'
  c.data.bpe_vocab_size = 4096
  c.data.seq_len = 128
  c.data.batch_size = 32  # Global batch.

  c.process = ml_collections.ConfigDict()
  c.process.kind = 'mdlm'  # 'mdlm' | 'md4' | 'ar'
  c.process.schedule = 'loglinear'  # 'linear' | 'cosine' | 'poly' | ...
  c.process.schedule_kwargs = ml_collections.ConfigDict()
  c.process.num_steps = 0  # 0: continuous-time NELBO; T: T-step NELBO.
  c.process.t_min = 1e-3
  c.process.antithetic = True
  c.process.loss_type = 'elbo'  # 'elbo' | 'simple_ce'

  c.model = ml_collections.ConfigDict()
  c.model.width = 192
  c.model.depth = 4
  c.model.num_heads = 4
  c.model.mlp_dim = 0
  c.model.mlp_kind = 'swiglu'
  c.model.time_conditioning = False
  c.model.cond_dim = 128
  c.model.tied_embeddings = False
  c.model.rope_theta = 10_000.0
  c.model.attention_impl = 'xla'
  c.model.dtype = 'float32'

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 2e-3
  c.optim.warmup_steps = 100
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.99
  c.optim.grad_clip = 1.0
  c.optim.final_lr_fraction = 0.1
  c.optim.ema_decay = 0.0  # 0 disables the parameter EMA.

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 1000
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.checkpoint_every = 250
  c.train.max_checkpoints = 3
  c.train.halt_after_steps = 0  # Stop early this run (resume later); 0 = off.

  c.eval = ml_collections.ConfigDict()
  c.eval.batch_size = 32
  c.eval.num_batches = 8  # Periodic evaluation.
  c.eval.time_samples = 1
  c.eval.final_num_batches = 0  # 0: the whole split.
  c.eval.final_time_samples = 4
  c.eval.use_ema = True

  c.sample = ml_collections.ConfigDict()
  c.sample.num_samples = 4
  c.sample.steps = 128
  c.sample.use_cache = True
  c.sample.temperature = 1.0
  c.sample.top_k = 0
  c.sample.top_p = 1.0
  c.sample.seed = 0

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); one -1 is filled.
  return c


def apply_smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The ':smoke' preset: seconds on CPU, for tests and first checks."""
  c.data.seq_len = 32
  c.data.batch_size = 8
  c.model.width = 32
  c.model.depth = 2
  c.model.num_heads = 2
  c.optim.warmup_steps = 2
  c.train.num_steps = 6
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.checkpoint_every = 3
  c.eval.batch_size = 8
  c.eval.num_batches = 2
  c.eval.final_num_batches = 2
  c.eval.final_time_samples = 1
  c.sample.num_samples = 2
  c.sample.steps = 16
  return c
