"""Trainer for the state-tracking benchmark (PD-SSM paper, Table 2).

``train_state_tracking(config, workdir)`` trains a ``SequenceClassifier`` on
one task of ``ddlm_jax.data.state_tracking`` with the last-token loss, AdamW
(warmup then cosine, ``optimizer.make_optimizer``), periodic validation at
long lengths and a final TEST accuracy at test lengths. The workdir gets
config.json, metrics.jsonl, summary.json and orbax checkpoints; a restarted
run resumes from the newest checkpoint and replays the data stream to the
same position, so it continues exactly where it stopped.

Model selection: the state keeps the parameters with the best validation
accuracy (validation uses the test lengths on a separate stream), and the
summary reports test accuracy of those (``test_accuracy``) and of the final
parameters (``test_accuracy_final``).

A step whose loss or gradients are not finite leaves the state unchanged and
is recorded; the run then stops, names the step and reports status 'nan'.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm
from ddlm_jax.training import checkpoint, metrics, optimizer

# Cheap XLA compilation for smoke runs (config.train.fast_compile).
_FAST_COMPILE = {
  'xla_backend_optimization_level': 0,
  'xla_llvm_disable_expensive_passes': True,
}


@flax.struct.dataclass
class ClassifierState:
  step: jax.Array
  params: Any
  opt_state: Any
  best_params: Any  # Parameters with the best validation accuracy so far.
  best_val_acc: jax.Array  # -1 before the first validation.
  best_step: jax.Array
  bad_step: jax.Array  # First non-finite step; -1 while all is well.


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


def _tree_finite(tree) -> jax.Array:
  return jnp.all(
    jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)])
  )


def make_train_step(graphdef, tx):
  """(state, batch) -> (state, {'loss', 'acc'}); bad steps freeze the state."""

  def step(state: ClassifierState, batch):
    def loss_fn(params):
      loss, acc = _loss_acc(nnx.merge(graphdef, params), batch)
      return loss, acc

    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & _tree_finite(grads) & _tree_finite(updates)
    ok = finite & (state.bad_step < 0)
    keep = lambda new, old: jax.tree.map(
      lambda n, o: jnp.where(ok, n, o), new, old
    )
    new = state.replace(
      step=state.step + 1,
      params=keep(params, state.params),
      opt_state=keep(opt_state, state.opt_state),
      bad_step=jnp.where(
        (state.bad_step < 0) & ~finite, state.step + 1, state.bad_step
      ),
    )
    return new, {'loss': loss, 'acc': acc}

  return step


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
def _programs(ccfg: sc.ClassifierConfig, opt: tuple, fast_compile: bool):
  """Jitted (init, train_step, eval_step) and the lr schedule.

  Cached on the model config and optimiser settings, so seeds of a sweep and
  restarts in one process reuse the compiled programs.
  """
  tx, schedule = optimizer.make_optimizer(**dict(opt))
  build = lambda rngs: sc.SequenceClassifier(ccfg, rngs=rngs)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))

  def init(key):
    params = nnx.to_pure_dict(nnx.state(build(nnx.Rngs(params=key))))
    return ClassifierState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      best_params=jax.tree.map(jnp.zeros_like, params),
      best_val_acc=jnp.full((), -1.0, jnp.float32),
      best_step=jnp.zeros((), jnp.int32),
      bad_step=jnp.full((), -1, jnp.int32),
    )

  jit = functools.partial(
    jax.jit, compiler_options=_FAST_COMPILE if fast_compile else None
  )
  return (
    jit(init),
    jit(make_train_step(graphdef, tx), donate_argnums=0),
    jit(make_eval_step(graphdef)),
    schedule,
  )


def _config_programs(config):
  """``_programs`` for a run config: (init, train_step, eval_step, lr)."""
  tr, o = config.train, config.optim
  opt = dict(
    learning_rate=o.learning_rate,
    warmup_steps=int(round(o.warmup_fraction * tr.num_steps)),
    total_steps=tr.num_steps,
    weight_decay=o.weight_decay,
    b1=o.b1,
    b2=o.b2,
    grad_clip=o.grad_clip,
    final_lr_fraction=o.final_lr_fraction,
  )
  return _programs(
    classifier_config(config), tuple(sorted(opt.items())), tr.fast_compile
  )


def _best_params(state: ClassifierState):
  """The best-validation parameters, or the current ones before any
  validation ran."""
  return state.best_params if float(state.best_val_acc) >= 0 else state.params


def _restore(ckpt, state):
  """(latest checkpointed state, its data state), or (state, None)."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored = ckpt.restore_latest(
    jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state
    )
  )
  if restored is None:
    return state, None
  state, data_state, _ = restored
  return state, data_state


def rescore_by_length(workdir: str, num_buckets: int = 6) -> dict:
  """Adds test accuracy by length bucket to a finished run's summary.json.

  For runs recorded before summaries carried the breakdown: rebuilds the
  test split and the model from workdir/config.json, restores the last
  checkpoint and scores its best-validation parameters. The overall accuracy
  must reproduce the recorded one (a mismatch raises: the run folder and the
  code disagree).
  """
  import ml_collections

  summary_path = os.path.join(workdir, 'summary.json')
  with open(summary_path) as f:
    summary = json.load(f)
  if not summary.get('finished') or 'test_accuracy' not in summary:
    raise ValueError(f'{workdir}: not a finished run with a test score.')
  with open(os.path.join(workdir, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  init, _, eval_step, _ = _config_programs(config)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'))
  state, data_state = _restore(ckpt, init(jax.random.key(config.seed)))
  ckpt.close()
  if data_state is None:
    raise ValueError(f'{workdir}: no checkpoint to rescore.')
  test = _eval_split(config, 'test', config.task.num_test, config.seed)
  res = evaluate(
    eval_step,
    _best_params(state),
    test,
    config.eval.batch_size,
    per_sequence=True,
  )
  if abs(res['accuracy'] - summary['test_accuracy']) > 1e-6:
    raise ValueError(
      f'{workdir}: rescored test accuracy {res["accuracy"]:.6f} differs '
      f'from the recorded {summary["test_accuracy"]:.6f}.'
    )
  summary['test_accuracy_by_length'] = accuracy_by_length(
    res['hit'], test['lengths'], num_buckets
  )
  metrics.write_json(summary_path, summary)
  return summary


def train_state_tracking(config, workdir: str) -> dict:
  """Trains and tests one (model, task, seed) run; returns the summary.

  Args:
    config: ConfigDict from ``experiments/configs/state_tracking.py``.
    workdir: output folder (created); an existing run there is resumed.

  Returns:
    The summary dict also written to workdir/summary.json: test and best
    validation accuracy, steps, wall time over all starts, status ('ok' or
    'nan').
  """
  _check_config(config)
  os.makedirs(workdir, exist_ok=True)
  metrics.write_json(os.path.join(workdir, 'config.json'), config.to_dict())
  tr, seed = config.train, config.seed
  t0 = time.time()

  ccfg = classifier_config(config)
  init, train_step, eval_step, schedule = _config_programs(config)
  ckpt = checkpoint.Checkpointer(
    os.path.join(workdir, 'checkpoints'), max_to_keep=tr.max_checkpoints
  )
  state, data_state = _restore(ckpt, init(jax.random.key(seed)))
  wall_before = 0.0
  if data_state is not None:
    wall_before = float(data_state.get('wall_s', 0.0))
    print(f'resumed {workdir} at step {int(state.step)}', flush=True)
  start = int(state.step)

  val = _eval_split(config, 'validation', config.task.num_validation, seed)
  stream = itertools.islice(_train_stream(config, seed), start, None)
  writer = metrics.MetricsWriter(workdir)
  lengths = config.task.train_lengths
  progress = metrics.Progress(tr.num_steps, tr.batch_size * lengths[1])
  progress.start(start)
  print(
    f'{config.model.mixer} on {config.task.name} (seed {seed}): '
    f'{ccfg.d_model=} {ccfg.state_size=} {ccfg.num_layers=}, '
    f'{tr.num_steps} steps of {tr.batch_size}',
    flush=True,
  )

  def validate(state, step):
    res = evaluate(eval_step, state.params, val, config.eval.batch_size)
    writer.write(step, 'validation', res)
    if res['accuracy'] > float(state.best_val_acc):
      state = state.replace(
        best_params=jax.tree.map(jnp.copy, state.params),  # no aliasing
        best_val_acc=jnp.float32(res['accuracy']),
        best_step=jnp.int32(step),
      )
    return state, res

  stop = tr.num_steps
  if tr.halt_after_steps:
    stop = min(stop, start + tr.halt_after_steps)
  early_stop = float(tr.get('early_stop_accuracy', 0.0))
  early_step = -1
  if data_state is not None:  # A run that stopped early stays stopped.
    early_step = int(data_state.get('early_stop_step', -1))
    if early_step > 0:
      stop = start
  window, status = [], 'ok'
  for step in range(start + 1, stop + 1):
    state, m = train_step(state, next(stream))
    window.append(m)
    last = step == stop
    if step % tr.log_every == 0 or last:
      bad = int(state.bad_step)
      if bad >= 0:
        status = 'nan'
        print(
          f'non-finite loss or gradients at step {bad}; stopping (the state '
          'is the last finite one).',
          flush=True,
        )
        writer.write(step, 'train', {'bad_step': bad})
        break
      mean = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
      mean['lr'] = float(schedule(step))
      window = []
      rates = progress.report(step, mean)
      writer.write(step, 'train', {**mean, **rates})
    if step % tr.eval_every == 0 or step == tr.num_steps:
      state, res = validate(state, step)
      print(
        f'step {step}: validation acc {res["accuracy"]:.4f} '
        f'(best {float(state.best_val_acc):.4f} at {int(state.best_step)})',
        flush=True,
      )
      if 0 < early_stop <= res['accuracy'] and step < tr.num_steps:
        early_step, last = step, True
        print(
          f'early stop at step {step}: validation accuracy '
          f'{res["accuracy"]:.4f} >= train.early_stop_accuracy={early_stop}',
          flush=True,
        )
    if step % tr.checkpoint_every == 0 or last:
      wall = wall_before + time.time() - t0
      data = {'batches': step, 'wall_s': wall, 'early_stop_step': early_step}
      ckpt.save(step, state, data)
    if early_step > 0:
      break
  ckpt.close()

  done = int(state.step)
  summary = {
    'model': config.model.mixer,
    'task': config.task.name,
    'seed': seed,
    'status': status,
    'steps': done,
    'num_steps': tr.num_steps,
    'finished': status == 'ok' and (done >= tr.num_steps or early_step > 0),
    'early_stop_step': early_step,
    'bad_step': int(state.bad_step),
    'best_val_accuracy': float(state.best_val_acc),
    'best_step': int(state.best_step),
  }
  if summary['finished'] or status == 'nan':
    test = _eval_split(config, 'test', config.task.num_test, seed)
    bs = config.eval.batch_size
    final = evaluate(eval_step, state.params, test, bs, per_sequence=True)
    best = final
    if float(state.best_val_acc) >= 0:  # Else no validation ran: same params.
      best = evaluate(
        eval_step, _best_params(state), test, bs, per_sequence=True
      )
    summary.update(
      test_accuracy=best['accuracy'],
      test_loss=best['loss'],
      test_accuracy_final=final['accuracy'],
      test_lengths=list(config.task.eval_lengths),
      num_test=config.task.num_test,
      test_accuracy_by_length=accuracy_by_length(best['hit'], test['lengths']),
    )
    writer.write(done, 'test', {'accuracy': best['accuracy']})
    print(
      f'TEST accuracy {best["accuracy"]:.4f} (best-validation params; final '
      f'params {final["accuracy"]:.4f}) on {config.task.num_test} sequences '
      f'of length {config.task.eval_lengths}',
      flush=True,
    )
  writer.close()
  summary['wall_s'] = round(wall_before + time.time() - t0, 1)
  metrics.write_json(os.path.join(workdir, 'summary.json'), summary)
  return summary
