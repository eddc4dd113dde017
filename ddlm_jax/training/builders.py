"""Builds the process, model and data of a run from its ConfigDict.

`typed_blocks(config)` is the one place a language-model run's ConfigDict
becomes typed blocks (`RunSettings`: the process family's config, the data
settings and the loop's `TrainerConfig`). It lives in the library, not in
experiments/, because the library has entry points of its own that start
from a workdir's config.json rather than from the command line
(`tasks.language_model.load_run`, `ddlm_jax.load`, `--mode=plan`'s
`tasks.plans.spec_from_config`), and experiments/ sits above the library:
a converter there could not serve them without an import from the library
into experiments/. Each entry point calls it once and hands the frozen
result down; code below the entry points reads `settings.process` /
`settings.data` and never a raw `config.process` / `config.data` block
(tests/test_settings_seam.py guards that). The model, sample, train and
eval blocks are still read as ConfigDicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np

from ddlm_jax import paths
from ddlm_jax.data import source_registry, sources, tokenizers
from ddlm_jax.data.settings import DataConfig
from ddlm_jax.diffusion import base as process_base
from ddlm_jax.diffusion.base import (
  Backbone,
  BlockProcess,
  Process,
  ProcessConfig,
)
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.soft_masking import SoftMaskedDiffusion
from ddlm_jax.models import Transformer, TransformerConfig, hybrid
from ddlm_jax.models.attention import check_attention_impl
from ddlm_jax.models.backbones import get_backbone, register_backbone
from ddlm_jax.models.soft_masking import SoftMaskedModel, SoftMaskInput
from ddlm_jax.training.config import (
  ConfigError,
  OptimizerConfig,
  TrainerConfig,
  check_range,
  check_renamed_keys,
  optimizer_config,
  trainer_config,
  warmup_steps,
)


def soft_mask_enabled(soft_mask) -> bool:
  """Whether a config.soft_mask block (or None) switches soft-masking on."""
  return bool(soft_mask is not None and soft_mask.get('enabled', False))


def process_settings(block) -> ProcessConfig:
  """The typed family config of a run's config.process block.

  The kind names the registered family config class
  (`ddlm_jax.diffusion.base.ProcessConfig.register`); a key that class
  does not take is refused naming the closest one.
  """
  mapping = block.to_dict() if hasattr(block, 'to_dict') else dict(block)
  try:
    return process_base.process_config(mapping)
  except ValueError as err:
    raise ConfigError(str(err)) from None


def lm_trainer_config(config) -> TrainerConfig:
  """The loop settings of a language-model config (checked ranges)."""
  tr, o = config.train, config.optim
  soft_mask = config.get('soft_mask')
  groups = ()
  if soft_mask_enabled(soft_mask):
    groups = (('soft_mask', soft_mask.learning_rate),)
  return trainer_config(
    num_steps=tr.num_steps,
    seed=config.seed,
    log_every=tr.log_every,
    eval_every=tr.eval_every,
    checkpoint_every=tr.checkpoint_every,
    max_checkpoints=tr.max_checkpoints,
    halt_after_steps=tr.halt_after_steps,
    ema_decay=o.ema_decay,
    eval_uses_ema=bool(config.eval.use_ema),
    grad_accum_steps=o.grad_accum_steps,
    mesh_shape=tuple(config.mesh.shape),
    optimizer=optimizer_config(
      learning_rate=o.learning_rate,
      warmup_steps=warmup_steps(o, tr.num_steps),
      total_steps=tr.num_steps,
      weight_decay=o.weight_decay,
      b1=o.b1,
      b2=o.b2,
      grad_clip=o.grad_clip,
      final_lr_fraction=o.final_lr_fraction,
      group_learning_rates=groups,
    ),
  )


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """The typed blocks of a language-model run, converted once.

  process: the registered family config of config.process.
  data: the data settings of config.data.
  trainer: the loop's settings (config.train, config.optim, the EMA of
    config.eval, config.mesh and config.seed).
  """

  process: ProcessConfig
  data: DataConfig
  trainer: TrainerConfig

  @property
  def optimizer(self) -> OptimizerConfig:
    """The optimizer settings (config.optim), as the trainer holds them."""
    return self.trainer.optimizer


def typed_blocks(config) -> RunSettings:
  """The typed blocks of a language-model ConfigDict (checked, no data).

  Called once by each entry point (experiments.modes.run, load_run,
  ddlm_jax.load, --mode=plan). A key renamed since a run was saved, a
  misspelt or foreign key (named with the closest one) or a value out of
  range is refused here, before anything is built or written.
  """
  check_renamed_keys(config)  # A config file older than a key's rename.
  trainer = lm_trainer_config(config)
  data = data_settings(config.data)
  check_range('data.seq_len', data.seq_len, lo=1, integer=True)
  return RunSettings(
    process=process_settings(config.process), data=data, trainer=trainer
  )


def backbone_of(model) -> Backbone:
  """What a family config checks of config.model."""
  return Backbone(
    name=model.get('backbone', 'transformer'),
    time_conditioning=bool(model.get('time_conditioning', False)),
    attention_impl=model.get('attention_impl', 'xla'),
  )


def check_process(settings: ProcessConfig, model, seq_len: int, soft_mask=None):
  """The process settings that need no data, checked before any is read.

  The family's own checks (`settings.check`: the network and the length
  it needs), the attention backend against the masks the family uses, and
  soft-masking against the family. Returns the process built on a
  stand-in vocabulary of 2: its constructor checks every range, and the
  sampler checks run on it before the real vocabulary is known.
  """
  if soft_mask_enabled(soft_mask) and not settings.supports_soft_mask:
    raise ConfigError(
      f'config.soft_mask.enabled needs a masked-diffusion process; '
      f'process.kind={settings.kind!r} is {settings.family}. Use '
      "process.kind='mdlm' or 'md4', or set soft_mask.enabled=False."
    )
  try:
    settings.check(backbone_of(model), seq_len)
    process = make_process(settings, 2, soft_mask)
  except (ValueError, TypeError) as err:
    raise ConfigError(f'config.process: {err}') from None
  # The attention backend must express the process's mask (cuDNN has no
  # block-diffusion mask): refused here, before the tokenizer is built.
  try:
    check_attention_impl(
      model.get('attention_impl', 'xla'), settings.attention_masks
    )
  except ValueError as err:
    raise ConfigError(f'config.model.attention_impl: {err}') from None
  return process


def make_process(settings: ProcessConfig, vocab_size: int, soft_mask=None):
  """The run's process: the family's build, soft-masked when switched on."""
  process = settings.build(vocab_size)
  if soft_mask_enabled(soft_mask):
    if not isinstance(process, MaskedDiffusion):
      raise ValueError(
        'config.soft_mask.enabled needs a masked-diffusion process; '
        f'process.kind={settings.kind!r} builds {type(process).__name__}.'
      )
    process = SoftMaskedDiffusion.from_masked(process, soft_mask.sm_prob)
  return process


def check_model_sizes(model: Mapping) -> None:
  """Sizes of config.model in range (checked before any data is read)."""
  for key, lo in (('width', 1), ('depth', 1), ('num_heads', 1), ('mlp_dim', 0)):
    if key in model:
      check_range(f'model.{key}', model[key], lo=lo, integer=True)
  width, heads = model.get('width', 2), model.get('num_heads', 1)
  if width % heads or (width // heads) % 2:
    raise ConfigError(
      f'model.width={width} is not divisible by model.num_heads={heads} '
      'into an even head size (rotary embeddings rotate pairs); change '
      'one of them.'
    )


def transformer_config(model: Mapping, process: Process) -> TransformerConfig:
  """The TransformerConfig of a config.model dict (transformer or hybrid).

  The vocabulary, input vocabulary, causality and block size come from
  the process; the hybrid's own keys are set aside (hybrid.hybrid_config).
  """
  model_keys, _ = hybrid.split_model_keys(dict(model))
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  kwargs = {k: v for k, v in model_keys.items() if k in fields}
  unknown = set(model_keys) - fields
  if unknown:
    raise ValueError(
      f'config.model has keys the transformer does not take: '
      f'{sorted(unknown)}; it takes {sorted(fields)}.'
    )
  check_model_sizes(kwargs)
  kwargs.update(
    vocab_size=process.output_size,
    input_vocab_size=process.input_vocab_size,
    causal=process.causal,
  )
  if isinstance(process, BlockProcess):
    kwargs['block_size'] = process.block_size
  return TransformerConfig(**kwargs)


register_backbone(
  'transformer',
  transformer_config,
  lambda mcfg, model, rngs: Transformer(mcfg, rngs=rngs),
)


def hybrid_base_config(model: Mapping, process: Process) -> TransformerConfig:
  """The hybrid's TransformerConfig, its pattern and SSM keys checked."""
  mcfg = transformer_config(model, process)
  hybrid.hybrid_config(mcfg, dict(model))  # Refuses a bad pattern now.
  return mcfg


register_backbone(
  'hybrid',
  hybrid_base_config,
  lambda mcfg, model, rngs: hybrid.HybridTransformer(
    hybrid.hybrid_config(mcfg, dict(model)), rngs=rngs
  ),
)


def _backbone(cfg):
  """The registered backbone config.model names (a ConfigError if none)."""
  try:
    return get_backbone(cfg.get('backbone', 'transformer'))
  except ValueError as err:
    raise ConfigError(str(err)) from None


def model_config(cfg, process: Process):
  """The network config of config.model: its registered backbone's."""
  return _backbone(cfg).config(cfg.to_dict(), process)


def model_builder(cfg, process, soft_mask=None):
  """build(rngs) -> the network, as init_train_state expects.

  The registered backbone of config.model.backbone (`ddlm_jax.models.
  backbones`); with config.soft_mask.enabled it is wrapped in the
  soft-masking input layer (its parameters: net/..., soft_mask/r_s, r_a,
  r_b).
  """
  spec = _backbone(cfg)
  mcfg = spec.config(cfg.to_dict(), process)
  model = cfg.to_dict()
  build = lambda rngs: spec.build(mcfg, model, rngs)
  if not soft_mask_enabled(soft_mask):
    return build
  sm = dict(
    k=soft_mask.k,
    w_s=soft_mask.w_s_init,
    w_a=soft_mask.w_a_init,
    w_b=soft_mask.w_b_init,
  )
  SoftMaskInput(**sm)  # Checks the settings before any tracing.
  return lambda rngs: SoftMaskedModel(
    build(rngs), process.mask_id, SoftMaskInput(**sm)
  )


def data_settings(block) -> DataConfig:
  """The typed data settings of a run's config.data block.

  A key the block does not take is refused naming the closest one; keys a
  run saved before they existed take their defaults (old workdirs load).
  """
  mapping = block.to_dict() if hasattr(block, 'to_dict') else dict(block)
  try:
    return DataConfig.from_dict(mapping)
  except (ValueError, TypeError) as err:
    raise ConfigError(str(err)) from None


@dataclasses.dataclass
class Data:
  """A run's tokenizer, its corpus's ``Source`` and that source's splits.

  Every corpus, text or dataset, is a ``ddlm_jax.data.sources.Source``
  (``ddlm_jax.data.source_registry``): ``source`` serves the batches and
  ``splits`` is a lazy view of it (membership reads nothing; indexing
  materialises a packed split's token stream).
  """

  tokenizer: tokenizers.Tokenizer
  source: sources.Source
  settings: DataConfig = DataConfig()

  @property
  def splits(self) -> Mapping[str, np.ndarray]:
    """Token ids per split, read on first use."""
    return sources.SplitTokens(self.source)

  def eval_batches(
    self,
    split: str,
    *,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
  ) -> list[dict[str, np.ndarray]]:
    """Deterministic eval batches: dicts with 'tokens' int32 [B, L] and,
    for padded sources, 'loss_mask' float32 [B, L]."""
    if split not in self.splits:
      raise ValueError(
        f'split {split!r} is not in the corpus; have {list(self.splits)}.'
      )
    return self.source.eval_batches(
      split, seq_len=seq_len, batch_size=batch_size, max_batches=max_batches
    )


def prepare_data(cfg: DataConfig, workdir: str | None) -> Data:
  """The corpus's source, with the tokenizer fitted, loaded or reloaded.

  `cfg` is the typed data settings (`RunSettings.data`).

  A tokenizer saved in workdir/tokenizer (from an earlier start of the same
  run) is reused, so a resumed run keeps its vocabulary. Dataset sources
  ('text8', 'lm1b', 'openwebtext') read their data lazily, on first use of
  a split, so a run whose tokenizer is saved can be restored for evaluation
  without its training data.
  """
  if not isinstance(cfg, DataConfig):
    raise TypeError(
      f'prepare_data takes a DataConfig, not {type(cfg).__name__}; convert '
      'the config with builders.typed_blocks(config).data.'
    )
  tok_dir = paths.join(workdir, 'tokenizer') if workdir else None
  has_saved = bool(tok_dir) and paths.exists(
    paths.join(tok_dir, tokenizers.TOKENIZER_FILENAME)
  )
  saved = tokenizers.load_tokenizer(tok_dir) if has_saved else None
  source = source_registry.build_source(cfg, tokenizer=saved)
  # Every process builds the same tokenizer; only process 0 writes it, so
  # a shared workdir sees one writer.
  if tok_dir and saved is None and jax.process_index() == 0:
    source.tokenizer.save(tok_dir)
  return Data(tokenizer=source.tokenizer, source=source, settings=cfg)


def train_batches(config, data: Data, seed: int):
  """The checkpointable training iterator for this process.

  The global batch is the run's `train.batch_size` (this process reads its
  share); the rows are `data.settings.seq_len` tokens long.
  """
  count = jax.process_count()
  batch, cfg = config.train.batch_size, data.settings
  if batch % count:
    raise ValueError(
      f'train.batch_size={batch} must divide across {count} processes.'
    )
  return data.source.train_iterator(
    seq_len=cfg.seq_len,
    batch_size=batch // count,
    seed=seed,
    shard_index=jax.process_index(),
    shard_count=count,
    num_threads=cfg.num_threads,
  )
