"""DDLM planner -> ARM executor on planning tasks (arXiv 2510.15244).

One config for the four pipelines on every planning task; the argument is
'PIPELINE[,TASK][,preset]' with PIPELINE in direct | cot | text | latent and
TASK in arithmetic (default) | sudoku4 | countdown | paths
(ddlm_jax/data/planning_tasks.py); 'latent,cpu' is arithmetic:

  direct  ARM answers from the question.
  cot     ARM writes its own plan (chain of thought), then answers.
  text    MDLM planner samples a P-token plan, the ARM reads it and answers.
  latent  the planner's final hidden states at the P plan positions go
          through an MLP projector into the ARM's embedding space (soft
          tokens); the projector trains on the answer loss with planner and
          executor frozen (latent.unfreeze_executor=True unfreezes the ARM).

Tasks: sudoku4 (4x4 Sudoku, unique solution, levels = 4/6/8/10/12 blanks,
answer = the query cell), countdown (2-4 numbers to a target, answer = the
root operator of the unique solution), paths (unique shortest path in a
10-node graph, answer = the first hop). The TASK part of the argument sets
the task's levels, held-out level and plan length (`config.task` alone does
not: reasoning.* then keep the arithmetic defaults and check_config names
what does not fit).

The arithmetic task (ddlm_jax/data/reasoning.py): k operations (+ - *) on
digits, evaluated left to right mod 10; the level is k (1-5); the plan is
the chain of running results 'r1;r2;...;' (2k tokens). Training uses levels
1-4, testing every level including the held-out level 5. The plan field is
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
  python -m experiments.sweep_planner_executor --task=sudoku4 --preset=cpu \
    --out=runs/pe_sudoku4

Presets:
  ''      larger models (width 128, depth 4) and 20k steps per model; not
          run on this suite's CPU budget.
  'cpu'   width 64, depth 3, sized for 2 shared CPU cores: planner 9000
          steps (simple_ce), executors 3000, projector 1500 (about 35 min
          for the whole sweep on 2 shared cores).
  'smoke' seconds: width 16, a few steps (tests).
  For sudoku4 / countdown / paths, 'cpu' trains planner and executors for
  the same steps and batch (the issue's budget rule): width 64, depth 2,
  1000 steps each, projector 300 steps, 200 test problems per level. The
  2 cores were shared by ~8 jobs (about 1.3 steps/s at width 64, depth 3),
  so this is what fits ~25 min per sweep of direct, cot, text (3
  samplers) and latent; TASK_CPU below.

Paper claims (arXiv 2510.15244): latent beats text (DART-5 27.0% -> 54.0%,
AIME24 0% -> 14%); with 64 planning tokens and ~5 execution tokens the
DDLM->ARM pipeline beats a 7B ARM using 44x more tokens.

Measured with 'cpu' (seed 0, 500 test problems per level; accuracy % on
levels 1 / 2 / 3 / 4 / held-out 5; docs/RESULTS.md):
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

from ddlm_jax.data.planning_tasks import TASK_NAMES, get_task
from experiments.configs import common

PIPELINES = ('direct', 'cot', 'text', 'latent')
PRESETS = ('', 'cpu', 'smoke')
SMOKE_ARG = 'latent,smoke'
# 'cpu' preset of the new tasks: (steps of planner and every executor,
# projector steps). Equal planner / executor budgets.
TASK_CPU = {'sudoku4': (1000, 300), 'countdown': (1000, 300),
            'paths': (1000, 300)}  # fmt: skip


# 'PIPELINE[,TASK][,preset]'
ARGS = (
  common.Choice('pipeline', PIPELINES),
  common.Choice('task', TASK_NAMES, 'arithmetic'),
)


def _model(width, depth, heads, num_steps, batch, lr):
  """A stage block: its network and its own train settings (num_steps,
  batch_size, learning_rate, as train.* means them for the LM configs)."""
  b = ml_collections.ConfigDict()
  b.width, b.depth, b.num_heads = width, depth, heads
  b.num_steps, b.batch_size, b.learning_rate = num_steps, batch, lr
  return b


def get_config(arg: str = 'latent') -> ml_collections.ConfigDict:
  pipeline, task_name, preset = common.parse_arg(arg, *ARGS, presets=PRESETS)
  task = get_task(task_name)
  c = ml_collections.ConfigDict()
  c.pipeline = pipeline
  c.task = task_name
  c.kind = 'planner_executor'  # Declared task kind for experiments.run.
  c.seed = 0
  c.models_dir = ''  # Shared trained models; '' = <workdir>/models.

  c.reasoning = ml_collections.ConfigDict()  # the task's levels and P
  c.reasoning.train_levels = task.train_levels
  c.reasoning.test_levels = task.levels
  c.reasoning.heldout_level = task.heldout_level  # not a training level
  c.reasoning.plan_len = task.plan_len  # P; arithmetic level 5 needs 10.
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
  c.latent.num_steps = 4000
  c.latent.batch_size = 128
  c.latent.learning_rate = 1e-3

  c.optim = ml_collections.ConfigDict()
  c.optim.weight_decay = 0.01
  c.optim.warmup_fraction = 0.05
  c.optim.final_lr_fraction = 0.1
  c.optim.grad_clip = 1.0

  c.train = ml_collections.ConfigDict()
  # > 0 caps every stage's steps (quick runs); each stage's own length is
  # its block's `num_steps` (planner.num_steps, executor.num_steps,
  # latent.num_steps) and its batch its block's `batch_size`.
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
    # (validation plan accuracy); see docs/HISTORY.md, section 8.
    c.planner.loss_type = 'simple_ce'
    c.executor = _model(64, 3, 4, 3000, 64, 2e-3)
    c.latent.pool_size = 4096
    c.latent.num_steps = 1500
    c.latent.batch_size = 64
    c.reasoning.num_test_per_level = 500
    c.train.log_every = 250
    c.train.checkpoint_every = 500
    if task_name in TASK_CPU:
      steps, proj_steps = TASK_CPU[task_name]
      c.planner = _model(64, 2, 4, steps, 64, 2e-3)
      c.planner.loss_type = 'simple_ce'
      c.executor = _model(64, 2, 4, steps, 64, 2e-3)
      c.latent.num_steps = proj_steps
      c.latent.pool_size = 1024
      c.reasoning.num_test_per_level = 200
      c.train.log_every = 100
  elif preset == 'smoke':
    c.planner = _model(16, 1, 2, 3, 8, 1e-3)
    c.planner.loss_type = 'elbo'
    c.executor = _model(16, 1, 2, 3, 8, 1e-3)
    c.plan.steps = 4
    c.latent.pool_size = 16
    c.latent.num_steps = 3
    c.latent.batch_size = 8
    c.reasoning.num_test_per_level = 4
    c.train.log_every = 1
    c.train.checkpoint_every = 3
    c.train.max_stage_steps = 3
    c.train.fast_compile = True
    c.eval.batch_size = 8
  return c
