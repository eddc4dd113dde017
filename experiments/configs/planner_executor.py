"""DDLM planner -> ARM executor on multi-step arithmetic (arXiv 2510.15244).

One config for the four pipelines of issue 8; the argument is
'PIPELINE[,preset]' with PIPELINE in direct | cot | text | latent:

  direct  ARM answers from the question.
  cot     ARM writes its own plan (chain of thought), then answers.
  text    MDLM planner samples a P-token plan, the ARM reads it and answers.
  latent  the planner's final hidden states at the P plan positions go
          through an MLP projector into the ARM's embedding space (soft
          tokens); the projector trains on the answer loss with planner and
          executor frozen (latent.unfreeze_executor=True unfreezes the ARM).

The task (ddlm_jax/data/reasoning.py): k operations (+ - *) on digits,
evaluated left to right mod 10; the level is k (1-5); the plan is the chain
of running results 'r1;r2;...;' (2k tokens). Training uses levels 1-4,
testing every level including the held-out level 5. The plan field is
P = reasoning.plan_len tokens (default 16): level-5 plans need 10 tokens, so the
paper's P = 64 would be 54 padding tokens here; P is configurable.

Commands (models are shared through --config.models_dir):
  python -m experiments.run \
    --config=experiments/configs/planner_executor.py:latent,cpu \
    --workdir=runs/pe/latent --config.models_dir=runs/pe/models
  python -m experiments.run \
    --config=experiments/configs/planner_executor.py:text,cpu \
    --workdir=runs/pe/text --config.models_dir=runs/pe/models \
    --config.plan.sampler=confidence:greedy=True --config.plan.steps=16
  python -m experiments.sweep_planner_executor --preset=cpu --out=runs/pe

Presets:
  ''      larger models (width 128, depth 4) and 20k steps per model; not
          run on this suite's CPU budget.
  'cpu'   width 64, depth 3, sized for 2 shared CPU cores: planner 9000
          steps (simple_ce), executors 3000, projector 1500 (about 35 min
          for the whole sweep on 2 shared cores).
  'smoke' seconds: width 16, a few steps (tests).

Paper claims (arXiv 2510.15244): latent beats text (DART-5 27.0% -> 54.0%,
AIME24 0% -> 14%); with 64 planning tokens and ~5 execution tokens the
DDLM->ARM pipeline beats a 7B ARM using 44x more tokens.

Measured with 'cpu' (seed 0, 500 test problems per level; accuracy % on
levels 1 / 2 / 3 / 4 / held-out 5; docs/RESULTS.md, issue 8):
  ARM direct           40.6 / 31.2 / 34.0 / 28.2 / 27.2
  ARM CoT             100.0 / 100.0 / 100.0 / 100.0 / 0.0 (9.2 exec tokens)
  text (16 steps)      35.2 / 31.4 / 34.2 / 28.4 / 20.4
  latent (frozen)      37.8 / 31.0 / 35.0 / 28.0 / 23.2
  latent (unfrozen)    98.4 / 41.4 / 34.0 / 30.0 / 19.0
Latent >= text within noise; the hybrid does NOT match CoT: the small MDLM
planner never learns the digit arithmetic (35% exact plans at level 1).
"""

from __future__ import annotations

import ml_collections

from experiments.configs import common

PIPELINES = ('direct', 'cot', 'text', 'latent')
PRESETS = ('', 'cpu', 'smoke')
SMOKE_ARG = 'latent,smoke'


def parse_arg(arg: str) -> tuple[str, str]:
  """'PIPELINE[,preset]' -> (pipeline, preset), with clear errors."""
  return common.parse_arg(arg, {'pipeline': PIPELINES}, PRESETS)


def _model(width, depth, heads, steps, batch, lr):
  b = ml_collections.ConfigDict()
  b.width, b.depth, b.num_heads = width, depth, heads
  b.steps, b.batch_size, b.learning_rate = steps, batch, lr
  return b


def get_config(arg: str = 'latent') -> ml_collections.ConfigDict:
  pipeline, preset = parse_arg(arg)
  c = ml_collections.ConfigDict()
  c.pipeline = pipeline
  c.kind = 'planner_executor'  # Declared task kind for experiments.run.
  c.seed = 0
  c.models_dir = ''  # Shared trained models; '' = <workdir>/models.

  c.reasoning = ml_collections.ConfigDict()
  c.reasoning.train_levels = (1, 2, 3, 4)
  c.reasoning.test_levels = (1, 2, 3, 4, 5)
  c.reasoning.plan_len = 16  # P; level-5 plans need 10 tokens.
  c.reasoning.num_test_per_level = 1000

  c.planner = _model(128, 4, 4, 20_000, 128, 1e-3)
  c.executor = _model(128, 4, 4, 20_000, 128, 1e-3)
  c.planner.loss_type = 'elbo'  # or 'simple_ce' (unweighted masked CE)

  c.plan = ml_collections.ConfigDict()
  c.plan.sampler = 'confidence:greedy=True'  # a registry spec string
  c.plan.steps = 16  # num_steps, when the sampler takes it

  c.latent = ml_collections.ConfigDict()
  c.latent.source = 'final'  # 'final' (after sampling) or 'masked'
  c.latent.projector_layers = 2
  c.latent.projector_hidden = 0  # 0: 2 * max(widths)
  c.latent.unfreeze_executor = False
  c.latent.pool_size = 8192
  c.latent.steps = 4000
  c.latent.batch_size = 128
  c.latent.learning_rate = 1e-3

  c.optim = ml_collections.ConfigDict()
  c.optim.weight_decay = 0.01
  c.optim.warmup_fraction = 0.05
  c.optim.final_lr_fraction = 0.1
  c.optim.grad_clip = 1.0

  c.train = ml_collections.ConfigDict()
  # > 0 caps every stage's steps (quick runs); each stage's own length is
  # its block's `steps` (planner.steps, executor.steps, latent.steps).
  c.train.max_stage_steps = 0
  c.train.log_every = 200
  c.train.checkpoint_every = 1000
  c.train.fast_compile = False

  c.eval = ml_collections.ConfigDict()
  c.eval.batch_size = 256
  c.eval.exec_temperature = 0.0  # 0 = greedy executor

  if preset == 'cpu':
    c.planner = _model(64, 3, 4, 9000, 64, 2e-3)
    # The ELBO's 1/t weights made the planner learn ~2x slower per step
    # (validation plan accuracy); see docs/RESULTS.md, issue 8.
    c.planner.loss_type = 'simple_ce'
    c.executor = _model(64, 3, 4, 3000, 64, 2e-3)
    c.latent.pool_size = 4096
    c.latent.steps = 1500
    c.latent.batch_size = 64
    c.reasoning.num_test_per_level = 500
    c.train.log_every = 250
    c.train.checkpoint_every = 500
  elif preset == 'smoke':
    c.planner = _model(16, 1, 2, 3, 8, 1e-3)
    c.planner.loss_type = 'elbo'
    c.executor = _model(16, 1, 2, 3, 8, 1e-3)
    c.plan.steps = 4
    c.latent.pool_size = 16
    c.latent.steps = 3
    c.latent.batch_size = 8
    c.reasoning.num_test_per_level = 4
    c.train.log_every = 1
    c.train.checkpoint_every = 3
    c.train.max_stage_steps = 3
    c.train.fast_compile = True
    c.eval.batch_size = 8
  return c
