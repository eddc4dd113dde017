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
    init: key -> parameter dict; traceable (runs under jit).
    loss: (params, key, batch) -> (scalar loss, metrics dict).
    batches: start step -> iterator of host (numpy) batch dicts. When the
      iterator has get_state/set_state (grain), its state is checkpointed
      and restored; otherwise `batches(start)` must itself resume there.
    evaluate: (params, step) -> metrics dict, or None for no evaluation.
    after_eval: (state, metrics, step) -> (state, stop): e.g. keep the best
      parameters in state.extra, or stop early.
    init_extra: params -> the task's pytree in state.extra (or None).
    param_shardings: mesh -> shardings of the parameter dict (default:
      replicated).
    weight: batch -> its weight among accumulated micro-batches (its real
      tokens for language models; default: its number of sequences).
    check_batch: host-side check of each batch before it goes to device.
    uses_step: the loss reads the global step (batch['step'], one entry
      per sequence), as a process that declares `uses_step` does.
    cache_key: hashable; tasks with equal keys share compiled steps in one
      process (seeds of a sweep, restarts in tests).
  """

  init: Callable[[jax.Array], Any]
  loss: Callable[[Any, jax.Array, dict], tuple[jax.Array, dict]]
  batches: Callable[[int], Iterator[dict]]
  evaluate: Callable[[Any, int], dict] | None = None
  after_eval: Callable[[TrainState, dict, int], tuple[TrainState, bool]] = _keep
  init_extra: Callable[[Any], Any] | None = None
  param_shardings: Callable[[Any], Any] | None = None
  weight: Callable[[dict], jax.Array] = batch_size_weight
  check_batch: Callable[[dict], None] | None = None
  uses_step: bool = False
  cache_key: Any = None


@dataclasses.dataclass(frozen=True)
class Display:
  """How a run shows itself: its progress lines and their records.

  Attributes:
    name: label of progress lines and messages.
    header: printed once before training.
    shown: metric names for the progress line.
    describe_eval: eval metrics -> the line printed after an evaluation.
    log_window_mean: log the mean over the steps since the last log (else
      the logged step's own metrics).
    tokens_per_step: for tokens/s (0: batch size x sequence length of the
      first batch's first array).
  """

  name: str = 'fit'
  header: str = ''
  shown: tuple[str, ...] = ('loss',)
  describe_eval: Callable[[dict], str] | None = None
  log_window_mean: bool = False
  tokens_per_step: int = 0


@dataclasses.dataclass(frozen=True)
class Built:
  """A task's freshly initialised train state and its optimizer."""

  state: TrainState
  shardings: Any
  tx: Any  # optax.GradientTransformation
  schedule: Callable[[int], Any]


@dataclasses.dataclass(frozen=True)
class FitResult:
  """What `fit` returns: the trained state and how the run went.

  `summary` is what summary.json holds; a task's final phase (final
  evaluation, test scores, samples) adds to it through `finish`, which
  also closes `writer` (the run's metrics.jsonl and log backends, kept
  open so the final records join the same event files and W&B run).
  """

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
  num_params: int
  summary: dict
  writer: metrics_lib.MetricsWriter

  @property
  def params(self):
    return self.state.params

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


def build_state(task: Task, cfg: TrainerConfig, mesh) -> Built:
  """A task's train state, freshly initialised, with its optimizer."""
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
  return Built(state, shardings, tx, schedule)


def restore_latest(ckpt: Checkpointer, state, shardings):
  """ckpt's newest (state, data_state, step) restored into `state`'s
  shardings, or None.

  The fresh `state` fills what a changed hyperparameter (optimizer chain,
  EMA on or off) makes unrestorable; the checkpointer logs each change.
  Every restore of a train state goes through here.
  """
  return ckpt.restore_latest(
    abstract_state(state, shardings), initial_state=state
  )


def restore_params(ckpt: Checkpointer, abstract_params, *, ema: bool):
  """The newest checkpoint's parameters only: (params, ema_params, step),
  or None when no checkpoint is readable.

  For readers (evaluation, sampling): no optimizer moments are built or
  read. `abstract_params` holds ShapeDtypeStructs with their shardings;
  `ema` also restores the EMA parameters (a checkpoint without them gives
  a copy of the parameters), else ema_params is None.
  """
  target = {'params': abstract_params}
  if ema:
    target['ema_params'] = abstract_params
  found = ckpt.restore_latest(target)
  if found is None:
    return None
  restored, _, step = found
  return restored['params'], restored.get('ema_params'), step


def restore_newest(task: Task, cfg: TrainerConfig, workdir: str):
  """The newest checkpointed state of a task's run in workdir.

  For --mode=eval and back-filling tools; raises NoCheckpointError if the
  run has no checkpoint.
  """
  if not has_checkpoint(os.path.join(workdir, 'checkpoints')):
    raise no_checkpoint(workdir)  # Before anything is built.
  built = build_state(task, cfg, make_mesh(cfg.mesh_shape))
  # A reader: it creates nothing and sets nothing aside (a live run may
  # hold the workdir).
  ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'), read_only=True)
  try:
    found = restore_latest(ckpt, built.state, built.shardings)
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
    uses_step=task.uses_step,
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


def _diverged_message(name, bad, last_saved, directory) -> str:
  kept = (
    f'The last good checkpoint (step {last_saved}) is kept in {directory}.'
    if last_saved
    else 'No checkpoint was saved before it.'
  )
  return (
    f'{name}: non-finite loss, gradients or parameters at step {bad}. '
    f'Training stopped; the parameters were not updated from that step on '
    f'and nothing non-finite was saved. {kept} Lower the learning rate or '
    'check the data, then restart on the same workdir to resume.'
  )


def fit(
  task: Task,
  cfg: TrainerConfig,
  workdir: str,
  *,
  display: Display = Display(),
  config_record: dict | None = None,
  mesh=None,
  restore: Callable | None = None,
  built: Built | None = None,
  locked: bool = False,
  allow_fresh_start: bool = False,
  raise_on_nan: bool = True,
) -> FitResult:
  """Trains `task` in `workdir` (resuming there); returns how it went.

  summary.json is written before this returns; a task's final phase
  (final evaluation, samples) runs after it, through `finish`.

  Args:
    display: the run's name, header and progress-line settings.
    config_record: written to workdir/config.json once the checkpoint is
      known to fit (nothing is written before that check).
    mesh: the device mesh (default: from cfg.mesh_shape).
    restore: (state, shardings) -> state, used when the workdir holds no
      checkpoint yet (warm start from another run).
    built: from build_state, when the caller has built it already (on
      `mesh`).
    locked: the caller holds the workdir's WorkdirLock already; else fit
      takes it (one writer per workdir) before anything is written.
    allow_fresh_start: train from step 0 although every checkpoint of the
      workdir is unreadable (set aside as <step>.corrupt); without it that
      raises AllCheckpointsCorruptError, so hours of compute never restart
      silently.
    raise_on_nan: raise TrainingDivergedError when a step was not finite
      (else return the result with status 'nan', for a task that still
      scores the last finite parameters).
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
      loop = _Loop.setup(
        task,
        cfg,
        display,
        workdir,
        mesh,
        built,
        ckpt,
        wall0,
        config_record,
        restore,
        allow_fresh_start,
      )
      loop.train()
      result = loop.result()
    finally:
      ckpt.close()
  if result.status == 'nan' and raise_on_nan:
    result.writer.close()
    raise TrainingDivergedError(loop.diverged_message(), result.summary)
  return result


def _resume(ckpt, built, name, workdir, restore, allow_fresh_start):
  """(state, data_state, start step, resumed): the newest readable
  checkpoint, else the fresh state (warm-started by `restore`)."""
  found = restore_latest(ckpt, built.state, built.shardings)
  if found is None and ckpt.set_aside():
    if not allow_fresh_start:
      raise ckpt.all_corrupt_error()
    print(
      f'{name}: every checkpoint was unreadable (kept as '
      f'{", ".join(ckpt.set_aside())}); training from step 0 as asked.',
      flush=True,
    )
  if found is not None:
    state, data_state, start = found
    print(f'{name}: resumed from step {start} in {workdir}', flush=True)
    return state, data_state or {}, start, True
  state = built.state
  if restore is not None:
    state = restore(state, built.shardings)
  return state, {}, 0, False


def _batches_from(task, start: int, data_state: dict | None):
  """The task's batches from `start`; a resumed iterator with state (grain)
  gets the checkpointed one (`data_state` None: a fresh run)."""
  iterator = task.batches(start)
  if hasattr(iterator, 'set_state') and data_state is not None:
    # Checkpoints written before the shared loop held the iterator state
    # itself, not under 'iterator'.
    it_state = data_state.get('iterator')
    if it_state is None and 'batches' not in data_state:
      it_state = data_state or None
    if it_state:
      iterator.set_state(it_state)
  return iterator


@dataclasses.dataclass
class _Loop:
  """One call of `fit` with the lock held and the checkpointer open:
  `setup` (restore or initialise), `train` (the steps, each followed by
  its log / eval / checkpoint hooks), `result` (summary.json)."""

  task: Task
  cfg: TrainerConfig
  display: Display
  workdir: str
  ckpt: Checkpointer
  writer: metrics_lib.MetricsWriter
  state: TrainState
  schedule: Callable
  step_fn: Callable
  sharding: Any
  iterator: Any
  wall0: float
  wall_before: float
  start: int
  stop_at: int
  last_saved: int
  early_step: int
  num_params: int
  step: int = 0
  status: str = 'ok'
  bad: int = -1
  preempted_by: str | None = None  # The signal that stopped the run.
  late_signal: bool = False  # ... after its last step (during the save).
  train_seconds: float = 0.0
  timed_from: int = 0
  tokens_per_step: int = 0
  progress: Any = None
  window: Any = None
  window_len: int = 0

  # ------------------------------------------------------- setup / restore

  @classmethod
  def setup(
    cls,
    task,
    cfg,
    display,
    workdir,
    mesh,
    built,
    ckpt,
    wall0,
    config_record,
    restore,
    allow_fresh_start,
  ) -> _Loop:
    """Restores the newest checkpoint (or initialises, or warm-starts),
    writes config.json and positions the batches."""
    is_main = jax.process_index() == 0
    state, data_state, start, resumed = _resume(
      ckpt, built, display.name, workdir, restore, allow_fresh_start
    )
    if config_record is not None and is_main:
      metrics_lib.write_json(
        os.path.join(workdir, 'config.json'), config_record
      )
    early_step = int(data_state.get('early_stop_step', -1))
    iterator = _batches_from(task, start, data_state if resumed else None)
    writer = metrics_lib.MetricsWriter(
      workdir, enabled=is_main, config=config_record
    )
    if is_main:
      writer.drop_after(start)
    stop_at = cfg.num_steps
    if cfg.halt_after_steps:
      stop_at = min(stop_at, start + cfg.halt_after_steps)
    if early_step > 0:  # A run that stopped early stays stopped.
      stop_at = start
    if display.header and start < stop_at:
      print(f'{display.header} | steps {start}->{cfg.num_steps}', flush=True)
    return cls(
      task=task,
      cfg=cfg,
      display=display,
      workdir=workdir,
      ckpt=ckpt,
      writer=writer,
      state=state,
      schedule=built.schedule,
      step_fn=_step_fn(task, cfg, built.tx, built.shardings, mesh),
      sharding=batch_sharding(mesh),
      iterator=iterator,
      wall0=wall0,
      wall_before=float(data_state.get('wall_s', 0.0)),
      start=start,
      stop_at=stop_at,
      last_saved=start if resumed else 0,
      early_step=early_step,
      num_params=count_params(state.params),
      step=start,
      timed_from=start,
      tokens_per_step=display.tokens_per_step,
    )

  # ------------------------------------------------------------ the steps

  def train(self):
    """Steps until stop_at, an early stop, a non-finite step or a signal;
    then the final checkpoint."""
    with _Interrupts() as interrupts:
      t_mark = time.perf_counter()
      while self.step < self.stop_at:
        metrics = self._one_step()
        if self.step == self.start + 1:  # Compiled and run once: timed
          t_mark = time.perf_counter()  # from here on.
        if not self._after_step(metrics, interrupts.requested):
          break
      self.train_seconds = time.perf_counter() - t_mark
      # The final save finishes even if a signal comes now (the flag is
      # read below and the final evaluation/sampling is skipped).
      if self.preempted_by is None:
        if (
          self.status == 'ok'
          and self._check_finite()
          and self.step != self.last_saved
        ):
          self._save(self.step, force=True)
      self.ckpt.wait()
    if self.preempted_by is None and interrupts.requested is not None:
      self.preempted_by = interrupts.requested
      self.late_signal = True

  def _one_step(self) -> dict:
    """One optimiser step on the next batch; returns its metrics."""
    host_batch = next(self.iterator)
    if self.task.check_batch is not None:
      self.task.check_batch(host_batch)
    if self.progress is None:
      if not self.tokens_per_step:
        first = np.asarray(jax.tree.leaves(host_batch)[0])
        self.tokens_per_step = int(first.size) * jax.process_count()
      self.progress = metrics_lib.Progress(
        self.cfg.num_steps, self.tokens_per_step
      )
      self.progress.start(self.start)
    batch = _to_device(host_batch, self.sharding)
    self.state, metrics = self.step_fn(self.state, batch)
    if self.display.log_window_mean:  # Summed on device; no sync per step.
      self.window = (
        metrics
        if self.window is None
        else jax.tree.map(jnp.add, self.window, metrics)
      )
      self.window_len += 1
    self.step += 1
    if self.step == self.start + 1:  # Exclude compilation from throughput.
      jax.block_until_ready(self.state)
      self.timed_from = self.step
      self.progress.compiled(self.step)  # ... and from the rate and ETA.
    return metrics

  # -------------------------------------------- log / eval / checkpoint

  def _after_step(self, metrics: dict, signal_name: str | None) -> bool:
    """The hooks after a step: log, evaluate, checkpoint, stop on a
    signal. False ends the loop."""
    cfg, step = self.cfg, self.step
    is_log = step % cfg.log_every == 0 or step == self.stop_at
    is_eval = self.task.evaluate is not None and (
      (cfg.eval_every and step % cfg.eval_every == 0)
      or (cfg.eval_at_end and step == cfg.num_steps)
    )
    is_ckpt = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
    interrupted = signal_name is not None
    checks = is_log or is_eval or is_ckpt or interrupted
    if checks and not self._check_finite():
      return False
    if is_log:
      self._log(metrics)
    if is_eval:
      self._evaluate()
    if is_ckpt or interrupted or self.early_step > 0:
      self._save(step)
    if interrupted:
      print(
        f'{signal_name}: saved checkpoint at step {step}; exiting.',
        flush=True,
      )
      self.preempted_by = signal_name
      return False
    return self.early_step <= 0

  def _log(self, metrics: dict):
    if self.display.log_window_mean:
      n = self.window_len
      metrics = jax.tree.map(lambda v: v / n, self.window)
      self.window, self.window_len = None, 0
    shown = {k: metrics[k] for k in self.display.shown if k in metrics}
    rate = self.progress.report(self.step, shown, extra='')
    record = {k: float(v) for k, v in metrics.items()}
    record['learning_rate'] = float(self.schedule(self.step - 1))
    record.update(rate)
    self.writer.write(self.step, 'train', record)

  def _evaluate(self):
    step = self.step
    params = eval_params(self.state, self.cfg.eval_uses_ema)
    ev = self.task.evaluate(params, step)
    self.writer.write(step, 'validation', ev)
    if self.display.describe_eval is not None:
      print(f'  eval step {step}: {self.display.describe_eval(ev)}', flush=True)
    self.state, stop = self.task.after_eval(self.state, ev, step)
    if stop and step < self.cfg.num_steps:
      self.early_step = step
      print(f'{self.display.name}: early stop at step {step}', flush=True)

  def _save(self, at: int, *, force: bool = False):
    wall = self.wall_before + time.perf_counter() - self.wall0
    data = {'batches': at, 'wall_s': wall, 'early_stop_step': self.early_step}
    if hasattr(self.iterator, 'get_state'):
      data['iterator'] = self.iterator.get_state()
    self.ckpt.save(at, self.state, data, force=force)
    self.last_saved = at

  def _check_finite(self) -> bool:
    self.bad = int(self.state.bad_step)
    if self.bad >= 0:
      self.status = 'nan'
      self.writer.write(self.step, 'train', {'bad_step': self.bad})
      print(self.diverged_message())
    return self.bad < 0

  def diverged_message(self) -> str:
    return _diverged_message(
      self.display.name, self.bad, self.last_saved, self.ckpt.directory
    )

  # -------------------------------------------------------------- finish

  def result(self) -> FitResult:
    """The run's FitResult; summary.json written (unless a signal stopped
    it mid-run: the restart writes it)."""
    step = self.step
    if self.preempted_by is not None and not self.late_signal:
      summary = {'preempted_at_step': step, 'status': 'preempted'}
      return self._as_result('preempted', summary)
    finished = self.status == 'ok' and (
      step >= self.cfg.num_steps or self.early_step > 0
    )
    tokens_per_sec = (
      (step - self.timed_from)
      * (self.tokens_per_step or 0)
      / max(self.train_seconds, 1e-9)
    )
    summary = {
      'status': self.status,
      'num_params': self.num_params,
      'start_step': self.start,
      'steps': step,
      'num_steps': self.cfg.num_steps,
      'finished': finished,
      'early_stop_step': self.early_step,
      'bad_step': self.bad,
      'train_seconds': self.train_seconds,
      'train_tokens_per_sec': tokens_per_sec,
    }
    status = self.status
    if self.late_signal:
      # A signal during the last save: it is complete; the final phase is
      # left for the restart.
      _say_final_phase_cut(self.preempted_by, step)
      status = 'preempted'
      summary.update(status=status, preempted_at_step=step)
    summary['wall_seconds'] = time.perf_counter() - self.wall0
    if jax.process_index() == 0:
      metrics_lib.write_json(
        os.path.join(self.workdir, 'summary.json'), summary
      )
    return self._as_result(status, summary, finished, tokens_per_sec)

  def _as_result(self, status, summary, finished=False, tokens_per_sec=0.0):
    return FitResult(
      state=self.state,
      config=self.cfg,
      workdir=self.workdir,
      start_step=self.start,
      step=self.step,
      status=status,
      finished=finished,
      early_stop_step=self.early_step,
      bad_step=self.bad,
      train_seconds=self.train_seconds,
      tokens_per_sec=tokens_per_sec,
      wall_seconds_total=(self.wall_before + time.perf_counter() - self.wall0),
      num_params=self.num_params,
      summary=summary,
      writer=self.writer,
    )


def _say_final_phase_cut(signal_name: str, step: int):
  print(
    f'{signal_name} during the final evaluation/sampling at step {step}: '
    'the checkpoint is saved; exiting (run again to finish).',
    flush=True,
  )


def finish(
  result: FitResult,
  final: Callable[[FitResult, metrics_lib.MetricsWriter], dict],
) -> dict:
  """Runs a task's final phase after `fit` returned; returns the summary.

  `final(result, writer)` computes the final scores (final evaluation,
  test accuracy, samples), may write records through `writer` (the run's
  metrics.jsonl and log backends), and returns entries for summary.json,
  which is rewritten with them. It does not run when a signal stopped the
  run. A SIGTERM / SIGINT during it stops it at once: the summary then
  says 'preempted' (the final checkpoint is saved, so a restart redoes
  only this phase). The result's writer is closed here, so every task
  that calls `fit` calls `finish` once (`lambda result, writer: {}` for a
  task without a final phase).
  """
  writer = result.writer
  if result.status == 'preempted':
    writer.close()
    return result.summary
  t0 = time.perf_counter()
  summary = dict(result.summary)
  is_main = jax.process_index() == 0
  try:
    with _Interrupts(abort=True):
      summary.update(final(result, writer))
  except _PreemptedError as stop:
    _say_final_phase_cut(stop.args[0], result.step)
    summary.update(status='preempted', preempted_at_step=result.step)
  finally:
    writer.close()
  summary['wall_seconds'] = (
    result.summary.get('wall_seconds', 0.0) + time.perf_counter() - t0
  )
  if is_main:
    path = os.path.join(result.workdir, 'summary.json')
    metrics_lib.write_json(path, summary)
  return summary
