"""Shared defaults, presets and recipes of the language-model configs.

`base_config()` holds every key a run reads. The paper configs (md4_*,
mdlm_*, ar_*) start from `mdlm()` or `md4()`, set their data (and the few
settings their paper changes) and end with `finish(c, preset)`; the AR
baselines apply `autoregressive()` to their MDLM twin. What the two
recipes share is the papers' "small" run: a 12 x 768 transformer, global
batch 512, 1,000,000 Adam steps at lr 3e-4 with b2 0.999 and EMA 0.9999.

A config's argument (`--config=FILE:ARG`) is read by the one `parse_arg`:
each config declares the parts it takes (`Choice`, `Flag`) and its
presets, and a misspelt part fails naming the closest valid value.

``:smoke`` (`apply_smoke`) shrinks a config to seconds on CPU. For the paper
configs (`apply_paper_smoke`) it keeps the data code path but reads the tiny
real-format fixtures under ``tests/fixtures/`` (regenerate with ``python
tests/fixtures/make_fixtures.py``) and trains a test-only tokenizer for
LM1B/OWT on them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import pathlib
import tempfile
from typing import Any

import ml_collections

from ddlm_jax.diffusion.base import default_block
from ddlm_jax.training.config import apply_overrides


def base_config() -> ml_collections.ConfigDict:
  """All keys a run reads; each experiment file changes what it needs."""
  c = ml_collections.ConfigDict()
  # What experiments.run runs: lm, state_tracking or planner_executor.
  c.kind = 'lm'
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  # Text corpora: 'shakespeare' | 'text_files'. Dataset sources
  # (ddlm_jax.data.sources): 'text8' | 'lm1b' | 'openwebtext'.
  c.data.corpus = 'shakespeare'
  c.data.files = ml_collections.ConfigDict(
    {'train': '', 'validation': '', 'test': ''}
  )
  c.data.tokenizer = 'char'  # Text corpora: 'char' | 'byte' | 'bpe'.
  c.data.bpe_vocab_size = 4096
  c.data.seq_len = 128
  # Dataset sources. data_dir: text8 -> folder of text8.zip; lm1b -> TFDS
  # data_dir ('' = TFDS default); openwebtext -> save_to_disk folder ('' =
  # datasets.load_dataset(hf_dataset) from the HF cache).
  c.data.data_dir = ''
  c.data.cache_dir = ''  # Packed token streams ('' = ~/.cache/ddlm_jax).
  # lm1b/openwebtext tokenizer: HF name or tokenizer.json path ('' = the
  # dataset's: bert-base-uncased / gpt2). 'test:wordpiece' / 'test:bytebpe'
  # train a TEST-ONLY stand-in on the local data (smoke presets).
  c.data.hf_tokenizer = ''
  c.data.test_tokenizer_vocab = 512
  c.data.packing = 'packed'  # 'packed' | 'padded' (lm1b; adds loss_mask).
  c.data.wrap = 'bos_eos'  # Packed rows: 'bos_eos' (MDLM) | 'eos' (md4).
  c.data.detokenize = False  # Detokenize before tokenizing (MDLM's LM1B).
  c.data.hf_dataset = 'Skylion007/openwebtext'
  c.data.owt_split = 'mdlm'  # 'mdlm': last docs held out | 'md4': 2% rows.
  c.data.owt_validation_docs = 100_000
  c.data.owt_validation_fraction = 0.02
  c.data.num_threads = 1  # grain reader threads (padded sources tokenize).
  # Processes that tokenize a token cache (lm1b/openwebtext, prepare_data);
  # the caches are identical for any count.
  c.data.prep_processes = 1

  # The process block holds `kind` and the settings of that kind's family
  # config (ddlm_jax.diffusion: MaskedConfig for 'mdlm' / 'md4', 'ar',
  # UniformConfig 'udlm', DuoConfig 'duo', InterpolatingConfig
  # 'interpolating', BlockConfig 'bd3'; their docstrings explain each key).
  # Switch the kind with set_process(c, kind), which keeps the settings the
  # two families share.
  c.process = process_block('mdlm')

  c.model = ml_collections.ConfigDict()
  c.model.width = 192
  c.model.depth = 4
  c.model.num_heads = 4
  c.model.mlp_dim = 0
  c.model.mlp_kind = 'swiglu'
  c.model.time_conditioning = False
  c.model.cond_dim = 128
  c.model.tied_embeddings = False
  c.model.rope_theta = 10_000.0
  c.model.attention_impl = 'xla'
  c.model.dtype = 'float32'  # Compute dtype ('bfloat16' on TPU/GPU).
  c.model.remat = False  # Recompute each block in the backward pass.
  # 'hybrid': a per-layer pattern of attention (A) and bidirectional SSM (S)
  # mixers (ddlm_jax.models.hybrid); depth must equal len(pattern).
  c.model.backbone = 'transformer'  # 'transformer' | 'hybrid'
  c.model.pattern = 'ASAS'
  c.model.ssm_kind = 'pdssm'  # 'pdssm' | 'complex_diag' | 'selective_diag'
  c.model.state_size = 64
  c.model.num_dict = 8
  c.model.scan_impl = 'auto'

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 2e-3
  c.optim.warmup_steps = 100
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.99
  c.optim.grad_clip = 1.0
  c.optim.final_lr_fraction = 0.1
  c.optim.ema_decay = 0.0  # 0 disables the parameter EMA.
  c.optim.grad_accum_steps = 1  # Micro-batches per step (same global batch).

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 1000
  # Global batch: sequences per step over all processes and devices (each
  # process reads batch_size / processes rows of it).
  c.train.batch_size = 32
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.checkpoint_every = 250
  c.train.max_checkpoints = 3
  c.train.halt_after_steps = 0  # Stop early this run (resume later); 0 = off.
  # Continued pretraining: a run directory whose newest parameters
  # initialise this run's network (optimizer state starts fresh). Used only
  # when this workdir has no checkpoint yet.
  c.train.init_from = ''

  c.eval = ml_collections.ConfigDict()
  c.eval.batch_size = 32
  c.eval.num_batches = 8  # Periodic evaluation.
  c.eval.time_samples = 1
  c.eval.final_num_batches = 0  # 0: the whole split.
  c.eval.final_time_samples = 4
  c.eval.use_ema = True
  # How the time_samples draws of a masked bound are taken: 'iid' |
  # 'stratified' | 'antithetic' | 'counts' (time-free networks only).
  c.eval.estimator = 'iid'

  c.sample = ml_collections.ConfigDict()
  c.sample.num_samples = 4
  # Samples per sampler call; more run as several calls with progress.
  c.sample.batch_size = 64
  c.sample.steps = 128
  c.sample.use_cache = True
  c.sample.temperature = 1.0
  c.sample.top_k = 0
  c.sample.top_p = 1.0
  c.sample.seed = 0
  # Sampler by name or spec ('eb:gamma=0.1'); ddlm_jax.sampling.registry.
  # Names: ancestral, first_hitting, confidence, eb, remdm, semi_ar,
  # scheduled. `steps`, `use_cache` and the filters above feed the samplers
  # that take them; `params` (config files) and the spec override them.
  c.sample.sampler = 'ancestral'
  c.sample.params = ml_collections.ConfigDict()
  c.sample.prefix = ''  # Text prompt: fixed first tokens of every sample.
  c.sample.light_workdir = ''  # Light network run for sampler 'scheduled'.
  c.sample.scorer = ''  # AR run dir: gen-ppl (and MAUVE) of the samples.
  c.sample.mauve = False  # MAUVE vs validation text (needs mauve-text).

  # Soft-masking (arXiv 2510.17206; ddlm_jax.models.soft_masking): masked
  # inputs blend E[mask] with the previous prediction's top-k tokens.
  c.soft_mask = ml_collections.ConfigDict()
  c.soft_mask.enabled = False
  c.soft_mask.k = 3  # top-k tokens in the blend (paper: 3 at 169M).
  c.soft_mask.sm_prob = 0.8  # Share of training batches with two passes.
  c.soft_mask.learning_rate = 1e-2  # Peak LR of the three SM scalars.
  c.soft_mask.w_s_init = 0.01  # Paper: ~0; 0.1-0.3 for short runs.
  c.soft_mask.w_a_init = 6.66
  c.soft_mask.w_b_init = -0.75

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); one -1 is filled.

  # Metric loggers besides metrics.jsonl (always written): comma-separated
  # 'jsonl' | 'tensorboard' | 'wandb' (extras of the same names);
  # ddlm_jax.training.log_backends.
  c.log = ml_collections.ConfigDict()
  c.log.backends = 'jsonl'
  c.log.wandb_project = 'ddlm_jax'
  c.log.wandb_entity = ''  # '' = the account's default entity.
  # 'auto': online with an API key and network, else offline (wandb sync).
  c.log.wandb_mode = 'auto'
  return c


def process_block(kind: str, **settings) -> ml_collections.ConfigDict:
  """A config.process block: the kind and its family config's defaults."""
  block = default_block(kind)
  block.update(settings)
  return ml_collections.ConfigDict(block)


def set_process(c: ml_collections.ConfigDict, kind: str, **settings):
  """Switches c.process to `kind`, keeping the settings both families have.

  A family's own keys come with their defaults; `settings` are set last.
  """
  dotted = {f'process.{key}': value for key, value in settings.items()}
  return apply_overrides(c, {'process.kind': kind, **dotted})


def override(
  c: ml_collections.ConfigDict, dotted: dict
) -> ml_collections.ConfigDict:
  """Sets {'a.b': value, ...} in place (as --config.a.b=value does)."""
  return apply_overrides(c, dotted)


PRESETS = ('', 'smoke')
_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Choice:
  """One part of a config argument: a value from `values`.

  Without a `default` the part is required; with one it may be left out
  (the next part is then read as the following slot).
  """

  name: str
  values: tuple
  default: Any = _REQUIRED

  @property
  def required(self) -> bool:
    return self.default is _REQUIRED

  def read(self, part: str):
    """The value `part` names, or None when it names none."""
    return next((v for v in self.values if str(v) == part), None)

  def form(self) -> str:
    return self.name.upper()

  def named(self) -> tuple:
    return tuple(v for v in self.values if v != '')


@dataclasses.dataclass(frozen=True)
class Flag:
  """An optional word of a config argument: True where it is given."""

  word: str

  name = 'option'
  required = False
  default = False

  def read(self, part: str):
    return True if part == self.word else None

  def form(self) -> str:
    return self.word

  def named(self) -> tuple:
    return (self.word,)


@dataclasses.dataclass(frozen=True)
class Directory:
  """An optional part naming an existing directory (a run to start from)."""

  name: str = 'directory'

  required = False
  default = ''

  def read(self, part: str):
    return part if os.path.isdir(part) else None

  def form(self) -> str:
    return 'DIR'

  def named(self) -> tuple:
    return ()


def _form(slots, presets) -> str:
  """'BLOCK[,scratch][,smoke] with BLOCK one of (4, 8, 16)'."""
  text = ''
  for slot in slots:
    sep = ',' if text else ''
    text += f'{sep}{slot.form()}' if slot.required else f'[{sep}{slot.form()}]'
  named = tuple(p for p in presets if p)
  listed = len(named) <= 3
  if named:
    word = '|'.join(named) if listed else 'preset'
    text += f'[,{word}]' if text else f'[{word}]'
  choices = [
    f'{slot.form()} one of {slot.named()}'
    for slot in slots
    if isinstance(slot, Choice)
  ]
  if named and not listed:
    choices.append(f'preset one of {named}')
  return f'{text} with {", ".join(choices)}' if choices else text


def _example(slots) -> str:
  return ','.join(
    str(slot.named()[0]) for slot in slots if slot.required and slot.named()
  )


def _unknown(slot, part: str) -> str:
  """ "unknown task 'parityy' (did you mean 'parity'?); choose one of ..."."""
  names = [str(v) for v in slot.named()]
  close = difflib.get_close_matches(part, names, n=1)
  hint = f' (did you mean {close[0]!r}?)' if close else ''
  return f'unknown {slot.name} {part!r}{hint}; choose one of {slot.named()}'


def parse_arg(arg: str | None, *slots, presets=PRESETS) -> tuple:
  """'A[,B][,preset]' -> (a, b, preset): every config's argument parser.

  Each config names the parts it reads (`Choice`, `Flag`), in order; the
  last, optional part is a preset of `presets`. A part left out takes its
  slot's default. A part that fits nowhere fails in one line naming the
  closest valid value and the argument's form (which `--list` shows).
  """
  presets = tuple(presets)
  slots = (*slots, Choice('preset', presets, ''))
  parts = [p.strip() for p in (arg or '').split(',')]
  if parts[-1] == '':  # 'a,b,' is 'a,b' with the empty preset.
    parts.pop()
  values, skipped, i = [], [], 0
  problem = None
  if '' in parts:
    problem = 'an empty part'
  for slot in slots:
    if problem:
      break
    part = parts[i] if i < len(parts) else None
    value = None if part is None else slot.read(part)
    if value is not None:
      values.append(value)
      skipped, i = [], i + 1
    elif not slot.required:
      values.append(slot.default)
      skipped.append(slot)
    elif part is None:
      problem = f'no {slot.name} given'
    else:
      problem = _unknown(slot, part)
  if not problem and i < len(parts):
    part = parts[i]
    if not skipped:
      problem = f'{part!r} is one part too many'
    else:
      near = [
        s
        for s in skipped
        if difflib.get_close_matches(part, [str(v) for v in s.named()], n=1)
      ]
      problem = _unknown((near or skipped)[-1 if not near else 0], part)
  if problem:
    form = _form(slots[:-1], presets)
    example = _example(slots[:-1])
    named = [p for p in presets if p]
    preset = 'smoke' if 'smoke' in named else (named or [''])[-1]
    raise ValueError(
      f'config argument {arg!r}: {problem}; expected {form}, e.g. '
      f'{example!r} or {config_arg(example, preset)!r}.'
    )
  return tuple(values)


def check_preset(preset: str | None, presets=PRESETS) -> str:
  """The preset of a config that takes no other argument ('' or 'smoke')."""
  return parse_arg(preset, presets=presets)[0]


def config_arg(*parts: str) -> str:
  """The argument string parse_arg reads: ('latent', '') -> 'latent'."""
  return ','.join(p for p in parts if p)


def apply_smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The ':smoke' preset: seconds on CPU, for tests and first checks."""
  c.data.seq_len = 32
  c.train.batch_size = 8
  c.model.width = 32
  c.model.depth = 1  # One block: a smoke run compiles ~25% faster than with 2.
  c.model.num_heads = 2
  c.optim.warmup_steps = 2
  c.train.num_steps = 6
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.checkpoint_every = 3
  c.eval.batch_size = 8
  c.eval.num_batches = 2
  c.eval.final_num_batches = 2
  c.eval.final_time_samples = 1
  c.sample.num_samples = 2
  c.sample.steps = 16
  return c


FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'tests' / 'fixtures'
DATA_ROOT = '~/ddlm_data'  # Where docs/LAUNCH.md puts the prepared data.
SMOKE_TOKENIZERS = {
  'lm1b': 'test:wordpiece',
  'openwebtext': 'test:bytebpe',
}


def small_model(c: ml_collections.ConfigDict, *, time_conditioning: bool):
  """MD4/MDLM "small": 12 x 768, 12 heads, SwiGLU MLP (GLU in MD4)."""
  c.model.width = 768
  c.model.depth = 12
  c.model.num_heads = 12
  c.model.mlp_dim = 0
  c.model.time_conditioning = time_conditioning
  c.model.cond_dim = 128
  return c


def _paper(seed: int, *, time_conditioning: bool) -> ml_collections.ConfigDict:
  """What MDLM and MD4 share: model, batch, steps, Adam, EMA, sampling."""
  c = base_config()
  c.seed = seed
  c.train.batch_size = 512
  small_model(c, time_conditioning=time_conditioning)
  c.model.dtype = 'bfloat16'
  c.optim.learning_rate = 3e-4
  c.optim.b2 = 0.999
  c.optim.ema_decay = 0.9999
  c.train.num_steps = 1_000_000
  c.train.log_every = 500
  c.train.eval_every = 10_000
  c.train.checkpoint_every = 5_000
  c.eval.batch_size = 512
  c.eval.num_batches = 4
  c.eval.final_num_batches = 0  # The whole split.
  c.eval.final_time_samples = 1
  c.sample.num_samples = 8
  c.sample.steps = 1_000
  return c


def mdlm() -> ml_collections.ConfigDict:
  """MDLM (Sahoo et al. 2024): log-linear SUBS, no time conditioning.

  Continuous time, antithetic t >= 1e-3; Adam with 2,500 warmup steps then
  constant, no weight decay, gradient clip 1.0.
  """
  c = _paper(1, time_conditioning=False)
  set_process(
    c, 'mdlm', schedule='loglinear', num_steps=0, t_min=1e-3, antithetic=True
  )
  c.optim.warmup_steps = 2_500
  c.optim.weight_decay = 0.0
  c.optim.grad_clip = 1.0
  c.optim.final_lr_fraction = 1.0  # Constant after warmup.
  c.sample.use_cache = True  # Time-free network: MDLM's ddpm_cache.
  return c


def md4() -> ml_collections.ConfigDict:
  """MD4 (Shi et al. 2024): linear schedule, adaLN time conditioning.

  Continuous time, antithetic t; Adam with 2,000 warmup steps then cosine
  to 0, weight decay 0.03, no gradient clipping.
  """
  c = _paper(42, time_conditioning=True)
  set_process(
    c, 'md4', schedule='linear', num_steps=0, t_min=0.0, antithetic=True
  )
  c.optim.warmup_steps = 2_000
  c.optim.weight_decay = 0.03
  c.optim.grad_clip = 0.0
  c.optim.final_lr_fraction = 0.0
  c.sample.use_cache = False  # Time-conditioned network.
  return c


def uniform(c: ml_collections.ConfigDict, curriculum_steps: int = 0):
  """The uniform-state twin of a masked config (UDLM; Duo with a curriculum).

  Log-linear schedule, continuous-time NELBO, time-conditioned network
  (the optimal uniform-state denoiser depends on t), the uniform ancestral
  sampler with the greedy tail (Duo's noise removal).
  """
  if curriculum_steps:
    set_process(c, 'duo', curriculum_steps=curriculum_steps)
  else:
    set_process(c, 'udlm')
  c.process.schedule = 'loglinear'
  c.process.num_steps = 0
  c.model.time_conditioning = True
  c.sample.sampler = 'uniform_ancestral'
  c.sample.use_cache = False
  c.sample.params = ml_collections.ConfigDict({'greedy_tail': True})
  return c


def autoregressive(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The AR baseline of a config: causal attention, exact NLL, BOS input."""
  set_process(c, 'ar')
  c.model.time_conditioning = False
  return c


def finish(c: ml_collections.ConfigDict, preset: str):
  """Applies the preset ('' or 'smoke') last, after the config's settings."""
  if check_preset(preset) == 'smoke':
    apply_paper_smoke(c)
  return c


def apply_paper_smoke(
  c: ml_collections.ConfigDict,
) -> ml_collections.ConfigDict:
  """Seconds on CPU through the real data code on the shipped fixtures."""
  apply_smoke(c)
  corpus = c.data.corpus
  c.data.data_dir = str(FIXTURES / corpus)
  c.data.cache_dir = os.path.join(tempfile.gettempdir(), 'ddlm_jax_smoke')
  c.data.hf_tokenizer = SMOKE_TOKENIZERS.get(corpus, '')
  c.data.test_tokenizer_vocab = 512
  c.data.owt_validation_docs = 40
  c.data.owt_validation_fraction = 0.1
  c.data.num_threads = 1
  c.model.cond_dim = 32
  c.model.dtype = 'float32'
  c.optim.learning_rate = 2e-3
  c.optim.ema_decay = 0.0
  c.optim.grad_clip = 1.0
  c.eval.batch_size = 8
  c.train.max_checkpoints = 2
  return c
