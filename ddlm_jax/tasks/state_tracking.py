"""The state-tracking benchmark (PD-SSM paper, Table 2) as a loop task.

``train_state_tracking(config, workdir)`` trains a ``SequenceClassifier`` on
one task of ``ddlm_jax.data.state_tracking`` (the benchmark's ``TASKS`` or
the diagnostic ``GROUP_TASKS`` such as 's3') through the one loop
(``training.fit``): AdamW (warmup then cosine),
periodic validation at long lengths and a final TEST accuracy at test
lengths. The workdir gets
config.json, metrics.jsonl, summary.json and orbax checkpoints; a restarted
run resumes from the newest checkpoint and replays the data stream to the
same position, so it continues exactly where it stopped.

Loss positions (``task.loss_on``): 'last' (default) is the benchmark's
loss on the last real token; 'prefix' (group tasks only) makes every real
position t predict the product of the prefix x_1..x_t, the per-token
supervision of the Merrill et al. / Walker et al. A5 data, averaged over
real positions (micro-batches weighted by their real tokens). The logged
train 'acc' stays the last-token accuracy either way, so tables compare;
'prefix' adds 'prefix_acc'. Model options ``model.init`` and
``model.magnitude_init`` ('' / 0 = the mixer's default) reach the SSM
mixers through ``classifier_config``.

Group diagnostic: for a PD-SSM ('pdssm', 'pdssm_paper') on a group task,
every validation record also carries ``bijective_frac``,
``homomorphism_frac``, ``orbit_size``, ``distinct_maps`` and
``distinct_elements`` of the first layer's hardened token maps on the orbit
of h_0, the same on the best closed block of states (``block_*``;
``ddlm_jax.evaluation.group_maps``), and ``faithful_relations`` (the
block's relation fraction where its element maps are |G| distinct, else
0), so a run that is building a permutation representation can be told
from one that is not.

Model selection: the task's after-eval hook keeps the parameters with the
best validation accuracy in state.extra (validation uses the test lengths
on a separate stream), and the summary reports test accuracy of those
(``test_accuracy``) and of the final parameters (``test_accuracy_final``).

Restarts (``train.restarts`` R > 1): R initialisations train side by side
on the same batches (``training.restarts``). Each validation scores every
replica and keeps the best by validation accuracy, then by
``faithful_relations``: among replicas that fit the validation words, the
one that represents the group. Early stopping then
also needs that replica's faithful_relations at 1, since a bijective
automaton that is not a group action can reach 100% at validation lengths
and still drift at longer ones.

A step whose loss or gradients are not finite leaves the state unchanged and
is recorded; the run then stops, names the step and reports status 'nan'.
"""

from __future__ import annotations

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.evaluation import group_maps
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm
from ddlm_jax.training import config as config_lib
from ddlm_jax.training import metrics
from ddlm_jax.training import restarts as restarts_lib
from ddlm_jax.training.config import ConfigError, TrainerConfig, check_range
from ddlm_jax.training.fit import (
  FAST_COMPILE,
  Display,
  FitResult,
  Task,
  finish,
  fit,
  restore_newest,
)
from ddlm_jax.training.steps import batch_size_weight

# task.loss_on: the positions the loss reads.
LOSS_ON = ('last', 'prefix')
# Every task name a config may use: the benchmark's and the diagnostic ones.
ALL_TASKS = {**st.TASKS, **st.GROUP_TASKS}
# Mixers built from ssm.SSMMixer, which take model.init / magnitude_init.
_SSM_MIXERS = (*ssm.MODES, 'pdssm_paper')
# Mixers whose transition has a learned magnitude |D| (magnitude_init).
_MAGNITUDE_MIXERS = ('pdssm', 'complex_diag', 'pdssm_paper')
# Mixers with a PD-SSM dictionary (model.dict_init, model.relax).
_PDSSM_MIXERS = ('pdssm', 'pdssm_paper')


def loss_on(config) -> str:
  """config.task.loss_on, checked ('last' for configs saved without it)."""
  value = config.task.get('loss_on', 'last')
  if value not in LOSS_ON:
    raise ConfigError(
      f'task.loss_on={value!r}: choose one of {LOSS_ON} (set '
      '--config.task.loss_on).'
    )
  if value == 'prefix' and st.task_spec(config.task.name).group is None:
    raise ConfigError(
      f"task.loss_on='prefix' needs a group task (a prefix label is "
      f'defined only for {sorted(n for n, s in ALL_TASKS.items() if s.group)}'
      f"); task.name={config.task.name!r}: use task.loss_on='last'."
    )
  return value


def _unit_init(value, key: str, meaning: str) -> None:
  """model.KEY is 0 (the default init) or a number in (0, 1)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ConfigError(f'model.{key}={value!r}: must be a number.')
  if value and not 0.0 < value < 1.0:
    raise ConfigError(
      f'model.{key}={value!r}: must be 0 (the default init) or in (0, 1), '
      f'{meaning}.'
    )


def _init_scale(m, key, mixers, which, *, zero_ok, meaning) -> float:
  """model.KEY (default 1): a number (>= 0 or > 0), only for `mixers`."""
  value = m.get(key, 1.0)
  bad = isinstance(value, bool) or not isinstance(value, (int, float))
  if bad or value < 0 or (value == 0 and not zero_ok):
    bound = '>= 0' if zero_ok else '> 0'
    raise ConfigError(
      f'model.{key}={value!r}: must be a number {bound} (1: {meaning}).'
    )
  if value != 1.0 and m.mixer not in mixers:
    raise ConfigError(
      f'model.{key}={value!r} applies to {which} {mixers}, not '
      f'model.mixer={m.mixer!r}; set it to 1.'
    )
  return value


def _model_options(m) -> dict:
  """Checked SSMMixer options (model.init, magnitude_init, dict_init).

  '' / 0 leave the mixer's own default (for 'pdssm_paper': the authors'
  init), so configs saved without the keys build the same model.
  """
  init = m.get('init', '')
  mag = m.get('magnitude_init', 0.0)
  if init and init not in ssm.INITS:
    raise ConfigError(
      f"model.init={init!r}: choose '' (the mixer's default) or one of "
      f'{ssm.INITS}.'
    )
  _unit_init(mag, 'magnitude_init', 'the initial |D_t|')
  if init and m.mixer not in _SSM_MIXERS:
    raise ConfigError(
      f'model.init={init!r} applies to the SSM mixers {_SSM_MIXERS}, not '
      f"model.mixer={m.mixer!r}; set model.init=''."
    )
  if mag and m.mixer not in _MAGNITUDE_MIXERS:
    raise ConfigError(
      f'model.magnitude_init={mag!r} applies to the mixers '
      f'{_MAGNITUDE_MIXERS} (a learned |D|), not model.mixer={m.mixer!r}; '
      'set model.magnitude_init=0.'
    )
  phase = m.get('phase_init', 0.0)
  _unit_init(phase, 'phase_init', 'the initial phase of D_t in turns')
  if phase and m.mixer not in _MAGNITUDE_MIXERS:
    raise ConfigError(
      f'model.phase_init={phase!r} applies to the mixers '
      f'{_MAGNITUDE_MIXERS} (a complex D_t), not model.mixer={m.mixer!r}; '
      'set model.phase_init=0.'
    )
  in_scale = _init_scale(
    m, 'input_init_scale', _MAGNITUDE_MIXERS, 'the mixers', zero_ok=True,
    meaning='the default init of B',
  )  # fmt: skip
  dict_init = m.get('dict_init', '')
  if dict_init and dict_init not in ssm.DICT_INITS:
    raise ConfigError(
      f"model.dict_init={dict_init!r}: choose '' (the default) or one of "
      f'{ssm.DICT_INITS}.'
    )
  if dict_init and m.mixer not in _PDSSM_MIXERS:
    raise ConfigError(
      f'model.dict_init={dict_init!r} applies to the PD-SSM mixers '
      f"{_PDSSM_MIXERS}, not model.mixer={m.mixer!r}; set model.dict_init=''."
    )
  if dict_init == 'permutation' and m.num_dict > m.state_size:
    raise ConfigError(
      f"model.dict_init='permutation' needs model.num_dict <= "
      f'model.state_size, got {m.num_dict} > {m.state_size}; lower num_dict.'
    )
  dict_scale = _init_scale(
    m, 'dict_init_scale', _PDSSM_MIXERS, 'the PD-SSM mixers', zero_ok=False,
    meaning='the init of the PD-SSM dictionary unscaled',
  )  # fmt: skip
  out = {}
  if dict_scale != 1.0:
    out['dict_init_scale'] = float(dict_scale)
  if init:
    out['init'] = init
  if dict_init:
    out['dict_init'] = dict_init
  if mag:
    out['magnitude_init'] = float(mag)
  if phase:
    out['phase_init'] = float(phase)
  if in_scale != 1.0:
    out['input_init_scale'] = float(in_scale)
  if _check_relax(m) and m.get('relax_harden', False):
    out['harden_temperature'] = float(tuple(m.relax_temperature)[1])
  if _check_relax(m) and m.get('relax_normalize', False):
    out['relax_normalize'] = True
  harden = m.get('harden', 'argmax')
  if harden not in ssm.HARDENINGS:
    raise ConfigError(
      f'model.harden={harden!r}: choose one of {ssm.HARDENINGS}.'
    )
  if harden != 'argmax':
    if not _check_relax(m):
      raise ConfigError(
        f'model.harden={harden!r} hardens a Sinkhorn relaxation; set '
        "model.relax='sinkhorn' (or model.harden='argmax')."
      )
    out['harden'] = harden
  return out


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
  extra.update(_model_options(m))
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


RELAXATIONS = ('sinkhorn',)


def relax_temperature(config, step: int) -> float:
  """Sinkhorn temperature at ``step``: geometric from T0 to T1 over the
  first ``relax_anneal_fraction`` of training, then T1."""
  m = config.model
  t0, t1 = (float(v) for v in m.relax_temperature)
  span = max(1.0, m.relax_anneal_fraction * config.train.num_steps)
  return t0 * (t1 / t0) ** min(1.0, step / span)


def relax_hard(config, step: int) -> bool:
  """Whether the training forward at ``step`` is the hardmax layer (with
  the relaxation's straight-through gradient): from relax_hard_from of
  the steps on; never with the default 1."""
  frac = float(config.model.get('relax_hard_from', 1.0))
  return frac < 1 and step >= frac * config.train.num_steps


def relax_noise(config, step: int) -> float:
  """Gumbel noise scale of the relaxed forward at ``step``:
  model.relax_noise at step 0, falling linearly to 0 at the end of the
  temperature anneal (relax_anneal_fraction of the steps), so the late
  steps train the noiseless relaxation that hardens into the evaluated
  layer."""
  m = config.model
  sigma = float(m.get('relax_noise', 0.0))
  span = max(1.0, m.relax_anneal_fraction * config.train.num_steps)
  return sigma * max(0.0, 1.0 - step / span)


def relax_entropy_weight(config) -> float:
  """model.relax_entropy_weight (0 without a relaxation), checked."""
  m = config.model
  w = m.get('relax_entropy_weight', 0.0)
  if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
    raise ConfigError(
      f'model.relax_entropy_weight={w!r}: must be a number >= 0 (0: off).'
    )
  return float(w) if _check_relax(m) else 0.0


def relax_phase_weight(config) -> float:
  """model.phase_penalty_weight (0 without a relaxation), checked."""
  m = config.model
  w = m.get('phase_penalty_weight', 0.0)
  if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
    raise ConfigError(
      f'model.phase_penalty_weight={w!r}: must be a number >= 0 (0: off).'
    )
  if w and not _check_relax(m):
    raise ConfigError(
      f'model.phase_penalty_weight={w!r} needs model.relax (the relaxed '
      "forward reports the phases); set model.relax='sinkhorn' or the "
      'weight to 0.'
    )
  return float(w)


def _check_relax(m) -> str:
  """model.relax ('' or 'sinkhorn') and its schedule, checked."""
  relax = m.get('relax', '')
  if not relax and m.get('relax_noise', 0.0):
    raise ConfigError(
      f'model.relax_noise={m.relax_noise!r} needs model.relax (the noise is '
      "added to the relaxation); set model.relax='sinkhorn' or "
      'model.relax_noise=0.'
    )
  if not relax:
    return ''
  if relax not in RELAXATIONS:
    raise ConfigError(
      f"model.relax={relax!r}: choose '' (off) or one of {RELAXATIONS}."
    )
  if m.mixer not in _PDSSM_MIXERS:
    raise ConfigError(
      f'model.relax={relax!r} applies to the PD-SSM mixers {_PDSSM_MIXERS}, '
      f"not model.mixer={m.mixer!r}; set model.relax=''."
    )
  temps = tuple(m.relax_temperature)
  if len(temps) != 2 or not 0 < temps[1] <= temps[0]:
    raise ConfigError(
      f'model.relax_temperature={temps!r}: need (T0, T1) with 0 < T1 <= T0.'
    )
  noise = m.get('relax_noise', 0.0)
  if isinstance(noise, bool) or not isinstance(noise, (int, float)):
    raise ConfigError(
      f'model.relax_noise={noise!r}: must be a number >= 0 (0: off).'
    )
  if noise < 0:
    raise ConfigError(
      f'model.relax_noise={noise!r}: must be >= 0 (the scale of the Gumbel '
      'noise of the relaxed forward; 0: off).'
    )
  hard_from = m.get('relax_hard_from', 1.0)
  if isinstance(hard_from, bool) or not isinstance(hard_from, (int, float)):
    raise ConfigError(
      f'model.relax_hard_from={hard_from!r}: must be a number in [0, 1].'
    )
  if not 0 <= hard_from <= 1:
    raise ConfigError(
      f'model.relax_hard_from={hard_from!r}: must be in [0, 1] (the '
      'fraction of training after which the forward is the hardmax layer; '
      '1: never).'
    )
  if not 0 < m.relax_anneal_fraction <= 1:
    raise ConfigError(
      f'model.relax_anneal_fraction={m.relax_anneal_fraction!r}: must be in '
      '(0, 1].'
    )
  return relax


def _train_batches(config, seed: int, start: int):
  """The train batches from step ``start`` on (a length curriculum starts
  there directly; the other streams replay to it); with model.relax each
  batch carries its step's temperature, 'relax_tau' (one per sequence),
  and 'relax_hard' (1: hardmax forward, straight-through backward)."""
  batches = _word_batches(config, seed, start)
  if not _check_relax(config.model):
    return batches
  size = config.train.batch_size
  noisy = float(config.model.get('relax_noise', 0.0)) > 0

  def with_tau():
    for step, b in enumerate(batches, start):
      tau = relax_temperature(config, step)
      hard = float(relax_hard(config, step))
      out = {
        **b,
        'relax_tau': np.full((size,), tau, np.float32),
        'relax_hard': np.full((size,), hard, np.float32),
      }
      if noisy:
        sigma = relax_noise(config, step)
        out['relax_noise'] = np.full((size,), sigma, np.float32)
      yield out

  return with_tau()


def _word_batches(config, seed: int, start: int):
  ramp = int(config.task.get('curriculum_steps', 0))
  if ramp <= 0:
    return itertools.islice(_train_stream(config, seed), start, None)
  t = config.task
  kw = _task_kwargs(config)
  if loss_on(config) == 'prefix':
    kw['prefix_labels'] = True
  lo, hi = t.train_lengths
  return st.curriculum_batches(
    t.name,
    config.train.batch_size,
    seed=seed,
    ramp_steps=ramp,
    start=start,
    min_len=lo,
    max_len=hi,
    **kw,
  )


def _train_stream(config, seed: int):
  """Endless train batches: fresh samples, or epochs over a fixed set."""
  t = config.task
  lo, hi = t.train_lengths
  batch = config.train.batch_size
  kw = _task_kwargs(config)
  if loss_on(config) == 'prefix':
    kw['prefix_labels'] = True
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
  if t.name not in ALL_TASKS:
    raise ValueError(
      f'config.task.name={t.name!r}; choose one of {sorted(st.TASKS)} or '
      f'the diagnostic group tasks {sorted(st.GROUP_TASKS)}.'
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
  loss_on(config)
  num_restarts(config)
  _model_options(config.model)
  _check_relax(config.model)
  ramp = t.get('curriculum_steps', 0)
  if isinstance(ramp, bool) or not isinstance(ramp, int) or ramp < 0:
    raise ConfigError(
      f'task.curriculum_steps={ramp!r}: must be an integer >= 0 (0: no '
      'length curriculum).'
    )
  if ramp and t.num_train > 0:
    raise ConfigError(
      'task.curriculum_steps needs fresh samples every step; set '
      'task.num_train=0 (or task.curriculum_steps=0).'
    )


def num_restarts(config) -> int:
  """train.restarts (default 1): initialisations trained side by side."""
  value = config.train.get('restarts', 1)
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ConfigError(
      f'train.restarts={value!r}: must be an integer >= 1 (1: one model).'
    )
  return value


def _loss_fn(
  graphdef, on: str, entropy_weight: float = 0.0, phase_weight: float = 0.0
):
  """The task's loss: last-token, or mean over real positions ('prefix')."""

  def loss(params, key, batch):
    model = nnx.merge(graphdef, params)
    if 'relax_tau' in batch:  # Relaxed PD-SSM forward at this temperature.
      for i, block in enumerate(model.blocks):
        block.mixer.relax_temperature = batch['relax_tau'][0]
        if 'relax_hard' in batch:
          block.mixer.relax_hard = batch['relax_hard'][0] > 0.5
        if 'relax_noise' in batch:  # Gumbel-Sinkhorn: fresh noise a step.
          block.mixer.relax_noise = batch['relax_noise'][0]
          block.mixer.relax_key = jax.random.fold_in(key, i)
    if on == 'prefix':
      logits = model.logits_all(batch['tokens'], batch['lengths'])
      value, acc, prefix_acc = sc.prefix_metrics(
        logits, batch['prefix_labels'], batch['lengths'], batch['labels']
      )
      aux = {'acc': acc, 'prefix_acc': prefix_acc}
    else:
      logits = model(batch['tokens'], batch['lengths'])
      value, acc = sc.classification_metrics(logits, batch['labels'])
      aux = {'acc': acc}
    if entropy_weight and 'relax_tau' in batch:
      # Pulls every relaxed P_t towards a permutation (0 entropy).
      ent = sum(block.mixer.relax_entropy for block in model.blocks)
      value = value + entropy_weight * ent
      aux['p_entropy'] = ent
    if phase_weight and 'relax_tau' in batch:
      # Pulls the phases of D_t to 0, so a permutation state read out after
      # 40 steps is read out the same after 256.
      sq = sum(block.mixer.phase_square for block in model.blocks)
      value = value + phase_weight * sq
      aux['phase_sq'] = sq
    return value, aux

  return loss


def _real_positions(batch) -> jax.Array:
  """A micro-batch's weight under the prefix loss: its real positions."""
  return jnp.maximum(batch['lengths'].sum(), 1).astype(jnp.float32)


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
def programs(ccfg: sc.ClassifierConfig, fast_compile: bool):
  """(graphdef, init(key) -> params, jitted eval_step) of a model config.

  Cached on the model config, so seeds of a sweep and restarts in one
  process reuse the compiled evaluation (the loop caches its train step on
  the task's cache_key in the same way).
  """
  build = lambda rngs: sc.SequenceClassifier(ccfg, rngs=rngs)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))

  def init(key):
    return nnx.to_pure_dict(nnx.state(build(nnx.Rngs(params=key))))

  options = FAST_COMPILE if fast_compile else None
  eval_step = jax.jit(make_eval_step(graphdef), compiler_options=options)
  return graphdef, init, eval_step


def trainer_config(config) -> TrainerConfig:
  """The loop settings of a state-tracking config (checked ranges)."""
  tr, o = config.train, config.optim
  num_steps = check_range('train.num_steps', tr.num_steps, lo=1, integer=True)
  return config_lib.trainer_config(
    num_steps=num_steps,
    seed=config.seed,
    log_every=tr.log_every,
    eval_every=tr.eval_every,
    eval_at_end=True,
    checkpoint_every=tr.checkpoint_every,
    max_checkpoints=tr.max_checkpoints,
    halt_after_steps=tr.halt_after_steps,
    ema_decay=float(o.get('ema_decay', 0.0)),
    grad_accum_steps=int(o.get('grad_accum_steps', 1)),
    fast_compile=bool(tr.fast_compile),
    optimizer=config_lib.optimizer_config(
      learning_rate=o.learning_rate,
      warmup_steps=config_lib.warmup_steps(o, num_steps),
      total_steps=num_steps,
      weight_decay=o.weight_decay,
      b1=o.b1,
      b2=o.b2,
      grad_clip=o.grad_clip,
      final_lr_fraction=o.final_lr_fraction,
      replica_axis=num_restarts(config) > 1,
    ),
  )


def best_params(state):
  """The best-validation parameters, or the current ones before any
  validation ran."""
  extra = state.extra
  return (
    extra['best_params']
    if float(extra['best_val_acc']) >= 0
    else (state.params)
  )


def _rank(res: dict) -> tuple[float, float]:
  """A validation result's rank among restarts: (accuracy, faithful
  relations), the second 0 where there is no group diagnostic."""
  return (res['accuracy'], res.get('faithful_relations', 0.0))


def _keep_best_restart(early_stop: float):
  """after_eval with restarts: the best replica's parameters (by ``_rank``)
  in state.extra; early stop once it fits validation and, under the group
  diagnostic, represents the group (faithful_relations 1)."""

  def after_eval(state, res, step):
    extra = state.extra
    best = (float(extra['best_val_acc']), float(extra['best_relations']))
    if _rank(res) > best:
      r = res['restart']
      extra = {
        'best_params': restarts_lib.replica(state.params, r),
        'best_val_acc': jnp.float32(res['accuracy']),
        'best_relations': jnp.float32(_rank(res)[1]),
        'best_step': jnp.int32(step),
        'best_restart': jnp.int32(r),
      }
      state = state.replace(extra=extra)
    print(
      f'step {step}: validation acc {res["accuracy"]:.4f}, faithful '
      f'relations {_rank(res)[1]:.2f} (restart {res["restart"]}; best '
      f'{float(extra["best_val_acc"]):.4f} at {int(extra["best_step"])}, '
      f'restart {int(extra["best_restart"])})',
      flush=True,
    )
    solved = 'faithful_relations' not in res or res['faithful_relations'] >= 1
    return state, 0 < early_stop <= res['accuracy'] and solved

  return after_eval


def _keep_best(early_stop: float):
  """after_eval: best-validation parameters in state.extra; early stop."""

  def after_eval(state, res, step):
    extra = state.extra
    if res['accuracy'] > float(extra['best_val_acc']):
      extra = {
        'best_params': jax.tree.map(jnp.copy, state.params),  # no aliasing
        'best_val_acc': jnp.float32(res['accuracy']),
        'best_step': jnp.int32(step),
      }
      state = state.replace(extra=extra)
    print(
      f'step {step}: validation acc {res["accuracy"]:.4f} (best '
      f'{float(extra["best_val_acc"]):.4f} at {int(extra["best_step"])})',
      flush=True,
    )
    return state, 0 < early_stop <= res['accuracy']

  return after_eval


def _init_extra(params):
  return {
    'best_params': jax.tree.map(jnp.zeros_like, params),
    'best_val_acc': jnp.full((), -1.0, jnp.float32),
    'best_step': jnp.zeros((), jnp.int32),
  }


def _init_extra_restarts(params):
  """state.extra with restarts: one replica's best parameters."""
  return {
    **_init_extra(restarts_lib.replica(params, 0)),
    'best_relations': jnp.full((), -1.0, jnp.float32),
    'best_restart': jnp.zeros((), jnp.int32),
  }


def final_params(state):
  """The final parameters (of the best replica when restarts stack)."""
  if 'best_restart' not in state.extra:
    return state.params
  return restarts_lib.replica(state.params, int(state.extra['best_restart']))


def first_mixer(model: sc.SequenceClassifier, x_BxLxD: jax.Array):
  """(first block's mixer, what it sees for the block input x)."""
  block = model.blocks[0]
  if hasattr(block, 'norm1'):  # Pre-norm residual block (ssm.SSMBlock).
    return block.mixer, block.norm1(x_BxLxD)
  return block.mixer, x_BxLxD  # ssm.PostNormBlock: the raw input.


def token_maps(model: sc.SequenceClassifier) -> np.ndarray:
  """maps_TxN: the first PD-SSM layer's column argmax for every real token.

  With no position embedding the first layer's input at a token is a
  function of the token alone, so each token has one hardened map.
  """
  vocab = model.config.vocab_size
  mixer, u = first_mixer(model, model.embed(jnp.arange(1, vocab)[None, :]))
  return np.asarray(mixer.transition_indices(u))[0]


def group_diagnostic(config):
  """(params -> group_maps.group_map_scores's dict) of a
  PD-SSM run on a group task, or None for any other run.

  The orbit starts at e_0 for h_0 = e_0 and at every state for h_0 = 0
  (the input then writes into all of them); see ``group_maps``.
  """
  group = st.task_spec(config.task.name).group
  if group is None or config.model.mixer not in _PDSSM_MIXERS:
    return None
  ccfg = classifier_config(config)
  graphdef, _, _ = programs(ccfg, bool(config.train.fast_compile))
  gens = st.task_generators(
    config.task.name,
    config.task.num_generators or None,
    config.task.generator_seed,
  )
  table = st.group_table(group)
  every_element = len(gens) == len(table)

  def diagnose(params) -> dict:
    model = nnx.merge(graphdef, params)
    maps = token_maps(model)
    mixer, _ = first_mixer(model, model.embed(jnp.zeros((1, 1), jnp.int32)))
    n = maps.shape[1]
    start = (0,) if mixer.initial_state == 'onehot' else tuple(range(n))
    if every_element:
      res = group_maps.group_map_scores(maps, table, start)
    else:
      res = group_maps.generator_map_scores(
        maps, gens, table, st.group_identity(group), start
      )
    faithful = res['block_distinct_elements'] == len(table)
    res['faithful_relations'] = res['block_homomorphism_frac'] * faithful
    return res

  return diagnose


def state_tracking_task(config, *, eval_hook=None) -> Task:
  """One (model, task, seed) run of the benchmark as a loop task.

  ``eval_hook(params, step) -> dict``, when given, runs at every
  evaluation; its entries join the validation record of metrics.jsonl
  (diagnostics such as ``experiments/pdssm_groups.py``'s P_t analysis).
  """
  _check_config(config)
  ccfg = classifier_config(config)
  tr, seed = config.train, config.seed
  on = loss_on(config)
  entropy_weight = relax_entropy_weight(config)
  phase_weight = relax_phase_weight(config)
  graphdef, init, eval_step = programs(ccfg, bool(tr.fast_compile))
  val = _eval_split(config, 'validation', config.task.num_validation, seed)
  batch = config.eval.batch_size
  restarts = num_restarts(config)
  early_stop = float(tr.get('early_stop_accuracy', 0.0))

  diagnose = group_diagnostic(config)

  def score(params, step):
    res = evaluate(eval_step, params, val, batch)
    if diagnose is not None:
      res.update(diagnose(params))
    if eval_hook is not None:
      res.update(eval_hook(params, step))
    return res

  def validate(params, step):
    if restarts == 1:
      return score(params, step)
    rows = [
      score(restarts_lib.replica(params, r), step) for r in range(restarts)
    ]
    r = max(range(restarts), key=lambda i: _rank(rows[i]))
    accs = [row['accuracy'] for row in rows]
    return {**rows[r], 'restart': r, 'restart_acc_min': min(accs)}

  return Task(
    init=restarts_lib.stack_init(init, restarts),
    loss=restarts_lib.stack_loss(
      _loss_fn(graphdef, on, entropy_weight, phase_weight), restarts
    ),
    batches=lambda start: _train_batches(config, seed, start),
    evaluate=validate,
    after_eval=(
      _keep_best(early_stop)
      if restarts == 1
      else _keep_best_restart(early_stop)
    ),
    init_extra=_init_extra if restarts == 1 else _init_extra_restarts,
    weight=_real_positions if on == 'prefix' else batch_size_weight,
    cache_key=(
      'state_tracking',
      ccfg,
      on,
      entropy_weight,
      phase_weight,
      restarts,
    ),
  )


def display(config) -> Display:
  """The progress lines of a state-tracking run."""
  ccfg = classifier_config(config)
  tr = config.train
  restarts = num_restarts(config)
  return Display(
    name=f'{config.model.mixer} on {config.task.name}',
    header=(
      f'{config.model.mixer} on {config.task.name} (seed {config.seed}): '
      f'{ccfg.d_model=} {ccfg.state_size=} {ccfg.num_layers=}, '
      f'{tr.num_steps} steps of {tr.batch_size}, loss on {loss_on(config)}'
      + (
        f', {restarts} restarts side by side (loss: their sum; acc: '
        'their mean; acc_best: the best)'
        if restarts > 1
        else ''
      )
    ),
    shown=('loss', 'acc', 'acc_best', 'prefix_acc'),
    log_window_mean=True,
    tokens_per_step=tr.batch_size * config.task.train_lengths[1],
  )


def final_test(config, result: FitResult, writer) -> dict:
  """The summary of a trained run: TEST accuracy of the best-validation
  and of the final parameters (also after a non-finite stop, with the
  last finite ones), by length; the 'test' record joins metrics.jsonl."""
  state, extra = result.state, result.state.extra
  out = {
    'model': config.model.mixer,
    'task': config.task.name,
    'loss_on': loss_on(config),
    'seed': config.seed,
    'best_val_accuracy': float(extra['best_val_acc']),
    'best_step': int(extra['best_step']),
    'wall_s': round(result.wall_seconds_total, 1),
  }
  if 'best_restart' in extra:
    out['restarts'] = num_restarts(config)
    out['best_restart'] = int(extra['best_restart'])
  if not (result.finished or result.status == 'nan'):
    return out
  _, _, eval_step = programs(
    classifier_config(config), bool(config.train.fast_compile)
  )
  batch = config.eval.batch_size
  test = _eval_split(config, 'test', config.task.num_test, config.seed)
  final = evaluate(
    eval_step, final_params(state), test, batch, per_sequence=True
  )
  best = final
  if float(extra['best_val_acc']) >= 0:  # Else no validation ran.
    best = evaluate(
      eval_step, best_params(state), test, batch, per_sequence=True
    )
  out.update(
    test_accuracy=best['accuracy'],
    test_loss=best['loss'],
    test_accuracy_final=final['accuracy'],
    test_lengths=list(config.task.eval_lengths),
    num_test=config.task.num_test,
    test_accuracy_by_length=accuracy_by_length(best['hit'], test['lengths']),
  )
  diagnose = group_diagnostic(config)
  if diagnose is not None:
    # The tested parameters' maps: whether the accuracy above comes from a
    # representation of the group (faithful_relations 1) or from an
    # automaton that fits the words it was shown.
    out['group_maps'] = {
      k: float(v) for k, v in diagnose(best_params(state)).items()
    }
  writer.write(result.step, 'test', {'accuracy': best['accuracy']})
  print(
    f'TEST accuracy {best["accuracy"]:.4f} (best-validation params; final '
    f'params {final["accuracy"]:.4f}) on {config.task.num_test} sequences '
    f'of length {config.task.eval_lengths}',
    flush=True,
  )
  return out


def restore_state(config, workdir: str):
  """The newest checkpointed train state of a run (a clear error if none)."""
  return restore_newest(
    state_tracking_task(config), trainer_config(config), workdir
  )


def score_best(config, state) -> tuple[dict, dict]:
  """(per-sequence test scores of the best parameters, the test split)."""
  _, _, eval_step = programs(
    classifier_config(config), bool(config.train.fast_compile)
  )
  test = _eval_split(config, 'test', config.task.num_test, config.seed)
  res = evaluate(
    eval_step,
    best_params(state),
    test,
    config.eval.batch_size,
    per_sequence=True,
  )
  return res, test


def evaluate_checkpoint(config, workdir: str) -> dict:
  """--mode=eval: test accuracy of the newest checkpoint's best parameters.

  Writes workdir/eval_test.json (accuracy, loss, by-length breakdown).
  """
  state = restore_state(config, workdir)
  res, test = score_best(config, state)
  out = {
    'step': int(state.step),
    'accuracy': res['accuracy'],
    'loss': res['loss'],
    'accuracy_by_length': accuracy_by_length(res['hit'], test['lengths']),
  }
  metrics.write_json(os.path.join(workdir, 'eval_test.json'), out)
  return out


def train_state_tracking(
  config, workdir: str, *, eval_hook=None, allow_fresh_start: bool = False
) -> dict:
  """Trains and tests one (model, task, seed) run; returns the summary.

  Args:
    config: ConfigDict from ``experiments/configs/state_tracking.py``.
    workdir: output folder (created); an existing run there is resumed.
    eval_hook: optional (params, step) -> dict joined to every validation
      record (see ``state_tracking_task``).
    allow_fresh_start: train from step 0 although every checkpoint is
      unreadable (else AllCheckpointsCorruptError; see fit.fit).

  Returns:
    The summary dict also written to workdir/summary.json: test and best
    validation accuracy, steps, wall time over all starts, status ('ok' or
    'nan': a non-finite step stopped the run, which is then tested with
    the last finite parameters, so a sweep goes on).
  """
  task = state_tracking_task(config, eval_hook=eval_hook)
  result = fit(
    task,
    trainer_config(config),
    workdir,
    display=display(config),
    config_record=config.to_dict(),
    allow_fresh_start=allow_fresh_start,
    raise_on_nan=False,  # The last finite parameters are still tested.
  )
  return finish(result, lambda res, writer: final_test(config, res, writer))
