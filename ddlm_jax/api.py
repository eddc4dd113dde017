"""The Python API: load a run by its workdir, score text, generate, infill.

    import ddlm_jax
    model = ddlm_jax.load('runs/quickstart')
    print(model.generate(2, sampler='ancestral', steps=64))

`load` reads the run's config.json and tokenizer and restores only the
evaluation parameters (the EMA when the run kept one and evaluates with
it, else the raw ones) from the newest checkpoint: no optimizer state, no
training data, no train state is built. Everything else is the machinery
`python -m experiments.run` uses: the config's process and network
(`training.builders`), the likelihood of `--mode=eval`
(`evaluation.likelihood.sequence_nll`), and the samplers and measured
sampling of `--mode=sample` (`sampling.registry`,
`evaluation.sample_run.draw_samples`).

Text in, text out: `score` returns one bound per text, `generate` and
`infill` return strings.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from ddlm_jax import paths
from ddlm_jax.data import source_registry, sources
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.evaluation import cost
from ddlm_jax.evaluation.likelihood import sequence_nll
from ddlm_jax.evaluation.sample_run import check_time_free, draw_samples
from ddlm_jax.sampling import rows as rows_lib
from ddlm_jax.sampling.common import generate_id
from ddlm_jax.sampling.registry import sampler_from_config
from ddlm_jax.training import builders, steps
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.state import count_params, split_model


@dataclasses.dataclass(frozen=True)
class Score:
  """The bound of one text: NELBO (diffusion) or exact NLL (AR).

  `nats_per_token_stderr` is the Monte-Carlo standard error over the
  `samples` draws of (t, z_t) (0 for AR runs, whose NLL is exact).
  `num_tokens` counts the text's tokens plus the BOS/EOS of each row for
  runs whose rows were framed with them (data.wrap), as in training.
  """

  text: str
  num_tokens: int
  nats_per_token: float
  nats_per_token_stderr: float
  samples: int

  @property
  def bits_per_token(self) -> float:
    return self.nats_per_token / math.log(2.0)

  @property
  def bits_per_token_stderr(self) -> float:
    return self.nats_per_token_stderr / math.log(2.0)

  @property
  def perplexity_bound(self) -> float:
    return math.exp(self.nats_per_token)


def _latest_step(ckpt_dir: str) -> int:
  steps_found = []
  if paths.isdir(ckpt_dir):
    for name in paths.listdir(ckpt_dir):
      done = paths.join(ckpt_dir, name, 'commit_success.txt')
      if name.isdigit() and paths.exists(done):
        steps_found.append(int(name))
  if not steps_found:
    raise FileNotFoundError(
      f'{ckpt_dir} holds no finished checkpoint: train the run first '
      '(python -m experiments.run --config=... --workdir=...).'
    )
  return max(steps_found)


@contextlib.contextmanager
def _quiet(name: str):
  """Raises a logger's level to ERROR for the block."""
  logger = logging.getLogger(name)
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _has_leaves(tree) -> bool:
  return isinstance(tree, dict) and bool(jax.tree.leaves(tree))


def restore_params(workdir: str, abstract_params, *, use_ema: bool):
  """(params, step, which) from the newest checkpoint, params subtree only.

  Only the 'ema_params' (when `use_ema` and the run kept an EMA) or the
  'params' subtree of the saved train state is read (orbax partial
  restore), onto the first local device; the optimizer state stays on disk.
  """
  import orbax.checkpoint as ocp

  ckpt_dir = paths.join(paths.absolute(workdir), 'checkpoints')
  step = _latest_step(ckpt_dir)
  path = paths.join(ckpt_dir, str(step), 'state')
  checkpointer = ocp.PyTreeCheckpointer()
  with _quiet('absl'):  # Orbax warns of a metadata file runs never write.
    meta = checkpointer.metadata(path)
  tree = getattr(meta, 'item_metadata', meta)
  tree = getattr(tree, 'tree', tree)
  which = 'params'
  if use_ema and _has_leaves(tree.get('ema_params')):
    which = 'ema_params'
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
    abstract_params,
  )
  item = {which: target}
  with _quiet('absl'):
    restored = checkpointer.restore(
      path,
      args=ocp.args.PyTreeRestore(
        item=item,
        restore_args=ocp.checkpoint_utils.construct_restore_args(item),
        partial_restore=True,
      ),
    )
  return restored[which], step, which


def _row_seeds(seed, rows: int) -> list[int]:
  """seed + b for row b, or one given seed per row."""
  if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
    seeds = [int(seed) + b for b in range(rows)]
  else:
    seeds = [int(s) for s in seed]
  bad = [s for s in seeds if not 0 <= s < 2**32]
  if bad:
    raise ValueError(f'seed {bad[0]}: row seeds must lie in [0, 2**32).')
  if len(seeds) != rows:
    raise ValueError(
      f'{len(seeds)} seeds for {rows} prompts; give one seed per prompt '
      'or a single int.'
    )
  return seeds


def masked_network(model):
  """valid_1xL -> apply(z, t) whose attention never reads invalid keys.

  The LLaMA-family models take the padding mask themselves; the suite's
  bidirectional attention-only Transformer gets it through its backbone's
  attention context. Other networks have no padding mask: ConfigError.
  """
  from ddlm_jax.models.attention import AttentionContext
  from ddlm_jax.models.llama_family import LlamaFamily
  from ddlm_jax.models.transformer import Block, Transformer

  if isinstance(model, LlamaFamily):
    return lambda valid: (
      lambda z, t=None: model(z, t, valid_BxL=valid)  # noqa: E731
    )
  plain = (
    isinstance(model, Transformer)
    and not model.cfg.causal
    and not model.cfg.block_size
    and not getattr(model, 'uses_feedback', False)
    and all(isinstance(b, Block) for b in model.blocks)
  )
  if not plain:
    raise ConfigError(
      f'{type(model).__name__} has no padding mask, and max_new_tokens '
      'leaves padding after some prompts; omit max_new_tokens (every row '
      'fills data.seq_len).'
    )
  import pallas_kernels  # Lazily, as attention.attend does.

  def make(valid_1xL):
    ctx = AttentionContext(mask=pallas_kernels.MaskSpec.full(valid_1xL))
    return lambda z, t=None: model.logits(
      model.backbone(model.embed(z), t, ctx=ctx)
    )

  return make


def _as_list(texts) -> list[str]:
  if isinstance(texts, str):
    return [texts]
  texts = list(texts)
  bad = [t for t in texts if not isinstance(t, str)]
  if bad:
    raise TypeError(f'expected strings, got {type(bad[0]).__name__}.')
  return texts


class Model:
  """A trained run's network, process and tokenizer, ready for text.

  Built by `load(workdir)`. Attributes mirror the CLI's `Run` where the
  sampling code reads them (config, process, graphdef, model_config,
  eos_id), so the same functions serve both.
  """

  def __init__(
    self,
    workdir,
    config,
    tokenizer,
    process,
    graphdef,
    params,
    settings: builders.RunSettings | None = None,
  ):
    self.workdir = workdir
    self.config = config
    # The typed blocks of config (builders.typed_blocks), as load made them.
    self.settings = (
      builders.typed_blocks(config) if settings is None else settings
    )
    self.tokenizer = tokenizer
    self.process = process
    self.model_config = builders.model_config(config.model, process)
    self.graphdef = graphdef
    self.params = params
    self.step = 0  # Set by load: the checkpoint step.
    self.params_kind = 'params'  # Or 'ema_params'.
    specials = getattr(tokenizer, 'special_ids', None)
    self.eos_id = None if specials is None else specials.eos
    self.num_params = count_params(params)
    self.last_stats: dict = {}  # Measurements of the last generate/infill.
    self._row_samplers: dict = {}  # (sampler, padded) -> jitted function.

  def __repr__(self) -> str:
    return (
      f'Model({self.workdir!r}: {self.settings.process.kind}, '
      f'{self.num_params / 1e6:.2f}M params, step {self.step}, '
      f'seq_len {self.seq_len})'
    )

  @property
  def seq_len(self) -> int:
    return int(self.settings.data.seq_len)

  # The duck type of tasks.language_model.Run that draw_samples reads.
  def eval_params(self):
    return self.params

  def forward_flops(self, batch: int, length: int) -> float:
    if self.config.model.get('backbone', 'transformer') == 'transformer':
      return cost.transformer_flops(self.model_config, batch, length)
    model = steps.make_apply(self.graphdef, self.params)
    return cost.xla_flops(lambda z, t: model(z, t), batch, length)

  # ---------------------------------------------------------------- score

  def _framing(self):
    """(bos, eos, pad) ids the run's training rows were framed with."""
    specials = getattr(self.tokenizer, 'special_ids', None)
    data = self.settings.data
    if data.corpus not in source_registry.CORPORA or not specials:
      return None, None, 0
    bos, eos = sources.framing_ids(data.wrap, specials, 'run')
    pad = next((i for i in (specials.pad, eos) if i is not None), 0)
    return bos, eos, pad

  def _rows(self, ids: np.ndarray):
    """Rows [R, L] and loss masks of one text, framed as in training."""
    bos, eos, pad = self._framing()
    width = self.seq_len - (bos is not None) - (eos is not None)
    if width < 1:
      raise ConfigError(f'data.seq_len={self.seq_len} leaves no content.')
    rows, masks = [], []
    for start in range(0, max(len(ids), 1), width):
      piece = list(ids[start : start + width])
      row = ([bos] if bos is not None else []) + piece
      row += [eos] if eos is not None else []
      mask = [1.0] * len(row) + [0.0] * (self.seq_len - len(row))
      rows.append(row + [pad] * (self.seq_len - len(row)))
      masks.append(mask)
    return np.asarray(rows, np.int32), np.asarray(masks, np.float32)

  def score(
    self,
    texts: str | Sequence[str],
    *,
    samples: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
  ) -> list[Score]:
    """The bound of each text, with its Monte-Carlo standard error.

    A text longer than one row (data.seq_len, framed as the run was
    trained) is cut into rows whose bounds add up; a shorter last row is
    padded and its padding excluded from the loss.

    Args:
      texts: a string or a list of strings.
      samples: draws of (t, z_t) per text (default: the run's
        eval.final_time_samples, at least 2 for a standard error); 1 for AR.
      batch_size: rows per network call (default: eval.batch_size).
    """
    texts = _as_list(texts)
    process = self.process.evaluation_process
    draws = (
      1
      if process.causal
      else int(samples or max(2, self.config.eval.final_time_samples))
    )
    if draws < 1:
      raise ValueError(f'samples={samples}: need at least 1 draw.')
    batch = int(batch_size or self.config.eval.batch_size)
    per_text = [self._rows(self.tokenizer.encode(t)) for t in texts]
    owner = np.concatenate(
      [np.full(len(r), i) for i, (r, _) in enumerate(per_text)]
    )
    rows = np.concatenate([r for r, _ in per_text])
    masks = np.concatenate([m for _, m in per_text])
    nll_DxR = np.zeros((draws, len(rows)), np.float64)
    key = jax.random.key(seed)
    for start in range(0, len(rows), batch):
      x = rows[start : start + batch]
      m = masks[start : start + batch]
      n = len(x)
      if n < batch:  # One compiled shape: pad with copies, drop them.
        x = np.concatenate([x, np.repeat(x[:1], batch - n, 0)])
        m = np.concatenate([m, np.repeat(m[:1], batch - n, 0)])
      for d in range(draws):
        nll = sequence_nll(
          self.params,
          jax.random.fold_in(jax.random.fold_in(key, d), start),
          x,
          m,
          graphdef=self.graphdef,
          process=process,
          samples=1,
        )
        nll_DxR[d, start : start + n] = np.asarray(nll, np.float64)[:n]
    tokens_R = masks.sum(-1)
    out = []
    for i, text in enumerate(texts):
      sel = owner == i
      total_D = nll_DxR[:, sel].sum(-1)
      tokens = int(tokens_R[sel].sum())
      stderr = (
        float(total_D.std(ddof=1) / math.sqrt(draws)) if draws > 1 else 0.0
      )
      out.append(
        Score(
          text=text,
          num_tokens=tokens,
          nats_per_token=float(total_D.mean() / tokens),
          nats_per_token_stderr=stderr / tokens,
          samples=draws,
        )
      )
    return out

  # ------------------------------------------------------------- generate

  def _sample_config(self, sampler, steps, overrides):
    cfg = copy.deepcopy(self.config)
    with cfg.sample.unlocked():
      if sampler is not None:
        cfg.sample.sampler = sampler
      if steps is not None:
        cfg.sample.steps = int(steps)
      for key, value in overrides.items():
        if key not in cfg.sample:
          raise ConfigError(
            f'generate(): unknown option {key!r}; sample options are '
            f'{sorted(cfg.sample.keys())}.'
          )
        cfg.sample[key] = value
    return cfg

  def _sampler(self, cfg):
    if self.process.causal:
      return None
    try:
      built = sampler_from_config(cfg.sample, eos_id=self.eos_id)
      built.check_applies(self.process)
      check_time_free(built, cfg.model.get('time_conditioning', False))
    except (TypeError, ValueError) as err:
      raise ConfigError(f'sampler: {err}') from None
    return built

  def _draw(self, cfg, sampler, num, seed, prompt_BxL=None):
    view = copy.copy(self)
    view.config = cfg
    tokens, stats = draw_samples(
      view, sampler, num_samples=num, seed=seed, prompt_BxL=prompt_BxL
    )
    self.last_stats = stats
    return tokens

  def _prompt_rows(self, pieces_per_row) -> np.ndarray:
    """Rows [B, L]: given token ids kept, None entries to be generated."""
    fill = generate_id(self.process)
    rows = []
    for pieces in pieces_per_row:
      row = np.full(self.seq_len, fill, np.int32)
      pos = 0
      for piece in pieces:
        if isinstance(piece, int):
          pos += piece
          continue
        ids = np.asarray(self.tokenizer.encode(piece), np.int32)
        if pos + len(ids) > self.seq_len:
          raise ValueError(
            f'the text and blanks need more than data.seq_len='
            f'{self.seq_len} tokens; shorten them.'
          )
        row[pos : pos + len(ids)] = ids
        pos += len(ids)
      if pos > self.seq_len:
        raise ValueError(
          f'the text and blanks need {pos} tokens, more than '
          f'data.seq_len={self.seq_len}; shorten them.'
        )
      rows.append(row)
    return np.stack(rows)

  def generate(
    self,
    n_or_prompts: int | str | Sequence[str] = 1,
    *,
    sampler: str | None = None,
    steps: int | None = None,
    seed: int | Sequence[int] = 0,
    max_new_tokens: int | None = None,
    **sample_options,
  ) -> list[str]:
    """Texts of one row (data.seq_len tokens) each, or prompt continuations.

    Prompts may have different lengths: each row is sampled on its own
    (sampling.rows), so a row's text is the text the same prompt gives
    alone with the same row seed, whatever else is in the batch.

    Args:
      n_or_prompts: how many unconditional samples, or prompt strings
        (each row starts with its prompt; the text returned includes it).
      sampler: a sampler name or spec, e.g. 'ancestral' or
        'llada:block_length=32' (default: the run's sample.sampler).
      steps: sampling steps (default: the run's sample.steps).
      seed: unconditional samples: the seed. Prompts: row b's seed is
        seed + b, or seed[b] for a list of one seed per prompt.
      max_new_tokens: prompts only: tokens to generate after each prompt
        (default: the rest of the row); positions after them are padding
        that attention never reads.
      **sample_options: other keys of the run's `sample` block, e.g.
        temperature=0.8, top_p=0.9.
    """
    cfg = self._sample_config(sampler, steps, sample_options)
    built = self._sampler(cfg)
    if isinstance(n_or_prompts, int) and not isinstance(n_or_prompts, bool):
      if n_or_prompts < 1:
        raise ValueError(f'generate({n_or_prompts}): ask for 1 or more.')
      if max_new_tokens is not None:
        raise ValueError('max_new_tokens applies to prompts; give strings.')
      if not isinstance(seed, int):
        raise ValueError('a list of seeds needs prompts, one seed each.')
      tokens = self._draw(cfg, built, n_or_prompts, seed)
      return [self.tokenizer.decode(row) for row in tokens]
    prompts = _as_list(n_or_prompts)
    if not prompts:
      raise ValueError('generate([]): give at least one prompt.')
    if self.process.causal:
      raise ValueError(
        'prompts need a diffusion run: the AR sampler here draws whole '
        'rows; call generate(n) for unconditional samples.'
      )
    seeds = _row_seeds(seed, len(prompts))
    ids = [self.tokenizer.encode(p) for p in prompts]
    tokens, ends = self.complete(
      ids, built, seeds=seeds, max_new_tokens=max_new_tokens
    )
    return [self.tokenizer.decode(row[:end]) for row, end in zip(tokens, ends)]

  def _row_sampler(self, sampler, padded: bool):
    """The jitted row-by-row sampler, kept for the next call alike."""
    cache = self._row_samplers
    if (sampler, padded) not in cache:
      apply = steps.make_apply(self.graphdef, self.params)
      masked = masked_network(apply) if padded else None

      def fn(keys_B, rows_BxL, valid_BxL):
        return rows_lib.sample_rows(
          sampler,
          apply,
          keys_B,
          self.process,
          rows_BxL,
          valid_BxL if padded else None,
          masked,
        )

      cache[sampler, padded] = jax.jit(fn)
    return cache[sampler, padded]

  def complete(self, prompt_ids, sampler, *, seeds, max_new_tokens=None):
    """(tokens_BxL numpy, span ends) for token-id prompts, row by row.

    The body of `generate(prompts)`: rows of the run's length with padding
    after each span (sampling.rows.prompt_batch), each sampled alone with
    its seed's key (sampling.rows.sample_rows).
    """
    if max_new_tokens is not None and (
      isinstance(max_new_tokens, bool) or int(max_new_tokens) < 1
    ):
      raise ValueError(f'max_new_tokens={max_new_tokens!r}: give an int >= 1.')
    _, _, pad = self._framing()
    rows, valid, ends = rows_lib.prompt_batch(
      prompt_ids,
      self.seq_len,
      generate_id=generate_id(self.process),
      pad_id=pad,
      max_new_tokens=max_new_tokens,
    )
    padded = bool(not valid.all())
    fn = self._row_sampler(sampler, padded)
    keys = rows_lib.row_keys(seeds)
    tokens, nfe = fn(keys, rows, valid)
    nfe = np.asarray(jax.tree.leaves(nfe)[0])
    self.last_stats = {
      'sampler': sampler.name,
      'num_samples': len(prompt_ids),
      'steps': getattr(sampler, 'num_steps', self.seq_len),
      'nfe': float(nfe.max()),
      'nfe_per_row': nfe.tolist(),
    }
    return np.asarray(tokens), ends.tolist()

  def infill(
    self,
    templates: Sequence[str | int] | Sequence[Sequence[str | int]],
    *,
    sampler: str | None = None,
    steps: int | None = None,
    seed: int = 0,
    **sample_options,
  ) -> list[str]:
    """Fills the blanks of templates; returns each filled span of text.

    A template is a list of strings (kept) and ints (that many tokens to
    generate), e.g. ['To be, or ', 12, ' that is the question']. Positions
    after the template are generated too (the network sees a full row),
    but only the template's span is returned.

    Args:
      templates: one template, or a list of them (one text each).
    """
    if templates and isinstance(templates[0], (str, int)):
      templates = [templates]
    if not templates:
      raise ValueError('infill(): give at least one template.')
    if self.process.causal:
      raise ValueError('infill needs a diffusion run; this run is AR.')
    for t in templates:
      if not any(isinstance(p, int) and p > 0 for p in t):
        raise ValueError(
          f'template {list(t)!r} has no blank: put an int (tokens to fill) '
          'between its strings.'
        )
    cfg = self._sample_config(sampler, steps, sample_options)
    built = self._sampler(cfg)
    rows = self._prompt_rows(templates)
    tokens = self._draw(cfg, built, len(templates), seed, rows)
    spans = [
      sum(p if isinstance(p, int) else len(self.tokenizer.encode(p)) for p in t)
      for t in templates
    ]
    return [
      self.tokenizer.decode(row[:span]) for row, span in zip(tokens, spans)
    ]


def load(workdir: str, *, use_ema: bool | None = None, config=None) -> Model:
  """The run saved in `workdir`, parameters only, ready for text.

  Args:
    workdir: a run directory (config.json, tokenizer/, checkpoints/):
      local or any `etils.epath` URI (gs://bucket/run).
    use_ema: evaluate with the EMA parameters (default: the run's
      eval.use_ema); ignored when the run kept no EMA.
    config: the run's config with command-line overrides (default: its
      config.json as saved).
  """
  from ddlm_jax.tasks.language_model import load_config

  workdir = os.fspath(workdir)
  config = load_config(workdir) if config is None else config
  kind = config.get('kind', 'lm')
  if kind != 'lm':
    raise ConfigError(
      f'{workdir} is a {kind!r} run; ddlm_jax.load reads language-model '
      'runs (evaluate this one with python -m experiments.run --mode=eval).'
    )
  settings = builders.typed_blocks(config)  # This entry point's one.
  tok_dir = paths.join(workdir, 'tokenizer')
  if not paths.isdir(tok_dir):
    raise FileNotFoundError(
      f'{tok_dir} not found: {workdir} is not a complete run directory.'
    )
  tokenizer = tok_lib.load_tokenizer(tok_dir)
  soft_mask = config.get('soft_mask')
  process = builders.make_process(
    settings.process, tokenizer.vocab_size, soft_mask
  )
  graphdef, abstract = split_model(
    builders.model_builder(config.model, process, soft_mask)
  )
  ema = bool(config.eval.use_ema) if use_ema is None else bool(use_ema)
  params, step, which = restore_params(
    workdir, nnx.to_pure_dict(abstract), use_ema=ema
  )
  model = Model(workdir, config, tokenizer, process, graphdef, params, settings)
  model.step, model.params_kind = step, which
  return model


__all__ = ['Model', 'Score', 'load', 'restore_params']
