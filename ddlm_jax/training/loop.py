"""The training loop and the eval / sample entry points of a run.

`train_and_evaluate` trains with periodic evaluation and checkpoints, then
evaluates and samples the final model. Everything lands in the workdir:
config.json, tokenizer/, checkpoints/, metrics.jsonl, summary.json,
samples.txt and curves.png. A run resumes from its newest checkpoint
(train state and data-iterator position) when started again on the same
workdir.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import jax
import numpy as np

from ddlm_jax.evaluation.likelihood import evaluate_likelihood
from ddlm_jax.parallel import batch_sharding, make_mesh
from ddlm_jax.training import builders, plots, warm_start
from ddlm_jax.training.checkpoint import Checkpointer
from ddlm_jax.training.metrics import MetricsWriter, Progress, write_json
from ddlm_jax.training.optimizer import make_optimizer
from ddlm_jax.training.state import init_train_state
from ddlm_jax.training.steps import jit_train_step

log = logging.getLogger(__name__)


class TrainingDivergedError(FloatingPointError):
  """Loss or gradients became NaN/Inf; the last good checkpoint is kept."""


class _Preemption:
  """Turns SIGTERM into a flag the loop checks between steps."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # Not the main thread (e.g. notebooks): no handler.
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class Run:
  """Everything built from a config that train/eval/sample share."""

  def __init__(self, config, workdir: str):
    self.config = config
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    self.init_from = config.train.get('init_from', '')
    if self.init_from:
      warm_start.copy_tokenizer(self.init_from, workdir)
    self.mesh = make_mesh(tuple(config.mesh.shape))
    self.data = builders.prepare_data(config.data, workdir)
    soft_mask = config.get('soft_mask')
    self.process = builders.build_process(
      config.process, self.data.tokenizer.vocab_size, soft_mask
    )
    self._check_batch(config.data.batch_size, 'data.batch_size')
    total = config.train.num_steps
    self.tx, self.lr_schedule = make_optimizer(
      learning_rate=config.optim.learning_rate,
      warmup_steps=config.optim.warmup_steps,
      total_steps=total,
      weight_decay=config.optim.weight_decay,
      b1=config.optim.b1,
      b2=config.optim.b2,
      grad_clip=config.optim.grad_clip,
      final_lr_fraction=config.optim.final_lr_fraction,
      group_learning_rates=(
        {'soft_mask': soft_mask.learning_rate}
        if builders.soft_mask_enabled(soft_mask)
        else None
      ),
    )
    build = builders.model_builder(config.model, self.process, soft_mask)
    self.graphdef, self.state, self.shardings = init_train_state(
      build,
      self.tx,
      seed=config.seed,
      mesh=self.mesh,
      use_ema=config.optim.ema_decay > 0,
    )
    self.num_params = builders.count_params(self.state.params)
    self.checkpointer = Checkpointer(
      os.path.join(workdir, 'checkpoints'),
      max_to_keep=config.train.max_checkpoints,
    )

  def _check_batch(self, batch: int, name: str):
    data_ways = self.mesh.shape['data'] * self.mesh.shape['fsdp']
    if batch % data_ways:
      raise ValueError(
        f'{name}={batch} is not divisible by the {data_ways} data-parallel '
        f'devices of mesh {dict(self.mesh.shape)}; change the batch size or '
        '--config.mesh.shape.'
      )

  def abstract_state(self):
    return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      self.state,
      self.shardings,
    )

  def restore(self, iterator=None) -> int:
    """Restores the newest checkpoint if any; returns its step (or 0)."""
    found = self.checkpointer.restore_latest(self.abstract_state())
    if found is None:
      if self.init_from:
        self.state = warm_start.warm_start(
          self.state, self.shardings, self.init_from
        )
      return 0
    self.state, data_state, step = found
    if iterator is not None and data_state:
      iterator.set_state(data_state)
    print(f'Resumed from checkpoint step {step} in {self.workdir}', flush=True)
    return step

  def eval_params(self):
    use_ema = self.config.eval.use_ema and self.state.ema_params is not None
    return self.state.ema_params if use_ema else self.state.params

  def evaluate(self, split: str, *, num_batches, time_samples, seed=0):
    cfg = self.config
    batch = cfg.eval.batch_size
    self._check_batch(batch, 'eval.batch_size')
    batches = self.data.eval_batches(
      split,
      seq_len=cfg.data.seq_len,
      batch_size=batch,
      max_batches=num_batches or None,
    )
    return evaluate_likelihood(
      self.eval_params(),
      self.graphdef,
      self.process,
      batches,
      key=jax.random.key(seed),
      time_samples=time_samples,
    )

  def sample(self):
    """Draws config.sample.num_samples sequences; returns (texts, stats).

    config.sample picks the sampler (`sampler`: a name or a spec such as
    'eb:gamma=0.1', plus `params`), the AR `scorer` run for gen-ppl and
    MAUVE, and the `light_workdir` of model scheduling. stats holds NFE,
    FLOPs, wall-clock rates, entropy and repetition (and the scores); see
    ddlm_jax.evaluation.sample_run.sample_and_score.
    """
    from ddlm_jax.evaluation.sample_run import sample_and_score

    return sample_and_score(self)

  def write_samples(self, texts, stats):
    """samples.txt and the metrics JSON sample_stats.json in the workdir."""
    with open(os.path.join(self.workdir, 'samples.txt'), 'w') as f:
      for i, text in enumerate(texts):
        f.write(f'=== sample {i} ===\n{text}\n\n')
    write_json(os.path.join(self.workdir, 'sample_stats.json'), stats)


def _to_device(batch_np: dict, sharding, vocab_size: int) -> dict:
  tokens = np.asarray(batch_np['tokens'])
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    bad = tokens.max() if tokens.max() >= vocab_size else tokens.min()
    raise ValueError(
      f'The data pipeline produced token id {int(bad)}, outside the '
      f'vocabulary [0, {vocab_size}). The tokenizer and the data disagree; '
      'rebuild the tokenizer (delete workdir/tokenizer) or fix the source.'
    )
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in batch_np.items()
  }


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains, evaluates and samples; returns the summary dict."""
  wall0 = time.perf_counter()
  run = Run(config, workdir)
  write_json(os.path.join(workdir, 'config.json'), config.to_dict())
  cfg = config.train
  iterator = builders.train_batches(config.data, run.data, config.seed)
  start = run.restore(iterator)
  writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
  step_fn = jit_train_step(
    run.graphdef,
    run.process,
    run.tx,
    config.optim.ema_decay,
    run.shardings,
    run.mesh,
    accum_steps=config.optim.grad_accum_steps,
  )
  sharding = batch_sharding(run.mesh)
  tokens_per_step = config.data.batch_size * config.data.seq_len
  progress = Progress(cfg.num_steps, tokens_per_step)
  print(
    f'{config.process.kind} | {run.num_params / 1e6:.2f}M params | '
    f'vocab {run.process.vocab_size} | mesh {dict(run.mesh.shape)} | '
    f'steps {start}->{cfg.num_steps}',
    flush=True,
  )
  stop_at = cfg.num_steps
  if cfg.halt_after_steps:
    stop_at = min(stop_at, start + cfg.halt_after_steps)
  step, train_seconds, last_good, timed_from = start, 0.0, start, start
  with _Preemption() as preempt:
    progress.start(step)
    t_mark = time.perf_counter()
    while step < stop_at:
      batch = _to_device(next(iterator), sharding, run.process.vocab_size)
      run.state, metrics = step_fn(run.state, batch)
      step += 1
      if step == start + 1:  # Exclude compilation from the throughput.
        jax.block_until_ready(run.state)
        t_mark, timed_from = time.perf_counter(), step
      is_log = step % cfg.log_every == 0 or step == stop_at
      is_eval = cfg.eval_every and step % cfg.eval_every == 0
      is_ckpt = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
      if is_log or is_eval or is_ckpt or preempt.requested:
        _check_finite(run, last_good)
      if is_log:
        shown = {
          'loss': metrics['loss'],
          'nelbo/tok': metrics['nelbo_per_token'],
        }
        if 'sm_w_s' in metrics:  # Soft-masking: its scalar and mean lambda.
          shown.update(w_s=metrics['sm_w_s'], lam=metrics['sm_lambda'])
        rate = progress.report(step, shown)
        record = {k: float(v) for k, v in metrics.items()}
        record['learning_rate'] = float(run.lr_schedule(step - 1))
        record.update(rate)
        writer.write(step, 'train', record)
      if is_eval:
        ev = run.evaluate(
          'validation',
          num_batches=config.eval.num_batches,
          time_samples=config.eval.time_samples,
        )
        writer.write(step, 'validation', ev)
        print(
          f'  eval step {step}: validation {ev["bits_per_token"]:.4f} '
          f'+- {ev["bits_per_token_stderr"]:.4f} bits/token',
          flush=True,
        )
      if is_ckpt or preempt.requested:
        run.checkpointer.save(step, run.state, iterator.get_state())
        last_good = step
      if preempt.requested:
        print(f'SIGTERM: saved checkpoint at step {step}; exiting.', flush=True)
        run.checkpointer.close()
        return {'preempted_at_step': step}
    train_seconds = time.perf_counter() - t_mark
  _check_finite(run, last_good)
  if step != last_good:
    run.checkpointer.save(step, run.state, iterator.get_state(), force=True)
  run.checkpointer.wait()
  summary = {
    'process': config.process.kind,
    'num_params': run.num_params,
    'start_step': start,
    'steps': step,
    'train_seconds': train_seconds,
    'train_tokens_per_sec': (step - timed_from)
    * tokens_per_step
    / max(train_seconds, 1e-9),
  }
  if step >= cfg.num_steps:
    final = run.evaluate(
      'validation',
      num_batches=config.eval.final_num_batches,
      time_samples=config.eval.final_time_samples,
    )
    writer.write(step, 'final_validation', final)
    summary['validation'] = final
    print(
      f'final validation: {final["bits_per_token"]:.4f} +- '
      f'{final["bits_per_token_stderr"]:.4f} bits/token, perplexity '
      f'{"=" if run.process.causal else "<="} '
      f'{final["perplexity_bound"]:.3f}',
      flush=True,
    )
    if config.sample.num_samples:
      texts, stats = run.sample()
      run.write_samples(texts, stats)
      summary['samples'] = stats
  summary['wall_seconds'] = time.perf_counter() - wall0
  writer.close()
  run.checkpointer.close()
  if jax.process_index() == 0:
    write_json(os.path.join(workdir, 'summary.json'), summary)
    plots.plot_curves(workdir)
  return summary


def _check_finite(run: Run, last_good: int):
  bad = int(run.state.bad_step)
  if bad >= 0:
    run.checkpointer.wait()
    raise TrainingDivergedError(
      f'Non-finite loss or gradients at step {bad}. Training stopped; the '
      f'parameters were not updated from that step on. The last good '
      f'checkpoint (step {last_good}) is kept in '
      f'{run.checkpointer.directory}. Lower --config.optim.learning_rate or '
      'check the data, then restart on the same workdir to resume.'
    )


def evaluate_checkpoint(config, workdir: str, split='validation') -> dict:
  """--mode=eval: restores the newest checkpoint and reports its NELBO."""
  run = Run(config, workdir)
  step = run.restore()
  if step == 0:
    raise FileNotFoundError(
      f'No checkpoint in {workdir}/checkpoints; train first (--mode=train).'
    )
  result = run.evaluate(
    split,
    num_batches=config.eval.final_num_batches,
    time_samples=config.eval.final_time_samples,
  )
  result['step'] = step
  write_json(os.path.join(workdir, f'eval_{split}.json'), result)
  run.checkpointer.close()
  return result


def sample_checkpoint(config, workdir: str) -> dict:
  """--mode=sample: restores the newest checkpoint, writes samples + metrics.

  The metrics JSON (workdir/sample_stats.json) has NFE, FLOPs, tokens/s,
  entropy and repetition, and gen-ppl/MAUVE when config.sample.scorer is set.
  """
  run = Run(config, workdir)
  step = run.restore()
  if step == 0:
    raise FileNotFoundError(
      f'No checkpoint in {workdir}/checkpoints; train first (--mode=train).'
    )
  texts, stats = run.sample()
  stats['step'] = step
  run.write_samples(texts, stats)
  run.checkpointer.close()
  return {k: v for k, v in stats.items() if not isinstance(v, list)}


__all__ = [
  'TrainingDivergedError',
  'evaluate_checkpoint',
  'sample_checkpoint',
  'train_and_evaluate',
]
