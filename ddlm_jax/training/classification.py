"""The state-tracking benchmark (PD-SSM paper, Table 2) as a loop task.

``train_state_tracking(config, workdir)`` trains a ``SequenceClassifier`` on
one task of ``ddlm_jax.data.state_tracking`` with the last-token loss
through the one loop (``training.fit``): AdamW (warmup then cosine),
periodic validation at long lengths and a final TEST accuracy at test
lengths. The workdir gets
config.json, metrics.jsonl, summary.json and orbax checkpoints; a restarted
run resumes from the newest checkpoint and replays the data stream to the
same position, so it continues exactly where it stopped.

Model selection: the task's after-eval hook keeps the parameters with the
best validation accuracy in state.extra (validation uses the test lengths
on a separate stream), and the summary reports test accuracy of those
(``test_accuracy``) and of the final parameters (``test_accuracy_final``).

A step whose loss or gradients are not finite leaves the state unchanged and
is recorded; the run then stops, names the step and reports status 'nan'.
"""

from __future__ import annotations

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm
from ddlm_jax.training import config as config_lib
from ddlm_jax.training import metrics
from ddlm_jax.training.config import TrainerConfig, check_range
from ddlm_jax.training.fit import (
  FAST_COMPILE,
  FitResult,
  Task,
  TrainingDivergedError,
  fit,
  restore_newest,
)


def _task_kwargs(config) -> dict:
  k = config.task.num_generators
  return {
    'num_generators': k or None,
    'generator_seed': config.task.generator_seed,
  }


def classifier_config(config) -> sc.ClassifierConfig:
  """ClassifierConfig for the config's task and model."""
  vocab, classes = st.task_info(
    config.task.name, num_generators=config.task.num_generators or None
  )
  m = config.model
  extra = {}
  if m.mixer == 'transformer':
    extra['num_heads'] = m.num_heads
  elif m.mixer in ssm.MODES:
    extra['initial_state'] = m.get('initial_state', 'zeros')
  return sc.ClassifierConfig(
    vocab_size=vocab,
    num_classes=classes,
    mixer=m.mixer,
    d_model=m.d_model,
    state_size=m.state_size,
    num_dict=m.num_dict,
    num_layers=m.num_layers,
    mlp_ratio=m.mlp_ratio,
    scan_impl=m.scan_impl,
    mixer_kwargs=tuple(extra.items()),
  )


def _train_stream(config, seed: int):
  """Endless train batches: fresh samples, or epochs over a fixed set."""
  t = config.task
  lo, hi = t.train_lengths
  batch = config.train.batch_size
  kw = _task_kwargs(config)
  if t.num_train <= 0:
    return st.stream_batches(
      t.name, batch, seed=seed, min_len=lo, max_len=hi, **kw
    )
  data = st.make_split(
    t.name, 'train', t.num_train, seed=seed, min_len=lo, max_len=hi, **kw
  )
  return st.iterate_batches(data, batch, seed=seed, num_epochs=None)


def _eval_split(config, split: str, num: int, seed: int) -> dict:
  lo, hi = config.task.eval_lengths
  return st.make_split(
    config.task.name,
    split,
    num,
    seed=seed,
    min_len=lo,
    max_len=hi,
    **_task_kwargs(config),
  )


def _check_config(config) -> None:
  t, tr = config.task, config.train
  if t.name not in st.TASKS:
    raise ValueError(
      f'config.task.name={t.name!r}; choose one of {sorted(st.TASKS)}.'
    )
  if config.model.mixer not in sc.MIXERS:
    raise ValueError(
      f'config.model.mixer={config.model.mixer!r}; choose one of '
      f'{sorted(sc.MIXERS)}.'
    )
  if tr.num_steps < 1 or tr.batch_size < 1 or config.eval.batch_size < 1:
    raise ValueError(
      'train.num_steps, train.batch_size and eval.batch_size must be >= 1.'
    )
  if 0 < t.num_train < tr.batch_size:
    raise ValueError(
      f'task.num_train={t.num_train} < train.batch_size={tr.batch_size}; '
      'raise num_train or use 0 for fresh samples every step.'
    )
  if min(t.num_validation, t.num_test) < 1:
    raise ValueError('task.num_validation and task.num_test must be >= 1.')


def _loss_acc(model, batch):
  logits = model(batch['tokens'], batch['lengths'])
  return sc.classification_metrics(logits, batch['labels'])


def make_eval_step(graphdef):
  """(params, batch) -> (hit_B, nll_B): per-sequence correctness and loss."""

  def step(params, batch):
    logits = nnx.merge(graphdef, params)(batch['tokens'], batch['lengths'])
    nll = optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['labels']
    )
    hit = (jnp.argmax(logits, -1) == batch['labels']).astype(jnp.float32)
    return hit, nll

  return step


def evaluate(
  eval_step, params, data: dict, batch_size: int, *, per_sequence=False
) -> dict:
  """Accuracy and loss over a whole split (the last batch is padded).

  ``per_sequence=True`` adds the 'hit' and 'nll' arrays, one entry per
  sequence of ``data``, for breakdowns such as ``accuracy_by_length``.
  """
  num = len(data['labels'])
  hits, nlls = [], []
  for start in range(0, num, batch_size):
    idx = np.minimum(np.arange(start, start + batch_size), num - 1)
    h, n = eval_step(params, {k: v[idx] for k, v in data.items()})
    hits.append(np.asarray(h))
    nlls.append(np.asarray(n))
  hit, nll = np.concatenate(hits)[:num], np.concatenate(nlls)[:num]
  res = {'accuracy': float(hit.mean()), 'loss': float(nll.mean())}
  if per_sequence:
    res.update(hit=hit, nll=nll)
  return res


def accuracy_by_length(
  hit_N: np.ndarray, lengths_N: np.ndarray, num_buckets: int = 6
) -> list[dict]:
  """Accuracy in equal-width length buckets [lo, hi] (inclusive), in order.

  Shows where length extrapolation breaks: a model that only fits the
  training lengths is right near the shortest test lengths and at chance
  on the longest.
  """
  lo, hi = int(lengths_N.min()), int(lengths_N.max())
  edges = np.linspace(lo, hi + 1, num_buckets + 1).round().astype(int)
  rows = []
  for a, b in itertools.pairwise(np.unique(edges)):
    sel = (lengths_N >= a) & (lengths_N < b)
    if sel.any():
      rows.append(
        {
          'lengths': [int(a), int(b) - 1],
          'accuracy': float(hit_N[sel].mean()),
          'n': int(sel.sum()),
        }
      )
  return rows


@functools.lru_cache(maxsize=8)
def _programs(ccfg: sc.ClassifierConfig, fast_compile: bool):
  """(graphdef, init(key) -> params, jitted eval_step) of a model config.

  Cached on the model config, so seeds of a sweep and restarts in one
  process reuse the compiled evaluation (the loop caches its train step on
  the task's cache_key in the same way).
  """
  build = lambda rngs: sc.SequenceClassifier(ccfg, rngs=rngs)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))

  def init(key):
    return nnx.to_pure_dict(nnx.state(build(nnx.Rngs(params=key))))

  options = FAST_COMPILE if fast_compile else None
  eval_step = jax.jit(make_eval_step(graphdef), compiler_options=options)
  return graphdef, init, eval_step


def trainer_config(config) -> TrainerConfig:
  """The loop settings of a state-tracking config (checked ranges)."""
  tr, o = config.train, config.optim
  num_steps = check_range('train.num_steps', tr.num_steps, lo=1, integer=True)
  return config_lib.trainer_config(
    num_steps=num_steps,
    seed=config.seed,
    log_every=tr.log_every,
    eval_every=tr.eval_every,
    eval_at_end=True,
    checkpoint_every=tr.checkpoint_every,
    max_checkpoints=tr.max_checkpoints,
    halt_after_steps=tr.halt_after_steps,
    ema_decay=float(o.get('ema_decay', 0.0)),
    grad_accum_steps=int(o.get('grad_accum_steps', 1)),
    fast_compile=bool(tr.fast_compile),
    optimizer=config_lib.optimizer_config(
      learning_rate=o.learning_rate,
      warmup_steps=config_lib.warmup_steps(o, num_steps),
      total_steps=num_steps,
      weight_decay=o.weight_decay,
      b1=o.b1,
      b2=o.b2,
      grad_clip=o.grad_clip,
      final_lr_fraction=o.final_lr_fraction,
    ),
  )


def best_params(state):
  """The best-validation parameters, or the current ones before any
  validation ran."""
  extra = state.extra
  return (
    extra['best_params']
    if float(extra['best_val_acc']) >= 0
    else (state.params)
  )


def _keep_best(early_stop: float):
  """after_eval: best-validation parameters in state.extra; early stop."""

  def after_eval(state, res, step):
    extra = state.extra
    if res['accuracy'] > float(extra['best_val_acc']):
      extra = {
        'best_params': jax.tree.map(jnp.copy, state.params),  # no aliasing
        'best_val_acc': jnp.float32(res['accuracy']),
        'best_step': jnp.int32(step),
      }
      state = state.replace(extra=extra)
    print(
      f'step {step}: validation acc {res["accuracy"]:.4f} (best '
      f'{float(extra["best_val_acc"]):.4f} at {int(extra["best_step"])})',
      flush=True,
    )
    return state, 0 < early_stop <= res['accuracy']

  return after_eval


def _init_extra(params):
  return {
    'best_params': jax.tree.map(jnp.zeros_like, params),
    'best_val_acc': jnp.full((), -1.0, jnp.float32),
    'best_step': jnp.zeros((), jnp.int32),
  }


def state_tracking_task(config) -> Task:
  """One (model, task, seed) run of the benchmark as a loop task."""
  _check_config(config)
  ccfg = classifier_config(config)
  tr, seed = config.train, config.seed
  graphdef, init, eval_step = _programs(ccfg, bool(tr.fast_compile))
  val = _eval_split(config, 'validation', config.task.num_validation, seed)
  batch = config.eval.batch_size

  def loss(params, key, batch):
    del key
    loss, acc = _loss_acc(nnx.merge(graphdef, params), batch)
    return loss, {'acc': acc}

  def summary(result: FitResult) -> dict:
    state, extra = result.state, result.state.extra
    out = {
      'model': config.model.mixer,
      'task': config.task.name,
      'seed': seed,
      'best_val_accuracy': float(extra['best_val_acc']),
      'best_step': int(extra['best_step']),
      'wall_s': round(result.wall_seconds_total, 1),
    }
    if not (result.finished or result.status == 'nan'):
      return out
    test = _eval_split(config, 'test', config.task.num_test, seed)
    final = evaluate(eval_step, state.params, test, batch, per_sequence=True)
    best = final
    if float(extra['best_val_acc']) >= 0:  # Else no validation ran.
      best = evaluate(
        eval_step, best_params(state), test, batch, per_sequence=True
      )
    out.update(
      test_accuracy=best['accuracy'],
      test_loss=best['loss'],
      test_accuracy_final=final['accuracy'],
      test_lengths=list(config.task.eval_lengths),
      num_test=config.task.num_test,
      test_accuracy_by_length=accuracy_by_length(best['hit'], test['lengths']),
    )
    result.writer.write(result.step, 'test', {'accuracy': best['accuracy']})
    print(
      f'TEST accuracy {best["accuracy"]:.4f} (best-validation params; final '
      f'params {final["accuracy"]:.4f}) on {config.task.num_test} sequences '
      f'of length {config.task.eval_lengths}',
      flush=True,
    )
    return out

  return Task(
    name=f'{config.model.mixer} on {config.task.name}',
    init=init,
    loss=loss,
    batches=lambda start: itertools.islice(
      _train_stream(config, seed), start, None
    ),
    evaluate=lambda params, step: evaluate(eval_step, params, val, batch),
    after_eval=_keep_best(float(tr.get('early_stop_accuracy', 0.0))),
    summary=summary,
    init_extra=_init_extra,
    tokens_per_step=tr.batch_size * config.task.train_lengths[1],
    shown=('loss', 'acc'),
    log_window_mean=True,
    header=(
      f'{config.model.mixer} on {config.task.name} (seed {seed}): '
      f'{ccfg.d_model=} {ccfg.state_size=} {ccfg.num_layers=}, '
      f'{tr.num_steps} steps of {tr.batch_size}'
    ),
    cache_key=('state_tracking', ccfg),
  )


def restore_state(config, workdir: str):
  """The newest checkpointed train state of a run (a clear error if none)."""
  return restore_newest(
    state_tracking_task(config), trainer_config(config), workdir
  )


def score_best(config, state) -> tuple[dict, dict]:
  """(per-sequence test scores of the best parameters, the test split)."""
  _, _, eval_step = _programs(
    classifier_config(config), bool(config.train.fast_compile)
  )
  test = _eval_split(config, 'test', config.task.num_test, config.seed)
  res = evaluate(
    eval_step,
    best_params(state),
    test,
    config.eval.batch_size,
    per_sequence=True,
  )
  return res, test


def evaluate_checkpoint(config, workdir: str) -> dict:
  """--mode=eval: test accuracy of the newest checkpoint's best parameters.

  Writes workdir/eval_test.json (accuracy, loss, by-length breakdown).
  """
  state = restore_state(config, workdir)
  res, test = score_best(config, state)
  out = {
    'step': int(state.step),
    'accuracy': res['accuracy'],
    'loss': res['loss'],
    'accuracy_by_length': accuracy_by_length(res['hit'], test['lengths']),
  }
  metrics.write_json(os.path.join(workdir, 'eval_test.json'), out)
  return out


def train_state_tracking(config, workdir: str) -> dict:
  """Trains and tests one (model, task, seed) run; returns the summary.

  Args:
    config: ConfigDict from ``experiments/configs/state_tracking.py``.
    workdir: output folder (created); an existing run there is resumed.

  Returns:
    The summary dict also written to workdir/summary.json: test and best
    validation accuracy, steps, wall time over all starts, status ('ok' or
    'nan': a non-finite step stopped the run, which is then tested with
    the last finite parameters, so a sweep goes on).
  """
  task = state_tracking_task(config)
  cfg = trainer_config(config)
  try:
    return fit(task, cfg, workdir, config_record=config.to_dict())
  except TrainingDivergedError as err:
    return err.summary
