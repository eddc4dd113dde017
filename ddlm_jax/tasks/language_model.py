"""The language-model task: a run built from a config or loaded from its
workdir, and its modes (train, eval, sample, zero-shot).

`Run(config, workdir, settings)` is the only place that turns an LM config
into objects: the process, the network, the data and the sampler
(validated here, before any compute). `settings` is the config's typed
blocks (`builders.typed_blocks`: process, data, the loop's
`TrainerConfig`), converted once by the entry point; `run.task()` is the
`fit.Task` of language modelling with the run's process. A Run allocates
no weights itself: training builds the train state in `fit`, and a reader
(eval, sample, `load_run`) restores the parameters alone, never the
optimizer moments. `load_run(workdir)` rebuilds a finished or interrupted
run from workdir/config.json and restores its newest checkpoint, so saved
runs can be scored (the AR twin as gen-ppl scorer), sampled or
warm-started from without their config file.

`train_and_evaluate` trains with periodic evaluation and checkpoints
(`fit.fit` on the run's task), then, once fit has returned, evaluates and
samples the final model (`fit.finish`).
Everything lands in the workdir: config.json, tokenizer/, checkpoints/,
metrics.jsonl, summary.json, samples.txt and curves.png. A run resumes from
its newest checkpoint (train state and data-iterator position) when started
again on the same workdir.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from ddlm_jax import paths
from ddlm_jax.data import zero_shot as zs_data
from ddlm_jax.evaluation import cost, zero_shot
from ddlm_jax.evaluation.likelihood import (
  config_estimator,
  evaluate_likelihood,
)
from ddlm_jax.evaluation.sample_run import (
  check_time_free,
  sample_and_score,
)
from ddlm_jax.evaluation.sample_run import write_samples as write_sample_files
from ddlm_jax.parallel import make_mesh
from ddlm_jax.sampling.registry import sampler_from_config
from ddlm_jax.training import (
  builders,
  fit,
  plots,
  progress,
  steps,
  warm_start,
)
from ddlm_jax.training.checkpoint import (
  Checkpointer,
  has_checkpoint,
  no_checkpoint,
)
from ddlm_jax.training.config import (
  RENAMED_KEYS,  # noqa: F401  (re-exported: run.RENAMED_KEYS)
  ConfigError,
  apply_overrides,
  check_range,
  check_renamed_keys,
  migrate_config,
)
from ddlm_jax.training.faults import CorruptFileError, read_json
from ddlm_jax.training.fit import TrainingDivergedError  # noqa: F401
from ddlm_jax.training.metrics import write_json
from ddlm_jax.training.state import (
  count_params,
  module_init,
  param_shardings,
  split_model,
)
from ddlm_jax.training.workdir_lock import WorkdirLock

# Stands in for the tokenizer's end-of-text id while a config is checked
# before its tokenizer exists; Run checks again with the real id.
_EOS_STAND_IN = 0


def tokenizer_eos_id(tokenizer) -> int | None:
  """The end-of-text id of a tokenizer (None: it has none, e.g. chars)."""
  special = getattr(tokenizer, 'special_ids', None)
  return None if special is None else special.eos


def check_sample_config(
  sample, process, time_conditioning: bool = False, *, eos_id=_EOS_STAND_IN
):
  """The sampler of a config's `sample` block, built and checked (or None).

  Runs before training, so a typo in a sampler spec, or a sampler that does
  not apply to the process's family, costs nothing. `process` may be a
  stand-in (builders.check_process) with the run's settings.
  `eos_id` is the tokenizer's end-of-text id, given to samplers that stop
  at EOS when the spec names none (a stand-in before the tokenizer exists).
  """
  causal = process.causal
  num = check_range(
    'sample.num_samples', sample.num_samples, lo=0, integer=True
  )
  check_range('sample.temperature', sample.temperature, lo=0, lo_open=True)
  check_range('sample.top_k', sample.top_k, lo=0, integer=True)
  check_range('sample.top_p', sample.top_p, lo=0, hi=1, lo_open=True)
  check_range('sample.steps', sample.steps, lo=1, integer=True)
  check_range(
    'sample.batch_size', sample.get('batch_size', 0), lo=0, integer=True
  )
  scorer = sample.get('scorer', '')
  if num and scorer and not paths.exists(paths.join(scorer, 'config.json')):
    raise ConfigError(
      f'sample.scorer={scorer!r} is not a run directory (no config.json): '
      "train the AR scorer run first, or pass --config.sample.scorer=''."
    )
  if causal:
    name = sample.get('sampler', 'ancestral') or 'ancestral'
    if name.split(':')[0].strip() not in ('ancestral', 'autoregressive'):
      raise ConfigError(
        f'sample.sampler={name!r}: an AR run samples left to right and '
        "takes no diffusion sampler; leave sample.sampler='ancestral'."
      )
    return None
  try:
    sampler = sampler_from_config(sample, eos_id=eos_id)
    sampler.check_applies(process)
    check_time_free(sampler, time_conditioning)
  except (ValueError, TypeError) as err:
    raise ConfigError(f'sample.sampler: {err}') from None
  light = sample.get('light_workdir', '')
  if num and getattr(sampler, 'num_models', 1) == 2:
    if not light:
      raise ConfigError(
        f'sample.sampler={sample.get("sampler")!r} runs a heavy and a light '
        'network: set --config.sample.light_workdir to the run directory '
        'of a trained light network.'
      )
    if not paths.exists(paths.join(light, 'config.json')):
      raise ConfigError(
        f'sample.light_workdir={light!r} is not a run directory (no '
        'config.json): train the light network first.'
      )
  return sampler if num else None


def check_prompt(prefix: str, tokenizer, seq_len: int, key='sample.prefix'):
  """The token ids of a text prompt, refused if the tokenizer cannot hold
  it or it leaves no position of data.seq_len to generate.

  A character the tokenizer does not know (a non-ASCII letter for a text8
  character vocabulary) would be replaced silently; it is named instead.
  """
  bad = []
  for ch in dict.fromkeys(prefix):
    try:
      ok = tokenizer.decode(tokenizer.encode(ch)) == ch
    except (ValueError, KeyError):
      ok = False
    if not ok:
      bad.append(f'{ch!r} (U+{ord(ch):04X})')
  if bad:
    raise ConfigError(
      f'{key}: the tokenizer cannot represent {", ".join(bad[:8])}'
      + (f' and {len(bad) - 8} more' if len(bad) > 8 else '')
      + '; remove or replace those characters.'
    )
  ids = np.asarray(tokenizer.encode(prefix), np.int32)
  if ids.size >= seq_len:
    raise ConfigError(
      f'{key} is {ids.size} tokens, which leaves none of the '
      f'data.seq_len={seq_len} positions to generate; shorten it.'
    )
  return ids


def _check_eval_config(ev):
  check_range('eval.batch_size', ev.batch_size, lo=1, integer=True)
  check_range('eval.num_batches', ev.num_batches, lo=0, integer=True)
  check_range(
    'eval.final_num_batches', ev.final_num_batches, lo=0, integer=True
  )
  check_range('eval.time_samples', ev.time_samples, lo=1, integer=True)
  check_range(
    'eval.final_time_samples', ev.final_time_samples, lo=1, integer=True
  )


class Run:
  """Everything built from a config that train, eval and sample share."""

  def __init__(
    self, config, workdir: str, settings: builders.RunSettings | None = None
  ):
    """settings: the typed blocks of `config` (builders.typed_blocks), as
    an entry point converted them; converted here when not given."""
    if settings is None:
      settings = builders.typed_blocks(config)
    self.config = config
    self.settings = settings
    self.workdir = workdir
    self.trainer_config = settings.trainer
    seq_len = settings.data.seq_len
    _check_eval_config(config.eval)
    soft_mask = config.get('soft_mask')
    self.init_from = config.train.get('init_from', '')
    self.mesh = make_mesh(self.trainer_config.mesh_shape)
    self._check_batch(config.train.batch_size, 'train.batch_size')
    self._check_batch(config.eval.batch_size, 'eval.batch_size')
    # Everything checkable without data is checked before anything is
    # written (the tokenizer is the first file a new run writes).
    builders.check_model_sizes(config.model)
    stand_in = builders.check_process(
      settings.process, config.model, seq_len, soft_mask
    )
    self.sampler = check_sample_config(
      config.sample, stand_in, config.model.get('time_conditioning', False)
    )
    self.estimator = config_estimator(config, stand_in)
    if self.init_from:
      load_config(self.init_from)  # Its config.json parses (or is named).
      warm_start.copy_tokenizer(self.init_from, workdir)
    self.data = builders.prepare_data(settings.data, workdir)
    self.process = builders.make_process(
      settings.process, self.data.tokenizer.vocab_size, soft_mask
    )
    self.eos_id = tokenizer_eos_id(self.data.tokenizer)
    if config.sample.get('prefix', '') and config.sample.num_samples:
      check_prompt(config.sample.prefix, self.data.tokenizer, seq_len)
    if self.sampler is not None:  # Again, with the tokenizer's own EOS id.
      self.sampler = check_sample_config(
        config.sample,
        self.process,
        config.model.get('time_conditioning', False),
        eos_id=self.eos_id,
      )
    self.model_config = builders.model_config(config.model, self.process)
    self.build = builders.model_builder(config.model, self.process, soft_mask)
    self.graphdef, self._abstract_params = split_model(self.build)
    self.num_params = count_params(self.abstract_params())
    # The restored parameters of a reader (restore): the raw ones, and the
    # EMA ones when evaluation uses them.
    self.params = None
    self.ema_params = None
    self._checkpointer = None

  @classmethod
  def build(cls, config, workdir: str) -> Run:
    """A fresh run from a config (nothing restored yet)."""
    return cls(config, workdir, builders.typed_blocks(config))

  @classmethod
  def load(cls, workdir: str, overrides: dict | None = None) -> Run:
    """The run saved in workdir, newest checkpoint restored (load_run)."""
    return load_run(workdir, overrides)

  # --------------------------------------------------------------- pieces

  @property
  def checkpointer(self) -> Checkpointer:
    if self._checkpointer is None:
      # A reader: training writes through fit's own Checkpointer, under
      # the workdir's lock; this one creates, moves and deletes nothing.
      self._checkpointer = Checkpointer(
        paths.join(self.workdir, 'checkpoints'),
        max_to_keep=self.trainer_config.max_checkpoints,
        read_only=True,
      )
    return self._checkpointer

  def close(self):
    if self._checkpointer is not None:
      self._checkpointer.close()
      self._checkpointer = None

  def _check_batch(self, batch: int, name: str):
    check_range(name, batch, lo=1, integer=True)
    data_ways = self.mesh.shape['data'] * self.mesh.shape['fsdp']
    if batch % data_ways:
      raise ConfigError(
        f'{name}={batch} is not divisible by the {data_ways} data-parallel '
        f'devices of mesh {dict(self.mesh.shape)}; change the batch size or '
        '--config.mesh.shape.'
      )

  def abstract_params(self, mesh=None):
    """ShapeDtypeStructs of the parameter dict (with their shardings on
    `mesh`, when given); nothing is allocated."""
    shapes = jax.eval_shape(module_init(self.build), jax.random.key(0))
    if mesh is None:
      return shapes
    return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      shapes,
      param_shardings(self._abstract_params, mesh),
    )

  def train_setup(self) -> fit.Built:
    """A fresh train state (parameters, optimizer moments, EMA) on the
    run's mesh, as `fit` builds it."""
    return fit.build_state(self.task(), self.trainer_config, self.mesh)

  def restore(self) -> int:
    """Restores the newest checkpoint's parameters (no optimizer state);
    returns its step (or 0 when there is none)."""
    cfg = self.trainer_config
    found = fit.restore_params(
      self.checkpointer,
      self.abstract_params(self.mesh),
      ema=cfg.ema_decay > 0 and cfg.eval_uses_ema,
    )
    if found is None:
      if self.checkpointer.unreadable:
        raise self.checkpointer.all_corrupt_error()
      return 0
    self.params, self.ema_params, step = found
    print(f'Resumed from checkpoint step {step} in {self.workdir}', flush=True)
    return step

  def eval_params(self):
    """The parameters evaluation and sampling use (EMA when asked for)."""
    if self.params is None:
      raise ValueError(
        'this Run holds no parameters yet: restore() its checkpoint (or '
        'use load_run) before evaluating or sampling.'
      )
    return self.params if self.ema_params is None else self.ema_params

  def forward_flops(self, batch: int, length: int) -> float:
    """Forward FLOPs of one network call, from the network that was built.

    The closed form for the transformer (it matches XLA's count within a
    few percent, tested); XLA's cost analysis for any other backbone.
    """
    if self.config.model.get('backbone', 'transformer') == 'transformer':
      return cost.transformer_flops(self.model_config, batch, length)
    model = steps.make_apply(self.graphdef, self.eval_params())
    return cost.xla_flops(lambda z, t: model(z, t), batch, length)

  # ------------------------------------------------------------ the task

  def _check_tokens(self, batch: dict):
    tokens = np.asarray(batch['tokens'])
    vocab = self.process.vocab_size
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
      bad = tokens.max() if tokens.max() >= vocab else tokens.min()
      raise ValueError(
        f'The data pipeline produced token id {int(bad)}, outside the '
        f'vocabulary [0, {vocab}). The tokenizer and the data disagree; '
        'rebuild the tokenizer (delete workdir/tokenizer) or fix the source.'
      )

  def task(self) -> fit.Task:
    """Language modelling with this run's process, as a loop task."""
    config = self.config
    abstract = self._abstract_params

    def evaluate(params, step):
      del step
      return self.evaluate_params(
        params,
        'validation',
        num_batches=config.eval.num_batches,
        time_samples=config.eval.time_samples,
      )

    return fit.Task(
      init=module_init(self.build),
      loss=steps.lm_loss(self.graphdef, self.process),
      weight=steps.lm_weight,
      batches=lambda start: builders.train_batches(
        config, self.data, config.seed
      ),
      evaluate=evaluate,
      param_shardings=lambda mesh: param_shardings(abstract, mesh),
      check_batch=self._check_tokens,
      uses_step=self.process.uses_step,
      # Runs of one network and process (a halted run and its resumption,
      # the seeds of a sweep) share one compiled train step.
      cache_key=('lm', self.graphdef, self.process),
    )

  def display(self) -> fit.Display:
    """The progress lines of this run."""
    return fit.Display(
      name=self.settings.process.kind,
      header=self.header(),
      shown=('loss', 'nelbo_per_token', 'sm_w_s', 'sm_lambda'),
      describe_eval=lambda ev: (
        f'validation {ev["bits_per_token"]:.4f} +- '
        f'{ev["bits_per_token_stderr"]:.4f} bits/token'
      ),
      tokens_per_step=self.config.train.batch_size * self.settings.data.seq_len,
    )

  def header(self) -> str:
    return (
      f'{self.settings.process.kind} | {self.num_params / 1e6:.2f}M params | '
      f'vocab {self.process.vocab_size} | mesh {dict(self.mesh.shape)}'
    )

  def final(self, result: fit.FitResult, writer) -> dict:
    """Final validation and samples once the run reached num_steps (run
    after fit returned, through fit.finish)."""
    summary = {'process': self.settings.process.kind}
    if result.status != 'ok' or result.step < self.config.train.num_steps:
      return summary
    self.params = result.params
    if self.trainer_config.eval_uses_ema:
      self.ema_params = result.state.ema_params
    final = self.evaluate(
      'validation',
      num_batches=self.config.eval.final_num_batches,
      time_samples=self.config.eval.final_time_samples,
    )
    writer.write(result.step, 'final_validation', final)
    summary['validation'] = final
    bound = (
      f', perplexity {"=" if self.process.causal else "<="} '
      f'{final["perplexity_bound"]:.3f}'
      if self.process.loss_is_bound
      else ' of the training loss (not a likelihood bound)'
    )
    print(
      f'final validation: {final["bits_per_token"]:.4f} +- '
      f'{final["bits_per_token_stderr"]:.4f} bits/token{bound}',
      flush=True,
    )
    if self.config.sample.num_samples:
      texts, stats = self.sample()
      self.write_samples(texts, stats)
      summary['samples'] = stats
    return summary

  def warm_start(self, state, shardings):
    """state with the parameters of the run in train.init_from."""
    if not self.init_from:
      return state
    src = load_run(self.init_from)
    step = src.checkpointer.latest_step()
    params = jax.device_get(src.params)
    src.close()
    print(f'Initialised from {self.init_from} (step {step}).', flush=True)
    return warm_start.with_params(state, shardings, params)

  # ------------------------------------------------------- eval / sample

  def evaluate_params(
    self, params, split, *, num_batches, time_samples, seed=0
  ):
    batches = self.data.eval_batches(
      split,
      seq_len=self.settings.data.seq_len,
      batch_size=self.config.eval.batch_size,
      max_batches=num_batches or None,
    )
    return evaluate_likelihood(
      params,
      self.graphdef,
      self.process,
      progress.batches(batches, f'evaluating {split}'),
      key=jax.random.key(seed),
      time_samples=time_samples,
      estimator=self.estimator,
    )

  def evaluate(self, split: str, *, num_batches, time_samples, seed=0):
    return self.evaluate_params(
      self.eval_params(),
      split,
      num_batches=num_batches,
      time_samples=time_samples,
      seed=seed,
    )

  def sample(self):
    """Draws config.sample.num_samples sequences; returns (texts, stats).

    config.sample picks the sampler (`sampler`: a name or a spec such as
    'eb:gamma=0.1', plus `params`), the AR `scorer` run for gen-ppl and
    MAUVE, and the `light_workdir` of model scheduling; those runs are
    loaded here. See ddlm_jax.evaluation.sample_run.sample_and_score.
    """
    cfg = self.config.sample
    light = cfg.get('light_workdir', '')
    scorer = cfg.get('scorer', '')
    return sample_and_score(
      self,
      scorer_run=load_run(scorer) if scorer else None,
      light_run=load_run(light) if light else None,
    )

  def write_samples(self, texts, stats):
    """The samples and their metrics JSON in new files of the workdir.

    samples.txt / sample_stats.json, then samples_2.txt, ... or
    samples_NAME.txt for config.sample.name (sample_run.write_samples).
    Process 0 writes; every process holds the same gathered samples.
    """
    if jax.process_index() != 0:
      return None
    name = self.config.sample.get('name', '')
    return write_sample_files(self.workdir, texts, stats, name)


def load_config(workdir: str, overrides: dict | None = None):
  """The run's ConfigDict from workdir/config.json, with dotted overrides.

  Keys renamed since the run was saved are moved first (migrate_config),
  so old runs load; overrides must use the new names.
  """
  path = paths.join(workdir, 'config.json')
  if not paths.exists(path):
    raise FileNotFoundError(
      f'{path} not found: {workdir} is not a run directory (train it with '
      'python -m experiments.run first).'
    )
  saved = read_json(path, 'the config of the run')
  if not isinstance(saved, dict):
    raise CorruptFileError(f'{path} does not hold a config (not an object).')
  config = ml_collections.ConfigDict(migrate_config(saved))
  check_renamed_keys(config, overrides)
  apply_overrides(config, overrides, create_blocks=True)
  if 'mesh' in config and 'shape' in config.mesh:
    config.mesh.shape = tuple(config.mesh.shape)
  return config


def load_run(workdir: str, overrides: dict | None = None) -> Run:
  """Run from workdir/config.json with its newest checkpoint restored.

  Args:
    overrides: {'sample.num_samples': 8, ...} applied to the saved config
      (shape-changing model keys make the restore fail with a clear error).

  Returns:
    The Run; its checkpoint step is run.checkpointer.latest_step().
  """
  config = load_config(workdir, overrides)
  run = Run(config, workdir, builders.typed_blocks(config))
  # Step 0 is a checkpoint too: an imported model's (interop.workdir).
  if run.restore() == 0 and run.checkpointer.latest_step() is None:
    run.close()
    raise no_checkpoint(workdir)
  return run


def chars_per_token(workdir: str, split: str = 'validation') -> float:
  """Characters per token of a run's split (1 for a character tokenizer):
  what turns its bits per token into bits per character, the unit in
  which runs with different tokenizers compare."""
  run = load_run(workdir)
  run.close()
  ids = np.asarray(run.data.splits[split])
  return len(run.data.tokenizer.decode(ids)) / max(ids.size, 1)


def restore_state(workdir: str, overrides: dict | None = None):
  """The newest checkpoint's whole train state (optimizer moments and EMA
  too), for tools that compare or inspect training; readers that score or
  sample use load_run, which restores the parameters alone."""
  config = load_config(workdir, overrides)
  run = Run(config, workdir, builders.typed_blocks(config))
  try:
    return fit.restore_newest(run.task(), run.trainer_config, workdir)
  finally:
    run.close()


# ----------------------------------------------------------------- modes


def train_and_evaluate(
  config,
  workdir: str,
  *,
  settings: builders.RunSettings | None = None,
  allow_fresh_start: bool = False,
) -> dict:
  """Trains, evaluates and samples; returns the summary dict.

  settings: the config's typed blocks (builders.typed_blocks; converted
  here when not given).
  The workdir's lock is taken first: a second run on the same workdir
  fails at once, naming the owner, before either writes anything.
  allow_fresh_start: train from step 0 although every checkpoint is
  unreadable (else AllCheckpointsCorruptError; see fit.fit).
  """
  with WorkdirLock(workdir):
    run = Run(config, workdir, settings)
    result = fit.fit(
      run.task(),
      run.trainer_config,
      workdir,
      display=run.display(),
      config_record=config.to_dict(),
      mesh=run.mesh,
      restore=run.warm_start if run.init_from else None,
      locked=True,
      allow_fresh_start=allow_fresh_start,
    )
    summary = fit.finish(result, run.final)
  if (
    jax.process_index() == 0
    and 'preempted_at_step' not in summary
    and paths.exists(paths.join(workdir, 'metrics.jsonl'))
  ):
    plots.plot_curves(workdir)
  return summary


def _restored(config, workdir: str, settings) -> tuple[Run, int]:
  """The run with its newest checkpoint, for a reader (eval, sample).

  An empty workdir is refused before the Run is built, which would write
  the tokenizer; the restore itself creates and moves nothing.
  """
  if not has_checkpoint(paths.join(workdir, 'checkpoints')):
    raise no_checkpoint(workdir)
  run = Run(config, workdir, settings)
  step = run.restore()
  if step == 0 and run.checkpointer.latest_step() is None:
    run.close()
    raise no_checkpoint(workdir)
  return run, step


def evaluate_checkpoint(
  config,
  workdir: str,
  split='validation',
  *,
  settings: builders.RunSettings | None = None,
) -> dict:
  """--mode=eval: restores the newest checkpoint and reports its NELBO."""
  run, step = _restored(config, workdir, settings)
  result = run.evaluate(
    split,
    num_batches=config.eval.final_num_batches,
    time_samples=config.eval.final_time_samples,
  )
  result['step'] = step
  write_json(paths.join(workdir, f'eval_{split}.json'), result)
  run.close()
  return result


def sample_checkpoint(
  config, workdir: str, *, settings: builders.RunSettings | None = None
) -> dict:
  """--mode=sample: restores the newest checkpoint, writes samples + metrics.

  The metrics JSON (workdir/sample_stats.json) has NFE, FLOPs, tokens/s,
  entropy and repetition, and gen-ppl/MAUVE when config.sample.scorer is set.
  """
  run, step = _restored(config, workdir, settings)
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
    write_json(paths.join(workdir, 'zero_shot.json'), results)
  return results
