"""The one training loop: `fit(task, trainer_config, workdir)` for every task.

A `Task` says what is trained: its parameters, its loss, its batches, its
evaluation and its summary. The loop owns everything else, once for all
tasks: the train state, the optimizer, EMA, gradient accumulation, the mesh
and shardings, checkpoints with the data-iterator state, the non-finite
policy, SIGTERM / SIGINT, halt and early stop, progress lines, and the
records (metrics.jsonl, summary.json, config.json). Language modelling with
any process (`tasks.language_model`), state tracking
(`tasks.state_tracking`) and every planner/executor stage (`tasks.planner`)
run through it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.parallel import batch_sharding, make_mesh
from ddlm_jax.training import log_backends
from ddlm_jax.training import metrics as metrics_lib
from ddlm_jax.training.checkpoint import (
  Checkpointer,
  has_checkpoint,
  no_checkpoint,
)
from ddlm_jax.training.config import TrainerConfig
from ddlm_jax.training.optimizer import optimizer_from_config
from ddlm_jax.training.state import (
  TrainState,
  abstract_state,
  count_params,
  eval_params,
  init_state,
)
from ddlm_jax.training.steps import batch_size_weight, jit_step
from ddlm_jax.training.workdir_lock import WorkdirLock

# Cheap XLA compilation for smoke runs (TrainerConfig.fast_compile).
FAST_COMPILE = {
  'xla_backend_optimization_level': 0,
  'xla_llvm_disable_expensive_passes': True,
}

# Exit code of a run stopped by SIGTERM / SIGINT after saving (EX_TEMPFAIL):
# docs/LAUNCH.md's retry loop restarts on it.
PREEMPTED_EXIT_CODE = 75


class TrainingDivergedError(FloatingPointError):
  """Loss, gradients or parameters became NaN/Inf; nothing bad was saved.

  `summary` holds the run's summary (status 'nan'), also in summary.json.
  """

  def __init__(self, message: str, summary: dict | None = None):
    super().__init__(message)
    self.summary = summary or {}


def _keep(state, metrics, step):
  del metrics, step
  return state, False


@dataclasses.dataclass(frozen=True)
class Task:
  """What the loop trains; every callable is the task's, the rest is the
  loop's.

  Attributes:
    name: label of progress lines and messages.
    init: key -> parameter dict; traceable (runs under jit).
    loss: (params, key, batch) -> (scalar loss, metrics dict).
    batches: start step -> iterator of host (numpy) batch dicts. When the
      iterator has get_state/set_state (grain), its state is checkpointed
      and restored; otherwise `batches(start)` must itself resume there.
    evaluate: (params, step) -> metrics dict, or None for no evaluation.
    after_eval: (state, metrics, step) -> (state, stop): e.g. keep the best
      parameters in state.extra, or stop early.
    summary: FitResult -> dict merged into summary.json (final scores).
    init_extra: params -> the task's pytree in state.extra (or None).
    param_shardings: mesh -> shardings of the parameter dict (default:
      replicated).
    weight: batch -> its weight among accumulated micro-batches (its real
      tokens for language models; default: its number of sequences).
    check_batch: host-side check of each batch before it goes to device.
    tokens_per_step: for tokens/s (0: batch size x sequence length of the
      first batch's first array).
    shown: metric names for the progress line.
    log_window_mean: log the mean over the steps since the last log (else
      the logged step's own metrics).
    describe_eval: eval metrics -> the line printed after an evaluation.
    header: printed once before training.
    cache_key: hashable; tasks with equal keys share compiled steps in one
      process (seeds of a sweep, restarts in tests).
  """

  name: str
  init: Callable[[jax.Array], Any]
  loss: Callable[[Any, jax.Array, dict], tuple[jax.Array, dict]]
  batches: Callable[[int], Iterator[dict]]
  evaluate: Callable[[Any, int], dict] | None = None
  after_eval: Callable[[TrainState, dict, int], tuple[TrainState, bool]] = _keep
  summary: Callable[[FitResult], dict] = lambda result: {}
  init_extra: Callable[[Any], Any] | None = None
  param_shardings: Callable[[Any], Any] | None = None
  weight: Callable[[dict], jax.Array] = batch_size_weight
  check_batch: Callable[[dict], None] | None = None
  tokens_per_step: int = 0
  shown: tuple[str, ...] = ('loss',)
  log_window_mean: bool = False
  describe_eval: Callable[[dict], str] | None = None
  header: str = ''
  cache_key: Any = None


@dataclasses.dataclass
class FitResult:
  """What a task's summary sees: the trained state and how the run went."""

  state: TrainState
  config: TrainerConfig
  workdir: str
  start_step: int
  step: int
  status: str  # 'ok', 'nan' (non-finite) or 'preempted'.
  finished: bool
  early_stop_step: int
  bad_step: int
  train_seconds: float
  tokens_per_sec: float
  wall_seconds_total: float
  writer: metrics_lib.MetricsWriter
  num_params: int

  def eval_params(self):
    return eval_params(self.state, self.config.eval_uses_ema)


class _PreemptedError(Exception):
  """SIGTERM / SIGINT during the final evaluation and sampling."""


class _Interrupts:
  """SIGTERM and SIGINT become a flag the loop checks between steps.

  `abort=True` (the final evaluation and sampling, after the last
  checkpoint) raises _PreemptedError instead, so the phase stops at once and
  the run still exits with PREEMPTED_EXIT_CODE; a restart redoes it.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, abort: bool = False):
    self.requested = None
    self._abort = abort
    self._previous = {}

  def __enter__(self):
    for sig in self.SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # Not the main thread (notebooks): no handler.
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.requested = signal.Signals(signum).name
    if self._abort:
      raise _PreemptedError(self.requested)

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)


_COMPILED: dict = {}  # (task.cache_key, settings) -> jitted train step.


def _to_device(batch: dict, sharding) -> dict:
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in batch.items()
  }


def build_state(task: Task, cfg: TrainerConfig, mesh):
  """(state, shardings, tx, schedule) of a task, freshly initialised."""
  tx, schedule = optimizer_from_config(cfg.optimizer, cfg.num_steps)
  state, shardings = init_state(
    task.init,
    tx,
    seed=cfg.seed,
    mesh=mesh,
    use_ema=cfg.ema_decay > 0,
    param_shardings=(
      task.param_shardings(mesh) if task.param_shardings else None
    ),
    init_extra=task.init_extra,
  )
  return state, shardings, tx, schedule


def restore_latest(ckpt: Checkpointer, state, shardings):
  """ckpt's newest (state, data_state, step) restored into `state`'s
  shardings, or None.

  The fresh `state` fills what a changed hyperparameter (optimizer chain,
  EMA on or off) makes unrestorable; the checkpointer logs each change.
  Every restore of the suite goes through here (training, eval, sample).
  """
  return ckpt.restore_latest(
    abstract_state(state, shardings), initial_state=state
  )


def restore_newest(task: Task, cfg: TrainerConfig, workdir: str):
  """The newest checkpointed state of a task's run in workdir.

  For --mode=eval and back-filling tools; raises NoCheckpointError if the
  run has no checkpoint.
  """
  if not has_checkpoint(os.path.join(workdir, 'checkpoints')):
    raise no_checkpoint(workdir)  # Before anything is built.
  state, shardings, _, _ = build_state(task, cfg, make_mesh(cfg.mesh_shape))
  # A reader: it creates nothing and sets nothing aside (a live run may
  # hold the workdir).
  ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'), read_only=True)
  try:
    found = restore_latest(ckpt, state, shardings)
  finally:
    ckpt.close()
  if found is None:
    raise (
      ckpt.all_corrupt_error() if ckpt.unreadable else no_checkpoint(workdir)
    )
  return found[0]


def _step_fn(task, cfg, tx, shardings, mesh):
  options = FAST_COMPILE if cfg.fast_compile else None
  make = lambda: jit_step(
    task.loss,
    tx,
    cfg.ema_decay,
    shardings,
    mesh,
    accum_steps=cfg.grad_accum_steps,
    weight=task.weight,
    compiler_options=options,
  )
  if task.cache_key is None:
    return make()
  key = (task.cache_key, cfg.optimizer, cfg.num_steps, cfg.ema_decay)
  key += (cfg.grad_accum_steps, cfg.fast_compile, tuple(mesh.shape.items()))
  if key not in _COMPILED:
    if len(_COMPILED) > 16:
      _COMPILED.clear()
    _COMPILED[key] = make()
  return _COMPILED[key]


def _data_state(iterator, step, wall_total, early_step) -> dict:
  state = {'batches': step, 'wall_s': wall_total}
  state['early_stop_step'] = early_step
  if hasattr(iterator, 'get_state'):
    state['iterator'] = iterator.get_state()
  return state


def _diverged_message(task, bad, last_saved, directory) -> str:
  kept = (
    f'The last good checkpoint (step {last_saved}) is kept in {directory}.'
    if last_saved
    else 'No checkpoint was saved before it.'
  )
  return (
    f'{task.name}: non-finite loss, gradients or parameters at step {bad}. '
    f'Training stopped; the parameters were not updated from that step on '
    f'and nothing non-finite was saved. {kept} Lower the learning rate or '
    'check the data, then restart on the same workdir to resume.'
  )


def fit(
  task: Task,
  cfg: TrainerConfig,
  workdir: str,
  *,
  config_record: dict | None = None,
  mesh=None,
  restore: Callable | None = None,
  built: tuple | None = None,
  locked: bool = False,
  allow_fresh_start: bool = False,
) -> dict:
  """Trains `task` in `workdir` (resuming there); returns the summary.

  Args:
    config_record: written to workdir/config.json once the checkpoint is
      known to fit (nothing is written before that check).
    mesh: the device mesh (default: from cfg.mesh_shape).
    restore: (state, shardings) -> state, used when the workdir holds no
      checkpoint yet (warm start from another run).
    built: (state, shardings, tx, schedule) from build_state, when the
      caller has built them already (on `mesh`).
    locked: the caller holds the workdir's WorkdirLock already; else fit
      takes it (one writer per workdir) before anything is written.
    allow_fresh_start: train from step 0 although every checkpoint of the
      workdir is unreadable (set aside as <step>.corrupt); without it that
      raises AllCheckpointsCorruptError, so hours of compute never restart
      silently.
  """
  wall0 = time.perf_counter()
  # A log backend whose package is missing fails before anything is written.
  log_backends.check_backends((config_record or {}).get('log'))
  mesh = mesh if mesh is not None else make_mesh(cfg.mesh_shape)
  is_main = jax.process_index() == 0
  built = built or build_state(task, cfg, mesh)
  lock = WorkdirLock(workdir, enabled=is_main and not locked)
  with lock:
    ckpt = Checkpointer(
      os.path.join(workdir, 'checkpoints'), max_to_keep=cfg.max_checkpoints
    )
    try:
      return _fit(
        task,
        cfg,
        workdir,
        mesh,
        built,
        ckpt,
        wall0,
        config_record,
        restore,
        allow_fresh_start,
      )
    finally:
      ckpt.close()


def _fit(
  task,
  cfg,
  workdir,
  mesh,
  built,
  ckpt,
  wall0,
  config_record,
  restore,
  allow_fresh_start=False,
):
  """The body of fit, with the lock held and the checkpointer open."""
  state, shardings, tx, schedule = built
  is_main = jax.process_index() == 0
  found = restore_latest(ckpt, state, shardings)
  data_state = {}
  if found is None and ckpt.set_aside():
    if not allow_fresh_start:
      raise ckpt.all_corrupt_error()
    print(
      f'{task.name}: every checkpoint was unreadable (kept as '
      f'{", ".join(ckpt.set_aside())}); training from step 0 as asked.',
      flush=True,
    )
  if found is not None:
    state, data_state, start = found
    data_state = data_state or {}
    print(f'{task.name}: resumed from step {start} in {workdir}', flush=True)
  else:
    start = 0
    if restore is not None:
      state = restore(state, shardings)
  if config_record is not None and is_main:
    metrics_lib.write_json(os.path.join(workdir, 'config.json'), config_record)
  wall_before = float(data_state.get('wall_s', 0.0))
  early_step = int(data_state.get('early_stop_step', -1))
  iterator = task.batches(start)
  if hasattr(iterator, 'set_state') and found is not None:
    # Checkpoints written before the shared loop held the iterator state
    # itself, not under 'iterator'.
    it_state = data_state.get('iterator')
    if it_state is None and 'batches' not in data_state:
      it_state = data_state or None
    if it_state:
      iterator.set_state(it_state)
  writer = metrics_lib.MetricsWriter(
    workdir, enabled=is_main, config=config_record
  )
  if is_main:
    writer.drop_after(start)
  step_fn = _step_fn(task, cfg, tx, shardings, mesh)
  sharding = batch_sharding(mesh)
  num_params = count_params(state.params)
  stop_at = cfg.num_steps
  if cfg.halt_after_steps:
    stop_at = min(stop_at, start + cfg.halt_after_steps)
  if early_step > 0:  # A run that stopped early stays stopped.
    stop_at = start
  if task.header and start < stop_at:
    print(f'{task.header} | steps {start}->{cfg.num_steps}', flush=True)
  progress = None
  step, last_saved = start, (start if found is not None else 0)
  timed_from, train_seconds, tokens_per_step = start, 0.0, task.tokens_per_step
  status, bad = 'ok', -1
  window, window_len = None, 0

  def save(at, *, force=False):
    nonlocal last_saved
    wall = wall_before + time.perf_counter() - wall0
    ckpt.save(
      at, state, _data_state(iterator, at, wall, early_step), force=force
    )
    last_saved = at

  def check_finite() -> bool:
    nonlocal status, bad
    bad = int(state.bad_step)
    if bad >= 0:
      status = 'nan'
      writer.write(step, 'train', {'bad_step': bad})
      print(_diverged_message(task, bad, last_saved, ckpt.directory))
    return bad < 0

  with _Interrupts() as interrupts:
    t_mark = time.perf_counter()
    while step < stop_at:
      host_batch = next(iterator)
      if task.check_batch is not None:
        task.check_batch(host_batch)
      if progress is None:
        if not tokens_per_step:
          first = np.asarray(jax.tree.leaves(host_batch)[0])
          tokens_per_step = int(first.size) * jax.process_count()
        progress = metrics_lib.Progress(cfg.num_steps, tokens_per_step)
        progress.start(start)
      state, step_metrics = step_fn(state, _to_device(host_batch, sharding))
      if task.log_window_mean:  # Summed on device; no sync per step.
        window = (
          step_metrics
          if window is None
          else jax.tree.map(jnp.add, window, step_metrics)
        )
        window_len += 1
      step += 1
      if step == start + 1:  # Exclude compilation from the throughput.
        jax.block_until_ready(state)
        t_mark, timed_from = time.perf_counter(), step
        progress.compiled(step)  # ... and from the rate and ETA shown.
      last = step == stop_at
      is_log = step % cfg.log_every == 0 or last
      is_eval = task.evaluate is not None and (
        (cfg.eval_every and step % cfg.eval_every == 0)
        or (cfg.eval_at_end and step == cfg.num_steps)
      )
      is_ckpt = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
      interrupted = interrupts.requested is not None
      if (is_log or is_eval or is_ckpt or interrupted) and not check_finite():
        break
      if is_log:
        if task.log_window_mean:
          step_metrics = jax.tree.map(lambda v, n=window_len: v / n, window)
          window, window_len = None, 0
        shown = {k: step_metrics[k] for k in task.shown if k in step_metrics}
        rate = progress.report(step, shown, extra='')
        record = {k: float(v) for k, v in step_metrics.items()}
        record['learning_rate'] = float(schedule(step - 1))
        record.update(rate)
        writer.write(step, 'train', record)
      stop = False
      if is_eval:
        ev = task.evaluate(eval_params(state, cfg.eval_uses_ema), step)
        writer.write(step, 'validation', ev)
        if task.describe_eval is not None:
          print(f'  eval step {step}: {task.describe_eval(ev)}', flush=True)
        state, stop = task.after_eval(state, ev, step)
        if stop and step < cfg.num_steps:
          early_step = step
          print(f'{task.name}: early stop at step {step}', flush=True)
      if is_ckpt or interrupted or early_step > 0:
        save(step)
      if interrupted:
        print(
          f'{interrupts.requested}: saved checkpoint at step {step}; exiting.',
          flush=True,
        )
        ckpt.wait()
        writer.close()
        return {'preempted_at_step': step, 'status': 'preempted'}
      if early_step > 0:
        break
    train_seconds = time.perf_counter() - t_mark
    # The final save finishes even if a signal comes now (the flag is
    # read below and the final evaluation/sampling is skipped).
    if status == 'ok' and check_finite() and step != last_saved:
      save(step, force=True)
    ckpt.wait()
  late_signal = interrupts.requested
  wall_total = wall_before + time.perf_counter() - wall0
  result = FitResult(
    state=state,
    config=cfg,
    workdir=workdir,
    start_step=start,
    step=step,
    status=status,
    finished=status == 'ok' and (step >= cfg.num_steps or early_step > 0),
    early_stop_step=early_step,
    bad_step=bad,
    train_seconds=train_seconds,
    tokens_per_sec=(step - timed_from)
    * (tokens_per_step or 0)
    / max(train_seconds, 1e-9),
    wall_seconds_total=wall_total,
    writer=writer,
    num_params=num_params,
  )
  summary = {
    'status': status,
    'num_params': num_params,
    'start_step': start,
    'steps': step,
    'num_steps': cfg.num_steps,
    'finished': result.finished,
    'early_stop_step': early_step,
    'bad_step': bad,
    'train_seconds': train_seconds,
    'train_tokens_per_sec': result.tokens_per_sec,
  }
  try:
    with _Interrupts(abort=True):
      if late_signal is not None:
        raise _PreemptedError(late_signal)
      summary.update(task.summary(result))
  except _PreemptedError as stop:
    # The final evaluation/sampling was cut short; the final checkpoint is
    # saved, so a restart redoes only this phase.
    print(
      f'{stop.args[0]} during the final evaluation/sampling at step {step}: '
      'the checkpoint is saved; exiting (run again to finish).',
      flush=True,
    )
    summary.update(status='preempted', preempted_at_step=step)
  summary['wall_seconds'] = time.perf_counter() - wall0
  writer.close()
  if is_main:
    metrics_lib.write_json(os.path.join(workdir, 'summary.json'), summary)
  if status == 'nan':
    raise TrainingDivergedError(
      _diverged_message(task, bad, last_saved, ckpt.directory), summary
    )
  return summary
