"""Language-model runs through the one loop: train, eval and sample modes.

`train_and_evaluate` trains with periodic evaluation and checkpoints
(`fit.fit` on the run's task), then evaluates and samples the final model.
Everything lands in the workdir: config.json, tokenizer/, checkpoints/,
metrics.jsonl, summary.json, samples.txt and curves.png. A run resumes from
its newest checkpoint (train state and data-iterator position) when started
again on the same workdir.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from ddlm_jax import paths
from ddlm_jax.data import zero_shot as zs_data
from ddlm_jax.evaluation import zero_shot
from ddlm_jax.training import fit, plots
from ddlm_jax.training.checkpoint import has_checkpoint, no_checkpoint
from ddlm_jax.training.fit import TrainingDivergedError
from ddlm_jax.training.metrics import write_json
from ddlm_jax.training.run import Run, load_run
from ddlm_jax.training.workdir_lock import WorkdirLock


def train_and_evaluate(
  config, workdir: str, *, allow_fresh_start: bool = False
) -> dict:
  """Trains, evaluates and samples; returns the summary dict.

  The workdir's lock is taken first: a second run on the same workdir
  fails at once, naming the owner, before either writes anything.
  allow_fresh_start: train from step 0 although every checkpoint is
  unreadable (else AllCheckpointsCorruptError; see fit.fit).
  """
  with WorkdirLock(workdir):
    run = Run(config, workdir)
    task = dataclasses.replace(run.task(), header=run.header())
    summary = fit.fit(
      task,
      run.trainer_config,
      workdir,
      config_record=config.to_dict(),
      mesh=run.mesh,
      restore=run.warm_start if run.init_from else None,
      built=(run.state, run.shardings, run.tx, run.lr_schedule),
      locked=True,
      allow_fresh_start=allow_fresh_start,
    )
  if (
    jax.process_index() == 0
    and 'preempted_at_step' not in summary
    and paths.exists(paths.join(workdir, 'metrics.jsonl'))
  ):
    plots.plot_curves(workdir)
  return summary


def _restored(config, workdir: str) -> tuple[Run, int]:
  """The run with its newest checkpoint, for a reader (eval, sample).

  An empty workdir is refused before the Run is built, which would write
  the tokenizer; the restore itself creates and moves nothing.
  """
  if not has_checkpoint(os.path.join(workdir, 'checkpoints')):
    raise no_checkpoint(workdir)
  run = Run(config, workdir)
  step = run.restore()
  if step == 0 and run.checkpointer.latest_step() is None:
    run.close()
    raise no_checkpoint(workdir)
  return run, step


def evaluate_checkpoint(config, workdir: str, split='validation') -> dict:
  """--mode=eval: restores the newest checkpoint and reports its NELBO."""
  run, step = _restored(config, workdir)
  result = run.evaluate(
    split,
    num_batches=config.eval.final_num_batches,
    time_samples=config.eval.final_time_samples,
  )
  result['step'] = step
  write_json(os.path.join(workdir, f'eval_{split}.json'), result)
  run.close()
  return result


def sample_checkpoint(config, workdir: str) -> dict:
  """--mode=sample: restores the newest checkpoint, writes samples + metrics.

  The metrics JSON (workdir/sample_stats.json) has NFE, FLOPs, tokens/s,
  entropy and repetition, and gen-ppl/MAUVE when config.sample.scorer is set.
  """
  run, step = _restored(config, workdir)
  texts, stats = run.sample()
  stats['step'] = step
  run.write_samples(texts, stats)
  run.close()
  return {k: v for k, v in stats.items() if not isinstance(v, list)}


def evaluate_zero_shot(
  workdir: str,
  names=None,
  *,
  mesh_shape: tuple[int, ...] | None = None,
  **kwargs,
) -> dict[str, dict]:
  """Restores the run in `workdir` and scores it on each zero-shot set.

  Args:
    workdir: a run directory (config.json, tokenizer/, checkpoints/).
    names: zero-shot sets, e.g. ('ptb', 'wikitext2'); default: the suite.
    mesh_shape: override the saved config.mesh.shape (e.g. (1, 1, 1) to
      evaluate on one device).
    **kwargs: passed to ddlm_jax.evaluation.zero_shot.evaluate_dataset.

  Returns:
    {name: result}; also written to workdir/zero_shot.json (process 0).
  """
  names = zs_data.SUITE if names is None else names
  for name in names:
    zs_data.get_dataset(name)  # Unknown names fail before the restore.
  overrides = {} if mesh_shape is None else {'mesh.shape': tuple(mesh_shape)}
  run = load_run(workdir, overrides)
  step = run.checkpointer.latest_step()
  run.close()
  results = {}
  for name in names:
    results[name] = zero_shot.evaluate_dataset(run, name, **kwargs)
    results[name]['step'] = step
  if jax.process_index() == 0:
    write_json(os.path.join(workdir, 'zero_shot.json'), results)
  return results


__all__ = [
  'Run',
  'TrainingDivergedError',
  'evaluate_zero_shot',
  'evaluate_checkpoint',
  'sample_checkpoint',
  'train_and_evaluate',
]
