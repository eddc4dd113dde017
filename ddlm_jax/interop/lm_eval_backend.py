"""An lm-evaluation-harness model for any ddlm_jax run: `--model ddlm_jax`.

    python -m ddlm_jax.interop.lm_eval_backend --model ddlm_jax \\
      --model_args workdir=runs/quickstart,samples=64 --tasks lambada_openai

(the module registers the model in lm-eval's registry, then runs lm-eval's
own command line; from Python, import this module and call
`lm_eval.simple_evaluate(model='ddlm_jax', ...)`). lm-eval is an optional
dependency (`pip install -e .[eval]`); nothing else in the library imports
this module.

What each request computes:

* `loglikelihood(context, continuation)`: diffusion runs give the
  conditional bound on -log p(continuation | context): the context is
  never masked, only the continuation is in the loss, and the rest of the
  row stays masked (marginalised). It is a Monte-Carlo estimate
  (`samples` draws, `estimator` from `evaluation.estimators`, default
  'counts' where it applies) with a standard error kept in
  `last_stderrs`. AR runs give the exact sum of log-probabilities.
  `is_greedy` is whether the argmax of one call with the whole
  continuation hidden (AR: teacher-forced) reproduces it.
* `loglikelihood_rolling(text)`: the full bound of the text over rows of
  the model's length, framed as the run was trained, as
  `ddlm_jax.load(...).score` and the zero-shot suite compute it. (With
  'counts' the padding after a text's last row stays masked, where the
  suite masks it at random like the text: the same bound on whole rows.)
* `generate_until(context, gen_kwargs)`: the run's samplers by spec string
  (`sampler=remdm:eta=0.02`, `steps=64`), each prompt kept at the start of
  its row; the text is cut at the first stop string or EOS and at
  `max_gen_toks` tokens. AR runs decode greedily.

Every answer is cached in an SQLite file keyed by the request and
everything that changes it (run, checkpoint step, parameters, samples,
estimator, seed, sampler), so a rerun recomputes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sqlite3
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

try:
  import lm_eval.models  # noqa: F401  (registers the built-in models first)
  from lm_eval.api.model import LM
  from lm_eval.api.registry import register_model
except ImportError as err:  # pragma: no cover - depends on the extra.
  raise ImportError(
    'ddlm_jax.interop.lm_eval_backend needs lm-evaluation-harness: '
    "pip install -e '.[eval]' (lm-eval==0.4.13)."
  ) from err
from tqdm import tqdm

from ddlm_jax import api
from ddlm_jax.evaluation import estimators as est
from ddlm_jax.training.config import ConfigError

CHUNK_BATCHES = 64


def _as_bool(value) -> bool:
  if isinstance(value, str):
    return value.strip().lower() in ('1', 'true', 'yes')
  return bool(value)


class ResultCache:
  """Answers on disk, keyed by sha256 of (method, fingerprint, request)."""

  def __init__(self, path: str | None):
    self.path = path
    self.hits = 0
    self._db = None
    if path:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      self._db = sqlite3.connect(path)
      self._db.execute(
        'CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT)'
      )

  @staticmethod
  def key(method: str, fingerprint: dict, request) -> str:
    blob = json.dumps([method, fingerprint, request], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()

  def get(self, key: str):
    if self._db is None:
      return None
    row = self._db.execute(
      'SELECT value FROM answers WHERE key = ?', (key,)
    ).fetchone()
    if row is None:
      return None
    self.hits += 1
    return json.loads(row[0])

  def put_many(self, items: dict[str, object]) -> None:
    if self._db is None or not items:
      return
    self._db.executemany(
      'INSERT OR REPLACE INTO answers VALUES (?, ?)',
      [(k, json.dumps(v)) for k, v in items.items()],
    )
    self._db.commit()


class DdlmJaxLM(LM):
  """lm-eval's view of a ddlm_jax run (see the module docstring).

  Args (the `--model_args` keys):
    workdir: the run directory (`pretrained` is an alias), a trained run
      or a converted checkpoint (`python -m experiments.convert`).
    samples: Monte-Carlo draws per diffusion likelihood (default 64).
    estimator: 'auto' (default: 'counts' for a time-free continuous-time
      masked run, else 'stratified' for masked runs, else 'iid') or one of
      `evaluation.estimators.ESTIMATORS`.
    seed: the likelihood and sampling seed.
    batch_size: rows per network call (default: the run's
      eval.batch_size).
    sampler, steps: generation sampler spec and steps (default: the run's
      sample block).
    use_ema: evaluate the EMA parameters (default: the run's eval.use_ema).
    cache: keep answers on disk (default True); cache_path: the file
      (default: <workdir>/lm_eval_cache.sqlite).
  """

  def __init__(
    self,
    workdir: str | None = None,
    pretrained: str | None = None,
    samples: int = 64,
    estimator: str = 'auto',
    seed: int = 0,
    batch_size=None,
    sampler: str | None = None,
    steps: int | None = None,
    use_ema=None,
    cache=True,
    cache_path: str | None = None,
    max_batch_size=None,
    device=None,
  ):
    super().__init__()
    del max_batch_size, device  # Placement follows JAX's default devices.
    workdir = workdir or pretrained
    if not workdir:
      raise ConfigError(
        'ddlm_jax needs a run: --model_args workdir=PATH (a run directory).'
      )
    self.model = api.load(
      str(workdir), use_ema=None if use_ema is None else _as_bool(use_ema)
    )
    self.process = self.model.process.evaluation_process
    self.samples = int(samples)
    self.estimator = self._pick_estimator(str(estimator))
    if not self.causal:
      est.check_estimator(self.estimator, self.samples)
    self.seed = int(seed)
    if batch_size in (None, '', 'auto') or str(batch_size).startswith('auto'):
      batch_size = self.model.config.eval.batch_size
    self.batch_size = int(batch_size)
    if self.batch_size < 1:
      raise ConfigError(f'batch_size={batch_size}: use 1 or more rows.')
    self.sampler = sampler
    self.steps = None if steps is None else int(steps)
    path = None
    if _as_bool(cache):
      path = cache_path or os.path.join(
        self.model.workdir, 'lm_eval_cache.sqlite'
      )
    self.cache = ResultCache(path)
    self.last_stderrs: list[float] = []  # Of the last loglikelihood call.
    self._net = dict(graphdef=self.model.graphdef)
    self._built = None  # The run's sampler, built on first use.
    self._sample_fns: dict[int, Callable] = {}

  @classmethod
  def create_from_arg_obj(cls, arg_dict, additional_config=None):
    """As lm-eval's, but a key given in --model_args (batch_size) wins over
    the command line's default instead of clashing with it."""
    args = dict(arg_dict)
    for key, value in (additional_config or {}).items():
      if value is not None and key not in args:
        args[key] = value
    return cls(**args)

  @classmethod
  def create_from_arg_string(cls, arg_string, additional_config=None):
    """`create_from_arg_obj` of the parsed 'key=value,...' string."""
    from lm_eval.utils import simple_parse_args_string

    return cls.create_from_arg_obj(
      simple_parse_args_string(arg_string), additional_config
    )

  # ------------------------------------------------------------ settings

  @property
  def causal(self) -> bool:
    return bool(self.process.causal)

  @property
  def seq_len(self) -> int:
    return self.model.seq_len

  def _pick_estimator(self, estimator: str) -> str:
    if self.process.causal:
      return 'exact'
    masked = est.supports_estimators(self.process)
    time_free = not self.model.config.model.get('time_conditioning', False)
    if estimator == 'auto':
      if masked and time_free and not self.process.num_steps:
        return 'counts'
      return 'stratified' if masked else 'iid'
    if estimator != 'iid' and not masked:
      raise ConfigError(
        f'estimator={estimator!r} steers masked diffusion draws; this run is '
        f'{type(self.process).__name__}: use estimator=iid.'
      )
    if estimator == 'counts' and not time_free:
      raise ConfigError(
        "estimator='counts' integrates t out, so the network must not read "
        't; this run is time-conditioned: use estimator=stratified.'
      )
    return estimator

  def fingerprint(self) -> dict:
    """Everything besides the request that changes an answer."""
    return {
      'workdir': os.path.abspath(self.model.workdir),
      'step': int(self.model.step),
      'params': self.model.params_kind,
      'samples': self.samples,
      'estimator': self.estimator,
      'seed': self.seed,
      'sampler': self.sampler,
      'steps': self.steps,
    }

  def _cached(
    self, method: str, requests: list, compute: Callable, disable: bool
  ):
    """Answers of `requests` (hashable args), computing only the misses."""
    fp = self.fingerprint()
    keys = [ResultCache.key(method, fp, list(r)) for r in requests]
    out = [self.cache.get(k) for k in keys]
    todo = [i for i, v in enumerate(out) if v is None]
    # Written every CHUNK_BATCHES batches: an interrupted run resumes.
    chunk = CHUNK_BATCHES * self.batch_size
    for lo in range(0, len(todo), chunk):
      part = todo[lo : lo + chunk]
      fresh = compute([requests[i] for i in part], disable)
      for i, value in zip(part, fresh):
        out[i] = value
      self.cache.put_many({keys[i]: out[i] for i in part})
    return out

  # -------------------------------------------------------------- rows

  def _encode(self, text: str) -> list[int]:
    return [int(i) for i in self.model.tokenizer.encode(text)]

  def _pair_row(self, context: str, continuation: str):
    """(x_L, keep_L, loss_L) of one request: [bos] context continuation,
    the context cut from the left to fit the row."""
    # A context's trailing spaces belong to the continuation (lm-eval's
    # convention for tokenizers that merge a space into the next word).
    stripped = context.rstrip(' ')
    continuation = context[len(stripped) :] + continuation
    bos, _, pad = self.model._framing()
    head = [] if bos is None else [bos]
    cont = self._encode(continuation)
    room = self.seq_len - len(head) - len(cont)
    if not cont:
      raise ValueError('loglikelihood: the continuation is empty.')
    if room < 0:
      raise ValueError(
        f'a continuation of {len(cont)} tokens does not fit a row of '
        f'data.seq_len={self.seq_len}; use a run with longer rows.'
      )
    ctx = self._encode(stripped)
    ctx = ctx[len(ctx) - room :] if room else []
    ids = head + ctx + cont
    x_L = np.full(self.seq_len, pad, np.int32)
    x_L[: len(ids)] = ids
    keep_L = np.zeros(self.seq_len, np.float32)
    keep_L[: len(head) + len(ctx)] = 1.0
    loss_L = np.zeros(self.seq_len, np.float32)
    loss_L[len(head) + len(ctx) : len(ids)] = 1.0
    return x_L, keep_L, loss_L

  def _batches(self, n: int, disable: bool, desc: str):
    starts = range(0, n, self.batch_size)
    return tqdm(starts, desc=desc, disable=disable, leave=False)

  def _pad(self, *arrays):
    """Arrays padded to batch_size rows with copies of row 0."""
    n = len(arrays[0])
    if n == self.batch_size:
      return arrays
    return tuple(
      np.concatenate([a, np.repeat(a[:1], self.batch_size - n, 0)])
      for a in arrays
    )

  # ------------------------------------------------------ likelihoods

  def _score_rows(self, x_BxL, loss_BxL, keep_BxL=None):
    """(mean_B, stderr_B) nats of rows (the bound, or exact NLL)."""
    if self.causal:
      return _causal_nll(
        self.model.params, x_BxL, loss_BxL, process=self.process, **self._net
      )
    draws_SxB = est.bound_draws(
      self.model.params,
      jax.random.key(self.seed),
      x_BxL,
      loss_BxL,
      keep_BxL,
      graphdef=self.model.graphdef,
      process=self.process,
      samples=self.samples,
      estimator=self.estimator,
    )
    return est.mean_and_stderr(np.asarray(draws_SxB), self.estimator)

  def _greedy(self, x_BxL, keep_BxL, loss_BxL) -> np.ndarray:
    if self.causal:
      logits_BxLxV = _causal_logits(
        self.model.params, x_BxL, process=self.process, **self._net
      )
    else:
      z_BxL = np.where(keep_BxL > 0, x_BxL, self.process.generate_id)
      logits_BxLxV = _hidden_logits(self.model.params, z_BxL, **self._net)
    best_BxL = np.asarray(jnp.argmax(logits_BxLxV, -1))
    return np.all((best_BxL == x_BxL) | (loss_BxL <= 0), axis=-1)

  def _loglikelihood_pairs(self, pairs, disable):
    rows = [self._pair_row(c, t) for c, t in pairs]
    out = []
    for start in self._batches(len(rows), disable, 'ddlm_jax loglikelihood'):
      chunk = rows[start : start + self.batch_size]
      x, keep, loss = (np.stack(a) for a in zip(*chunk))
      n = len(x)
      x, keep, loss = self._pad(x, keep, loss)
      mean_B, stderr_B = self._score_rows(x, loss, keep)
      greedy_B = self._greedy(x, keep, loss)
      for b in range(n):
        out.append([-float(mean_B[b]), float(stderr_B[b]), bool(greedy_B[b])])
    return out

  def loglikelihood_with_stderr(
    self, pairs: Sequence[tuple[str, str]], disable_tqdm: bool = False
  ) -> list[tuple[float, float, bool]]:
    """(log-likelihood estimate, its standard error, is_greedy) per pair."""
    answers = self._cached(
      'loglikelihood',
      [tuple(p) for p in pairs],
      self._loglikelihood_pairs,
      disable_tqdm,
    )
    return [(a[0], a[1], a[2]) for a in answers]

  def loglikelihood(self, requests, disable_tqdm: bool = False):
    answers = self.loglikelihood_with_stderr(
      [r.args for r in requests], disable_tqdm
    )
    self.last_stderrs = [a[1] for a in answers]
    return [(a[0], a[2]) for a in answers]

  def _rolling_texts(self, texts, disable):
    per_text = [self.model._rows(np.asarray(self._encode(t[0]))) for t in texts]
    owner = np.concatenate(
      [np.full(len(r), i) for i, (r, _) in enumerate(per_text)]
    )
    rows = np.concatenate([r for r, _ in per_text])
    masks = np.concatenate([m for _, m in per_text])
    mean_R = np.zeros(len(rows))
    var_R = np.zeros(len(rows))
    for start in self._batches(len(rows), disable, 'ddlm_jax rolling'):
      x, m = (
        rows[start : start + self.batch_size],
        masks[start : start + self.batch_size],
      )
      n = len(x)
      x, m = self._pad(x, m)
      mean_B, stderr_B = self._score_rows(x, m)
      mean_R[start : start + n] = np.asarray(mean_B)[:n]
      var_R[start : start + n] = np.asarray(stderr_B)[:n] ** 2
    return [
      [-float(mean_R[owner == i].sum()), math.sqrt(var_R[owner == i].sum())]
      for i in range(len(texts))
    ]

  def loglikelihood_rolling_with_stderr(
    self, texts: Sequence[str], disable_tqdm: bool = False
  ) -> list[tuple[float, float]]:
    """(log-likelihood bound, its standard error) of each whole text."""
    answers = self._cached(
      'loglikelihood_rolling',
      [(t,) for t in texts],
      self._rolling_texts,
      disable_tqdm,
    )
    return [(a[0], a[1]) for a in answers]

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
    answers = self.loglikelihood_rolling_with_stderr(
      [r.args[0] for r in requests], disable_tqdm
    )
    return [a[0] for a in answers]

  # -------------------------------------------------------- generation

  def _prompt_ids(self, context: str, max_gen: int) -> list[int]:
    bos, _, _ = self.model._framing()
    head = [] if bos is None else [bos]
    ids = self._encode(context)
    room = max(1, self.seq_len - len(head) - min(max_gen, self.seq_len // 2))
    return head + ids[max(0, len(ids) - room) :]

  def _generate(self, requests, disable):
    out = []
    specials = getattr(self.model.tokenizer, 'special_ids', None)
    eos = None if specials is None else specials.eos
    for start in self._batches(len(requests), disable, 'ddlm_jax generate'):
      chunk = requests[start : start + self.batch_size]
      kwargs = [json.loads(k) for _, k in chunk]
      max_gen = [int(k.get('max_gen_toks', self.seq_len)) for k in kwargs]
      prompts = [self._prompt_ids(c, g) for (c, _), g in zip(chunk, max_gen)]
      rows = np.full((len(chunk), self.seq_len), -1, np.int32)
      for i, p in enumerate(prompts):
        rows[i, : len(p)] = p
      tokens = self._fill_rows(rows, start)
      for i, (p, g, k) in enumerate(zip(prompts, max_gen, kwargs)):
        new = [int(t) for t in tokens[i, len(p) : len(p) + g]]
        if eos is not None and eos in new:
          new = new[: new.index(eos)]
        new = [t for t in new if t < self.process.vocab_size]
        text = self.model.tokenizer.decode(new)
        out.append(cut_at_stops(text, k.get('until')))
    return out

  def _fill_rows(self, rows_BxL: np.ndarray, offset: int) -> np.ndarray:
    """Rows with their -1 entries generated (prompts kept)."""
    if self.causal:
      return _greedy_decode(
        self.model.params, rows_BxL, process=self.process, **self._net
      )
    rows = np.where(rows_BxL < 0, self.process.generate_id, rows_BxL)
    cfg = self.model._sample_config(self.sampler, self.steps, {})
    if self._built is None:
      self._built = self.model._sampler(cfg)
    if self._built.num_models != 1:  # A light network: the run's own path.
      return np.asarray(
        self.model._draw(cfg, self._built, len(rows), self.seed + offset, rows)
      )
    # One compiled shape for every batch: the last one padded with copies.
    n = len(rows)
    rows = np.concatenate([rows, np.repeat(rows[:1], self.batch_size - n, 0)])
    tokens_BxL = self._sample_fn(len(rows))(
      self.model.params, jax.random.key(self.seed + offset), jnp.asarray(rows)
    )
    return np.asarray(tokens_BxL)[:n]

  def _sample_fn(self, batch: int) -> Callable:
    """The sampler compiled once per batch size with the prompt rows as an
    argument (`Model.generate` compiles each prompt in, which costs a
    compile per batch of requests)."""
    if batch not in self._sample_fns:
      built, graphdef = self._built, self.model.graphdef
      process, length = self.model.process, self.seq_len

      def sample(params, key, prompt_BxL):
        apply = nnx.merge(graphdef, params)
        return built(
          apply, key, process, batch=batch, length=length, prompt_BxL=prompt_BxL
        )[0]

      self._sample_fns[batch] = jax.jit(sample)
    return self._sample_fns[batch]

  def generate_until(self, requests, disable_tqdm: bool = False):
    items = [
      (r.args[0], json.dumps(dict(r.args[1]), sort_keys=True, default=str))
      for r in requests
    ]
    return self._cached('generate_until', items, self._generate, disable_tqdm)


if __name__ != '__main__':  # Run as a script, main() imports the module.
  register_model('ddlm_jax')(DdlmJaxLM)


def cut_at_stops(text: str, until) -> str:
  """`text` up to the first of the stop strings `until` (str or list)."""
  if until is None:
    return text
  stops = [until] if isinstance(until, str) else list(until)
  cut = len(text)
  for stop in stops:
    if stop:
      at = text.find(stop)
      if at >= 0:
        cut = min(cut, at)
  return text[:cut]


# ---------------------------------------------------- network calls --


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _hidden_logits(params, z_BxL, *, graphdef):
  """Logits at z (t = 1): the greedy guess of every hidden position."""
  apply = nnx.merge(graphdef, params)
  return apply(z_BxL, jnp.ones((z_BxL.shape[0],), jnp.float32))


@functools.partial(jax.jit, static_argnames=('graphdef', 'process'))
def _causal_logits(params, x_BxL, *, graphdef, process):
  """Teacher-forced logits: position l predicts x_l from x_<l."""
  apply = nnx.merge(graphdef, params)
  t_B = jnp.zeros((x_BxL.shape[0],), jnp.float32)
  return apply(process.shift_right(x_BxL), t_B)


def _causal_nll(params, x_BxL, loss_BxL, *, graphdef, process):
  """(nll_B, zeros_B): the exact -log p of the scored positions."""
  logits_BxLxV = _causal_logits(
    params, jnp.asarray(x_BxL), graphdef=graphdef, process=process
  )
  logp_BxLxV = np.asarray(
    jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), -1), np.float64
  )
  picked_BxL = np.take_along_axis(logp_BxLxV, x_BxL[..., None], -1)[..., 0]
  nll_B = -(picked_BxL * loss_BxL).sum(-1)
  return nll_B, np.zeros_like(nll_B)


def _greedy_decode(params, rows_BxL, *, graphdef, process):
  """Rows whose -1 entries are filled left to right by the argmax."""
  rows = np.where(rows_BxL < 0, 0, rows_BxL).astype(np.int32)
  todo_BxL = rows_BxL < 0
  if not todo_BxL.any():
    return rows
  first = int(np.argmax(todo_BxL.any(0)))
  for pos in range(first, rows.shape[1]):
    if not todo_BxL[:, pos].any():
      continue
    logits_BxLxV = _causal_logits(
      params, jnp.asarray(rows), graphdef=graphdef, process=process
    )
    best_B = np.asarray(jnp.argmax(logits_BxLxV[:, pos], -1))
    rows[:, pos] = np.where(todo_BxL[:, pos], best_B, rows[:, pos])
  return rows


def main() -> None:
  """lm-eval's command line with the ddlm_jax model registered."""
  from lm_eval.__main__ import cli_evaluate

  cli_evaluate()


if __name__ == '__main__':
  # Through the module's own name, so the registered class is the one
  # `import ddlm_jax.interop.lm_eval_backend` gives.
  import importlib

  importlib.import_module('ddlm_jax.interop.lm_eval_backend').main()


__all__ = ['DdlmJaxLM', 'ResultCache', 'cut_at_stops', 'main']
