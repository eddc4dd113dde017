"""Training and evaluation of the planner/executor pipelines.

`run_planner_executor(config, workdir)` is what `experiments.run` calls for
configs from experiments/configs/planner_executor.py. It trains the models
its pipeline needs, each into its own folder under `config.models_dir`
(default workdir/models) so that pipelines share them:

  planner   MDLM on [question, plan], question clean, loss on the plan.
  direct    AR executor, loss on the answer, PAD plan field.
  cot       AR executor, loss on plan field + '=' + answer (its own CoT).
  text      AR executor, loss on the answer given the GOLD plan.

The latent pipeline then trains a projector in workdir/projector on the
answer loss, with planner and text executor frozen (`latent.
unfreeze_executor` fine-tunes a copy of the executor with it). Its training
data is a pool of planner hidden states for fresh training problems,
computed once with the pipeline's own planner settings. Every trainer
resumes from its newest checkpoint and regenerates the same batches.

Finally the pipeline runs on the test split (every level, including the
held-out one) and workdir/summary.json gets accuracy per level, plan
accuracy, planner NFE, plan and execution tokens, and FLOPs per problem.
`config.task` names the planning task (data/planning_tasks.py; default
'arithmetic', the task of reasoning.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax import paths
from ddlm_jax.data.planning_tasks import PlanningTask, get_task
from ddlm_jax.diffusion.autoregressive import Autoregressive
from ddlm_jax.diffusion.masked import token_cross_entropy
from ddlm_jax.planning import conditional, layout, pipelines
from ddlm_jax.planning import models as pm
from ddlm_jax.sampling.registry import get_sampler, parse_spec, sampler_params
from ddlm_jax.training import config as config_lib
from ddlm_jax.training import metrics
from ddlm_jax.training.config import (
  TrainerConfig,
  check_range,
  check_renamed_keys,
)
from ddlm_jax.training.fit import Display, Task, finish, fit
from ddlm_jax.training.workdir_lock import WorkdirLock

ROLES = ('planner', 'direct', 'cot', 'text')
NEEDS = {
  'direct': ('direct',),
  'cot': ('cot',),
  'text': ('planner', 'text'),
  'latent': ('planner', 'text'),
}
_FAST_COMPILE = pipelines.FAST_COMPILE
# The per-stage train blocks: each has num_steps, batch_size, learning_rate.
STAGE_BLOCKS = ('planner', 'executor', 'latent')


def task_of(config) -> PlanningTask:
  """The config's planning task (config.task; 'arithmetic' if absent)."""
  try:
    return get_task(config.get('task', 'arithmetic'))
  except ValueError as e:
    raise ValueError(f'config.task: {e}') from None


def check_config(config) -> None:
  """Clear errors for bad settings, before anything is traced."""
  if config.pipeline not in pipelines.PIPELINES:
    raise ValueError(
      f'config.pipeline={config.pipeline!r}; choose one of '
      f'{pipelines.PIPELINES}.'
    )
  task = task_of(config)
  t = config.reasoning
  for name in ('train_levels', 'test_levels'):
    levels = tuple(t[name])
    if not levels or any(v not in task.levels for v in levels):
      raise ValueError(
        f'reasoning.{name}={levels}; levels of task {task.name!r} must be '
        f'in {task.levels} (pass the task in the config argument, e.g. '
        f"'latent,{task.name},cpu', to get its defaults)."
      )
  heldout = t.get('heldout_level', None)
  if heldout is not None:
    if heldout in tuple(t.train_levels):
      raise ValueError(
        f'reasoning.heldout_level={heldout} is one of the training levels '
        f'{tuple(t.train_levels)}; hold out a level that is not trained on.'
      )
    if heldout not in tuple(t.test_levels):
      raise ValueError(
        f'reasoning.heldout_level={heldout} is not tested; add it to '
        f'reasoning.test_levels={tuple(t.test_levels)}.'
      )
  top = max(max(t.train_levels), max(t.test_levels))
  need = max(task.plan_tokens_needed(v) for v in task.levels if v <= top)
  if t.plan_len < need:
    raise ValueError(
      f'reasoning.plan_len={t.plan_len} cannot hold a level '
      f'{top} plan of task {task.name!r} ({need} tokens); raise it.'
    )
  check_renamed_keys(config)  # A config file older than a key's rename.
  for block in STAGE_BLOCKS:
    b = config[block]
    check_range(f'{block}.num_steps', b.num_steps, lo=1, integer=True)
    check_range(f'{block}.batch_size', b.batch_size, lo=1, integer=True)
    stage_trainer_config(config, block)  # Ranges, before any stage runs.
  if t.num_test_per_level < 1 or config.eval.batch_size < 1:
    raise ValueError(
      'reasoning.num_test_per_level, eval.batch_size must be >= 1.'
    )


def make_sampler(config):
  """The planner's sampler: spec string plus the step count if it takes one."""
  name, params = parse_spec(config.plan.sampler)
  if 'num_steps' in sampler_params(name) and 'num_steps' not in params:
    params['num_steps'] = int(config.plan.steps)
  return get_sampler(name, **params)


def pipeline_spec(config) -> pipelines.PipelineSpec:
  name = config.pipeline
  uses_sampler = name == 'text' or (
    name == 'latent' and config.latent.source == 'final'
  )
  return pipelines.PipelineSpec(
    name=name,
    plan_len=int(config.reasoning.plan_len),
    sampler=make_sampler(config) if uses_sampler else None,
    latent_source=config.latent.source,
    exec_temperature=float(config.eval.exec_temperature),
    task=task_of(config).name,
  )


def model_configs(config) -> dict:
  v = task_of(config).vocab_size
  return {
    'planner': pm.backbone_config(config.planner, causal=False, vocab_size=v),
    'executor': pm.backbone_config(config.executor, causal=True, vocab_size=v),
  }


# ----------------------------------------------------------------- losses


def _role_batch(
  role: str, raw: dict, plan_len: int, task: str = 'arithmetic'
) -> dict:
  """Model inputs of one role from a raw task batch."""
  q, plan = raw['question'], raw['plan']
  batch = q.shape[0]
  if role == 'planner':
    return {
      'x': layout.planner_sequence(q, plan),
      'cond': layout.condition_mask(batch, plan_len, task),
    }
  if role == 'direct':
    plan = layout.pad_plan(batch, plan_len, task)
  kind = 'cot' if role == 'cot' else 'answer'
  return {
    'x': layout.executor_sequence(q, plan, raw['answer'], task),
    'mask': layout.executor_loss_mask(batch, plan_len, kind, task),
  }


def role_loss(
  role: str,
  graphdef,
  plan_len: int,
  loss_type: str = 'elbo',
  task: str = 'arithmetic',
):
  """loss(params, key, batch) -> (scalar loss, metrics) for a model role.

  `loss_type` is the planner's objective: 'elbo' (the NELBO) or 'simple_ce'
  (unweighted cross-entropy on the masked plan tokens); both report the
  NELBO.
  """
  if role == 'planner':
    process = pipelines.planner_process(loss_type, task)

    def loss(params, key, batch):
      model = pm.merge(graphdef, params)
      obj_B, nelbo_B, _ = conditional.conditional_loss(
        process, lambda z, t: model(z), key, batch['x'], batch['cond']
      )
      return obj_B.mean() / plan_len, {
        'nelbo_per_token': nelbo_B.mean() / plan_len
      }

    return loss

  ar = Autoregressive(get_task(task).vocab_size)
  pos = layout.answer_position(plan_len, task)

  def loss(params, key, batch):
    del key
    model = pm.merge(graphdef, params)
    logits = model(ar.shift_right(batch['x']))
    nll_BxL = token_cross_entropy(logits, batch['x']) * batch['mask']
    acc = jnp.mean(jnp.argmax(logits[:, pos], -1) == batch['x'][:, pos])
    return nll_BxL.sum() / batch['mask'].sum(), {'answer_acc': acc}

  return loss


def projector_loss(
  graphdefs: dict, frozen: dict, plan_len: int, task: str = 'arithmetic'
):
  """Answer loss of the latent pipeline; gradients reach `params` only.

  `params` holds 'projector' (and 'executor' when unfrozen); `frozen` the
  rest. Batches carry the precomputed planner hidden states 'h'.
  """
  pos = layout.answer_position(plan_len, task)

  def loss(params, key, batch):
    del key
    merged = {**frozen, **params}
    executor = pm.merge(graphdefs['executor'], merged['executor'])
    projector = pm.merge(graphdefs['projector'], merged['projector'])
    soft = projector(batch['h'])
    logits = pm.executor_logits(executor, batch['x'], soft)[:, pos]
    ce = token_cross_entropy(logits[:, None], batch['answer'][:, None])
    acc = jnp.mean(jnp.argmax(logits, -1) == batch['answer'])
    return ce.mean(), {'answer_acc': acc}

  return loss


# ------------------------------------------------------------------- loop


def num_steps(config, block) -> int:
  """A block's num_steps, capped by train.max_stage_steps when > 0."""
  cap = check_range(
    'train.max_stage_steps', config.train.max_stage_steps, lo=0, integer=True
  )
  steps = int(block.num_steps)
  return min(steps, cap) if cap > 0 else steps


def stage_trainer_config(config, block_key: str) -> TrainerConfig:
  """Loop settings of one stage, from its config block: 'planner',
  'executor' (every executor) or 'latent' (the projector)."""
  o, tr, block = config.optim, config.train, config[block_key]
  steps = num_steps(config, block)
  return config_lib.trainer_config(
    num_steps=steps,
    seed=config.seed,
    log_every=tr.log_every,
    checkpoint_every=tr.checkpoint_every,
    max_checkpoints=1,
    halt_after_steps=int(tr.get('halt_after_steps', 0)),
    fast_compile=bool(tr.fast_compile),
    optimizer=config_lib.optimizer_config(
      learning_rate=block.learning_rate,
      lr_key=f'{block_key}.learning_rate',
      warmup_steps=config_lib.warmup_steps(o, steps),
      total_steps=steps,
      weight_decay=o.weight_decay,
      grad_clip=o.grad_clip,
      final_lr_fraction=o.final_lr_fraction,
    ),
  )


class StageNotFinishedError(RuntimeError):
  """A stage stopped before its last step (halt_after_steps, preemption)."""

  def __init__(self, name: str, summary: dict):
    super().__init__(f'{name}: stopped at step {summary.get("steps")}')
    self.name, self.summary = name, summary


def train(
  name: str,
  directory: str,
  params: dict,
  loss_fn: Callable,
  batches: Callable[[int], Iterator[dict]],
  config,
  block_key: str,
  *,
  allow_fresh_start: bool = False,
) -> dict:
  """Trains `params` for the steps of config[block_key]; resumable.

  One task of the shared loop (training.fit) in its own folder
  (checkpoints, metrics.jsonl, summary.json).

  Args:
    name: label for the progress lines.
    directory: the stage's folder.
    params: initial parameters (ignored when a checkpoint exists).
    loss_fn: loss(params, key, batch) -> (loss, metrics).
    batches: batches(start_step) -> iterator of host batches.
    config: the full config (optim, train blocks).
    block_key: the stage's block ('planner', 'executor', 'latent'):
      num_steps, learning rate, batch size.
    allow_fresh_start: train from step 0 although every checkpoint of the
      stage is unreadable (else that refuses, as fit does).

  Returns:
    The trained parameters; raises StageNotFinishedError when the stage halted
    or was preempted before its last step.
  """
  initial = jax.tree.map(jnp.copy, params)  # the caller's arrays stay valid
  task = Task(init=lambda key: initial, loss=loss_fn, batches=batches)
  result = fit(
    task,
    stage_trainer_config(config, block_key),
    directory,
    display=Display(
      name=name,
      shown=('loss', 'answer_acc', 'nelbo_per_token'),
      log_window_mean=True,
    ),
    allow_fresh_start=allow_fresh_start,
  )
  summary = finish(result, lambda res, writer: {'stage': name})
  if not result.finished or summary['status'] != 'ok':
    raise StageNotFinishedError(name, summary)
  return result.params


def _task_stream(config, block, start: int) -> Iterator[dict]:
  return task_of(config).stream_batches(
    int(block.batch_size),
    tuple(config.reasoning.train_levels),
    seed=config.seed,
    plan_len=int(config.reasoning.plan_len),
    start=start,
  )


def train_role(
  config, role: str, models_dir: str, *, allow_fresh_start: bool = False
) -> tuple[Any, dict]:
  """(graphdef, params) of a trained planner or executor role."""
  if role not in ROLES:
    raise ValueError(f'role {role!r}; choose one of {ROLES}.')
  cfgs = model_configs(config)
  block = config.planner if role == 'planner' else config.executor
  cfg = cfgs['planner' if role == 'planner' else 'executor']
  seed = config.seed * 1000 + ROLES.index(role)
  graphdef, params = pm.split(pm.build(cfg, seed))
  plan_len = int(config.reasoning.plan_len)
  task = task_of(config).name

  def batches(start):
    for raw in _task_stream(config, block, start):
      yield _role_batch(role, raw, plan_len, task)

  directory = os.path.join(models_dir, role)
  params = train(
    role,
    directory,
    params,
    role_loss(role, graphdef, plan_len, config.planner.loss_type, task),
    batches,
    config,
    'planner' if role == 'planner' else 'executor',
    allow_fresh_start=allow_fresh_start,
  )
  if role == 'planner':
    path = os.path.join(directory, 'validation.json')
    if not paths.exists(path):
      res = validate_planner(config, graphdef, params)
      metrics.write_json(path, res)
      print(f'planner validation plan accuracy: {res}', flush=True)
  return graphdef, params


def validate_planner(config, graphdef, params) -> dict:
  """Exact plan accuracy per training level on the validation split."""
  task = task_of(config)
  spec = pipelines.PipelineSpec(
    'text',
    int(config.reasoning.plan_len),
    sampler=make_sampler(config),
    task=task.name,
  )
  data = task.make_split(
    'validation',
    tuple(config.reasoning.train_levels),
    int(config.eval.batch_size),
    seed=config.seed,
    plan_len=spec.plan_len,
  )

  def planner(p, q):
    return conditional.sample_plan(
      spec.sampler,
      lambda z, t: pm.merge(graphdef, p)(z),
      jax.random.key(config.seed + 2),
      pipelines.planner_process(task=task.name),
      q,
      spec.plan_len,
    )[0]

  fast = _FAST_COMPILE if config.train.fast_compile else None
  planner = jax.jit(planner, compiler_options=fast)
  plan = np.asarray(planner(params, jnp.asarray(data['question'])))
  ok = task.plan_correct(data['question'], plan)
  return {
    str(v): float(ok[data['level'] == v].mean())
    for v in config.reasoning.train_levels
  }


# ---------------------------------------------------------------- latent


def make_hidden_fn(
  spec: pipelines.PipelineSpec, planner_graphdef, fast_compile=False
):
  """jit (planner params, key, question) -> planner states at the plan."""
  process = pipelines.planner_process(task=spec.task)

  def hidden(params, key, question_BxQ):
    planner = pm.merge(planner_graphdef, params)
    if spec.latent_source == 'final':
      _, _, z = conditional.sample_plan(
        spec.sampler,
        lambda z, t: planner(z),
        key,
        process,
        question_BxQ,
        spec.plan_len,
      )
    else:
      z = conditional.plan_prompt(question_BxQ, spec.plan_len, process.mask_id)
    return pm.planner_hidden(planner, z)[:, -spec.plan_len :]

  return jax.jit(
    hidden, compiler_options=_FAST_COMPILE if fast_compile else None
  )


def hidden_pool(config, spec, planner_graphdef, planner_params) -> dict:
  """Planner hidden states for latent.pool_size fresh training problems."""
  lat = config.latent
  size, bs = int(lat.pool_size), int(config.eval.batch_size)
  fn = make_hidden_fn(spec, planner_graphdef, config.train.fast_compile)
  stream = task_of(config).stream_batches(
    bs,
    tuple(config.reasoning.train_levels),
    seed=config.seed + 7919,  # not the executors' training stream
    plan_len=spec.plan_len,
  )
  key = jax.random.key(config.seed + 1)
  parts = []
  for i in range((size + bs - 1) // bs):
    raw = next(stream)
    h = fn(
      planner_params, jax.random.fold_in(key, i), jnp.asarray(raw['question'])
    )
    parts.append(
      {'question': raw['question'], 'answer': raw['answer'], 'h': np.asarray(h)}
    )
  return {k: np.concatenate([p[k] for p in parts])[:size] for k in parts[0]}


def _pool_batches(
  pool: dict,
  batch: int,
  seed: int,
  plan_len: int,
  start: int,
  task: str = 'arithmetic',
):
  num = len(pool['answer'])
  per_epoch = max(num // batch, 1)
  step = start
  while True:
    epoch, i = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num)
    idx = order[i * batch : (i + 1) * batch]
    q = pool['question'][idx]
    yield {
      'x': layout.executor_sequence(
        q,
        layout.pad_plan(len(idx), plan_len, task),
        pool['answer'][idx],
        task,
      ),
      'h': pool['h'][idx],
      'answer': pool['answer'][idx].astype(np.int32),
    }
    step += 1


def build_projector(config, seed: int) -> pm.Projector:
  lat = config.latent
  return pm.Projector(
    int(config.planner.width),
    int(config.executor.width),
    hidden=int(lat.projector_hidden),
    num_layers=int(lat.projector_layers),
    rngs=nnx.Rngs(params=jax.random.key(seed)),
  )


def train_projector(
  config,
  workdir: str,
  graphdefs: dict,
  params: dict,
  *,
  allow_fresh_start: bool = False,
):
  """Trains the projector (and optionally the executor); returns params."""
  spec = pipeline_spec(config)
  lat = config.latent
  proj_graphdef, proj_params = pm.split(build_projector(config, config.seed))
  graphdefs = {**graphdefs, 'projector': proj_graphdef}
  trainable = {'projector': proj_params}
  frozen = {'planner': params['planner']}
  if lat.unfreeze_executor:
    trainable['executor'] = params['executor']
  else:
    frozen['executor'] = params['executor']
  directory = os.path.join(workdir, 'projector')
  done = os.path.join(directory, 'checkpoints', str(num_steps(config, lat)))
  pool = None
  if not paths.exists(done):
    t0 = time.time()
    pool = hidden_pool(config, spec, graphdefs['planner'], params['planner'])
    print(
      f'projector: pool of {len(pool["answer"])} planner states '
      f'({lat.source}) in {time.time() - t0:.1f}s',
      flush=True,
    )

  def batches(start):
    return _pool_batches(
      pool, int(lat.batch_size), config.seed, spec.plan_len, start, spec.task
    )

  trained = train(
    'projector',
    directory,
    trainable,
    projector_loss(graphdefs, frozen, spec.plan_len, spec.task),
    batches,
    config,
    'latent',
    allow_fresh_start=allow_fresh_start,
  )
  return graphdefs, {**params, **trained}


# ------------------------------------------------------------ evaluation


def evaluate(config, spec, graphdefs: dict, params: dict) -> dict:
  """Runs the pipeline on the test split; per-level and mean statistics."""
  t, task = config.reasoning, task_of(config)
  data = task.make_split(
    'test',
    tuple(t.test_levels),
    int(t.num_test_per_level),
    seed=config.seed,
    plan_len=spec.plan_len,
  )
  runner = pipelines.make_runner(
    spec, graphdefs, bool(config.train.fast_compile)
  )
  bs, num = int(config.eval.batch_size), len(data['answer'])
  key = jax.random.key(config.seed + 12345)
  outs = []
  for i, start in enumerate(range(0, num, bs)):
    idx = np.minimum(np.arange(start, start + bs), num - 1)
    out = runner(
      params, jax.random.fold_in(key, i), jnp.asarray(data['question'][idx])
    )
    out = jax.device_get(out)
    keep = slice(0, min(bs, num - start))
    outs.append(
      {
        'answer_B': out['answer_B'][keep],
        'plan_BxP': out['plan_BxP'][keep],
        'exec_tokens_B': out['exec_tokens_B'][keep],
        'plan_nfe_B': np.full(keep.stop, int(out['plan_nfe'])),
        'exec_nfe_B': np.full(keep.stop, int(out['exec_nfe'])),
      }
    )
  out = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
  correct = out['answer_B'] == data['answer']
  has_plan = spec.name in ('cot', 'text') or (
    spec.name == 'latent' and spec.latent_source == 'final'
  )
  plan_ok = (
    task.plan_correct(data['question'], out['plan_BxP']) if has_plan else None
  )
  per_level = {}
  for v in t.test_levels:
    sel = data['level'] == v
    per_level[str(v)] = {
      'accuracy': float(correct[sel].mean()),
      'plan_accuracy': float(plan_ok[sel].mean()) if has_plan else None,
      'exec_tokens': float(out['exec_tokens_B'][sel].mean()),
    }
  plan_nfe = float(out['plan_nfe_B'].mean())
  exec_nfe = float(out['exec_nfe_B'].mean())
  projector = None
  if spec.name == 'latent':
    projector = pm.merge(graphdefs['projector'], params['projector'])
  cfgs = model_configs(config)
  if spec.name in ('direct', 'cot'):
    cfgs.pop('planner')
  flops = pipelines.pipeline_flops(spec, cfgs, plan_nfe, exec_nfe, projector)
  plan_tokens = 0
  if spec.name == 'text' or (
    spec.name == 'latent' and spec.latent_source == 'final'
  ):
    plan_tokens = spec.plan_len
  train_levels = set(t.train_levels)
  seen = [v for v in t.test_levels if v in train_levels]
  return {
    'per_level': per_level,
    'accuracy_train_levels': float(
      np.mean([per_level[str(v)]['accuracy'] for v in seen])
    )
    if seen
    else None,
    'accuracy': float(correct.mean()),
    'planning_nfe': plan_nfe,
    'plan_tokens': plan_tokens,
    'latent_tokens': spec.plan_len if spec.name == 'latent' else 0,
    'exec_nfe': exec_nfe,
    'exec_tokens': float(out['exec_tokens_B'].mean()),
    **flops,
    'num_test': num,
  }


def load_models(
  config, models_dir: str, *, allow_fresh_start: bool = False
) -> tuple[dict, dict]:
  """Trains (or restores) the roles the config's pipeline needs."""
  graphdefs, params = {}, {}
  for role in NEEDS[config.pipeline]:
    g, p = train_role(
      config, role, models_dir, allow_fresh_start=allow_fresh_start
    )
    name = 'planner' if role == 'planner' else 'executor'
    graphdefs[name], params[name] = g, p
  return graphdefs, params


def stage_dirs(config, workdir: str) -> dict[str, tuple[str, int]]:
  """{stage: (folder, steps)} of every model the pipeline trains."""
  models_dir = config.models_dir or os.path.join(workdir, 'models')
  out = {}
  for role in NEEDS[config.pipeline]:
    block = config.planner if role == 'planner' else config.executor
    out[role] = (os.path.join(models_dir, role), num_steps(config, block))
  if config.pipeline == 'latent':
    out['projector'] = (
      os.path.join(workdir, 'projector'),
      num_steps(config, config.latent),
    )
  return out


def check_trained(config, workdir: str) -> None:
  """--mode=eval: every stage must have its final checkpoint already."""
  for stage, (folder, steps) in stage_dirs(config, workdir).items():
    if not paths.isdir(paths.join(folder, 'checkpoints', str(steps))):
      raise FileNotFoundError(
        f'--mode=eval: the {stage} stage has no final checkpoint (step '
        f'{steps}) in {folder}/checkpoints; train first (--mode=train).'
      )


def run_planner_executor(
  config,
  workdir: str,
  *,
  mode: str = 'train',
  allow_fresh_start: bool = False,
):
  """Trains what the pipeline needs, evaluates it, writes summary.json.

  mode 'eval' only evaluates: every stage must be trained already.
  allow_fresh_start: retrain a stage whose checkpoints are all unreadable
  (set aside as <step>.corrupt) from step 0; without it that refuses.
  A stage that halts (train.halt_after_steps) or is preempted stops the
  pipeline before evaluation; starting again resumes it.
  """
  check_config(config)
  if mode not in ('train', 'eval'):
    raise ValueError(
      f'planner/executor configs run --mode=train or eval, not {mode!r}.'
    )
  if mode == 'eval':
    check_trained(config, workdir)
  with WorkdirLock(workdir):
    return _run_pipeline(config, workdir, allow_fresh_start)


def _run_pipeline(config, workdir: str, allow_fresh_start: bool) -> dict:
  paths.makedirs(workdir)
  metrics.write_json(os.path.join(workdir, 'config.json'), config.to_dict())
  t0 = time.time()
  models_dir = config.models_dir or os.path.join(workdir, 'models')
  spec = pipeline_spec(config)
  try:
    graphdefs, params = load_models(
      config, models_dir, allow_fresh_start=allow_fresh_start
    )
    if spec.name == 'latent':
      graphdefs, params = train_projector(
        config,
        workdir,
        graphdefs,
        params,
        allow_fresh_start=allow_fresh_start,
      )
  except StageNotFinishedError as stop:
    print(f'{stop}; start again to resume.', flush=True)
    return {
      'status': stop.summary.get('status', 'halted'),
      'stage': stop.name,
      'steps': stop.summary.get('steps'),
      **(
        {'preempted_at_step': stop.summary['preempted_at_step']}
        if 'preempted_at_step' in stop.summary
        else {}
      ),
    }
  t1 = time.time()
  result = evaluate(config, spec, graphdefs, params)
  summary = {
    'pipeline': spec.name,
    'task': spec.task,
    'seed': config.seed,
    'plan_len': spec.plan_len,
    'sampler': repr(spec.sampler) if spec.sampler is not None else None,
    'latent_source': spec.latent_source if spec.name == 'latent' else None,
    'unfreeze_executor': bool(config.latent.unfreeze_executor)
    if spec.name == 'latent'
    else None,
    **result,
    'train_wall_s': round(t1 - t0, 1),
    'eval_wall_s': round(time.time() - t1, 1),
  }
  metrics.write_json(os.path.join(workdir, 'summary.json'), summary)
  levels = ' '.join(
    f'L{v}={r["accuracy"]:.3f}' for v, r in summary['per_level'].items()
  )
  print(
    f'{spec.name}: {levels} | plan NFE {summary["planning_nfe"]:.1f} | '
    f'exec tokens {summary["exec_tokens"]:.2f} | '
    f'{summary["flops"] / 1e6:.2f} MFLOP/problem',
    flush=True,
  )
  return summary
