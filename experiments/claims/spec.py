"""What a claim is: the paper, its number, the arms that test it, the rule.

A claim is data, not prose: the paper (arXiv id, table), the number the
paper reports, the arms that measure ours (an ``experiments.run`` config
with overrides, the seeds), the metric, the comparison protocol and a
verdict rule from ``verdict``. The verdict is never written here: it is
computed from a record (``records``) by the claim's rule.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The comparison protocols a claim can name (what makes two arms
# comparable). A sample-quality claim uses MATCHED_ENTROPY unless it says
# why not: lower entropy alone lowers generative perplexity.
EQUAL_STEPS = 'equal steps'
EQUAL_FLOPS = 'equal training FLOPs'
MATCHED_ENTROPY = 'matched entropy by temperature sweep'
EQUAL_NFE = 'equal NFE'
NAMED_BASELINE = 'named baseline'
TARGET = 'target value'
PAPER_VALUE = "the paper's value"
EXACT = 'exact test'
PROTOCOLS = (
  EQUAL_STEPS,
  EQUAL_FLOPS,
  MATCHED_ENTROPY,
  EQUAL_NFE,
  NAMED_BASELINE,
  TARGET,
  PAPER_VALUE,
  EXACT,
)

# Kinds of seeds a record can carry. Only training seeds (or an exact
# test) can make a claim about training 'reproduced'; sampling seeds of
# one model and repeated timing rounds cannot.
TRAINING = 'training'
SAMPLING = 'sampling'
ROUNDS = 'rounds'
# Fresh processes timing code that trains nothing (random weights, random
# data): the replicate of a speed claim, as a training seed is of a
# training claim. Only a claim with a `Measurement` records them.
PROCESSES = 'processes'
SEED_KINDS = (TRAINING, SAMPLING, ROUNDS, PROCESSES)


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm: a config of ``experiments.run`` and the keys it overrides.

  ``config`` is the ``--config`` value (path and preset argument);
  ``overrides`` are ``--config.KEY=VALUE`` pairs; ``init_from`` names
  another arm whose run of the same seed this one starts from;
  ``smoke_config`` replaces ``config`` at the test-only smoke budget when
  appending the ``smoke`` preset does not give a valid argument, and
  ``paper_config`` at the paper's budget; ``smoke_overrides`` replace
  ``overrides`` at the smoke budget (e.g. a block size that fits its
  shorter sequences).
  """

  name: str
  config: str
  overrides: tuple[tuple[str, Any], ...] = ()
  init_from: str = ''
  smoke_config: str = ''
  paper_config: str = ''
  smoke_overrides: tuple[tuple[str, Any], ...] | None = None

  def overrides_for(self, budget: str) -> tuple[tuple[str, Any], ...]:
    """The overrides at a budget (the smoke preset may need its own)."""
    if budget == 'smoke' and self.smoke_overrides is not None:
      return self.smoke_overrides
    return self.overrides

  def config_for(self, budget: str) -> str:
    """The --config value at a budget ('smoke' adds the smoke preset)."""
    if budget == 'paper' and self.paper_config:
      return self.paper_config
    if budget != 'smoke':
      return self.config
    if self.smoke_config:
      return self.smoke_config
    sep = ',' if ':' in self.config else ':'
    return f'{self.config}{sep}smoke'


# The temperature sweep of a matched-entropy claim. The quickstart models'
# ancestral samples cross the validation text's unigram entropy (4.40
# bits) between 0.9 and 1.0; the ends leave room for samplers that sharpen
# (ReMDM, greedy tails) or flatten their output.
TEMPERATURES = (0.8, 0.9, 1.0, 1.15, 1.3)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """One sample-quality arm: a registered sampler drawing from a trained arm.

  For training seed S the sampler draws ``num_samples`` from the seed-S
  run of the claim's arm ``arm``, with sampling seed S, once per
  temperature of ``temperatures``: the sweep over which its gen-NLL is
  read at the validation text's unigram entropy (``MATCHED_ENTROPY``).
  ``params`` are the sampler's parameters (``num_steps`` among them); the
  temperature is the sweep's, never a parameter. A sampler that anneals
  its own temperatures (DiffusionGemma's canvas sampler) names them in
  ``scaled``: each sweep value then multiplies those params instead.
  ``light`` names the arm whose seed-S run is the light network of a
  model-scheduling sampler ('scheduled').
  """

  name: str
  arm: str
  sampler: str
  params: tuple[tuple[str, Any], ...] = ()
  temperatures: tuple[float, ...] = TEMPERATURES
  num_samples: int = 32
  scaled: tuple[str, ...] = ()
  light: str = ''

  def __post_init__(self):
    temps = self.temperatures
    if len(temps) < 2 or min(temps) <= 0 or len(set(temps)) != len(temps):
      raise ValueError(
        f'sampling {self.name}: temperatures {temps} must be at least two '
        'distinct positive values to interpolate over, e.g. (0.9, 1.0, 1.15)'
      )
    if self.num_samples < 2:
      raise ValueError(
        f'sampling {self.name}: num_samples={self.num_samples}; give at '
        'least 2 (32-64 for a claim)'
      )
    missing = [k for k in self.scaled if k not in dict(self.params)]
    if missing:
      raise ValueError(
        f'sampling {self.name}: scaled params {missing} are not in params; '
        'give their values at sweep value 1'
      )
    if 'temperature' in dict(self.params):
      raise ValueError(
        f'sampling {self.name}: temperature is swept; drop it from params '
        'and set temperatures instead'
      )

  def spec(self) -> str:
    """The sampler as a command-line spec, 'name:key=value,...'."""
    items = ','.join(f'{k}={v}' for k, v in self.params)
    return f'{self.sampler}:{items}' if items else self.sampler


def ancestral_sampling(name: str, arm: str, steps: int) -> Sampling:
  """Masked ancestral sampling on a trained arm without its skip-idle-steps
  cache, so each of the `steps` steps is one network call; 64 samples per
  temperature."""
  return Sampling(
    name,
    arm,
    'ancestral',
    (('num_steps', steps), ('use_cache', False)),
    num_samples=64,
  )


def block_sampling(name: str, arm: str, inner_steps: int | None) -> Sampling:
  """BD3's block sampler on a trained arm, 64 samples per temperature:
  ancestral sampling inside each block, `inner_steps` calls per block, or
  with ``None`` first-hitting inside each block, one token per call (a
  few ancestral steps per short block often reveal neighbouring tokens
  together, each drawn independently)."""
  if inner_steps is None:
    inner = (('inner', 'first_hitting'),)
  else:
    inner = (
      ('inner', 'ancestral'),
      ('inner_params', (('num_steps', inner_steps),)),
    )
  return Sampling(name, arm, 'block', inner, num_samples=64)


# The scorer of sample-quality claims: the quickstart's autoregressive twin
# (the arm of ar-below-mdlm, so its runs are shared). One run, seed 0, is
# the instrument every sampling arm is measured with.
AR_SCORER = Arm('ar', 'experiments/configs/ar_quickstart.py')
SCORER_SEED = 0


@dataclasses.dataclass(frozen=True)
class Derived:
  """A value per training seed computed from several arms' runs at once.

  For a claim whose number is a relation between runs rather than one
  run's summary (how many steps one arm needs to reach another's bound):
  ``fn`` takes ``{arm name: workdir}`` of one seed and returns the value
  of the record's arm ``name``, or a mapping {record arm: value}; each
  such arm holds one value per seed (what the rule reads) and the trained
  arms' own bounds go to the record's ``trained`` field.
  """

  name: str
  fn: Callable[[Mapping[str, str]], float | Mapping[str, float]]
  describe: str = ''


_RUN = re.compile(r'\{run:([A-Za-z0-9_]+)\}|\{scorer\}')


def run_placeholder(name: str) -> str:
  """How a measurement's args name a run: ``{run:ARM}``, or ``{scorer}``."""
  return '{scorer}' if name == 'scorer' else f'{{run:{name}}}'


def _run_names(args) -> frozenset[str]:
  """Arm names of ``{run:ARM}`` in args, and 'scorer' for ``{scorer}``."""
  return frozenset(
    m.group(1) or 'scorer' for a in args or () for m in _RUN.finditer(a)
  )


@dataclasses.dataclass(frozen=True)
class Measurement:
  """A command that measures a claim in its own processes.

  ``python -m MODULE ARGS RESULT_FLAG=PATH`` runs in fresh processes, one
  after another; ``value`` reads the claim's number from the JSON result
  of one process: a float (the arm ``arm``) or a mapping arm -> float, or
  arm -> {'value': float, FIELD: x, ...} where a rule reads more per seed
  than the value (the sample entropy a gen-ppl was read at, its NFE).

  Three kinds:
  - a timing benchmark (``per_seed=False``): the model and data are
    random, nothing is trained, and each of ``processes`` processes is one
    replicate (seed kind ``PROCESSES``); time on an otherwise idle host;
  - a training sweep (``per_seed=True``): ``{seed}`` in ``args`` takes each
    of the claim's seeds in turn, so each process trains and measures one
    training seed (seed kind ``TRAINING``);
  - a benchmark on the claim's trained runs (``per_seed=True``, the claim
    has arms): ``{run:ARM}`` in ``args`` is the seed's run of arm ARM and
    ``{scorer}`` the claim's scorer run; ``experiments.reproduce`` trains
    (or reuses) those runs first, so the benchmark's numbers come from
    runs the registry names instead of directories made by hand.
  PATH is a file the process writes, or with ``result_file`` a directory
  (the sweep's output folder, where it also resumes) holding that file
  (``{seed}`` in its name is the process's seed).
  Claims with the same command share its processes. ``smoke_args``
  replace ``args`` at the test-only smoke budget. ``describe`` turns the
  JSON results of every process (in seed or process order) into the
  record's notes on what was measured (settings, the numbers behind the
  value); ``experiments.reproduce`` adds how the processes ran.
  """

  module: str
  args: tuple[str, ...]
  arm: str
  value: Callable[[Any], float | Mapping[str, float]]
  result_flag: str = '--json'
  result_file: str = ''
  processes: int = 3
  per_seed: bool = False
  smoke_args: tuple[str, ...] | None = None
  describe: Callable[[Sequence[Any]], str] | None = None

  def __post_init__(self):
    smoke = () if self.smoke_args is None else (self.smoke_args,)
    for args in (self.args, *smoke):
      seeded = any('{seed}' in a for a in args) or bool(_run_names(args))
      if seeded != self.per_seed:
        raise ValueError(
          f'measurement {self.module}: per_seed={self.per_seed} but its '
          f'args {"hold" if seeded else "lack"} {{seed}} or {{run:ARM}}; a '
          'per-seed command names its seed as {seed} (or its runs as '
          '{run:ARM}), a timing one names neither'
        )
    if _run_names(self.args) != _run_names(self.smoke_args or self.args):
      raise ValueError(
        f'measurement {self.module}: its smoke args name other runs '
        f'({sorted(_run_names(self.smoke_args))}) than its args '
        f'({sorted(_run_names(self.args))})'
      )

  @property
  def runs(self) -> frozenset[str]:
    """The arms ('scorer' for the scorer) whose runs the command reads."""
    return _run_names(self.args)

  @property
  def seed_kind(self) -> str:
    return TRAINING if self.per_seed else PROCESSES

  def args_for(
    self,
    budget: str,
    seed: int | None = None,
    runs: Mapping[str, str] | None = None,
  ) -> tuple[str, ...]:
    """The args at a budget, with ``{seed}`` and the runs filled in
    (``runs``: arm name or 'scorer' -> that seed's workdir)."""
    args = self.args
    if budget == 'smoke' and self.smoke_args is not None:
      args = self.smoke_args
    if seed is not None:
      args = tuple(a.replace('{seed}', str(seed)) for a in args)
    for name, workdir in (runs or {}).items():
      key = run_placeholder(name)
      args = tuple(a.replace(key, workdir) for a in args)
    return args

  def command(self, budget: str = 'cpu') -> str:
    """The command of one process, without its result path."""
    return shlex.join(('python', '-m', self.module, *self.args_for(budget)))


@dataclasses.dataclass(frozen=True)
class Claim:
  """One paper claim and how this suite checks it.

  Attributes:
    id: short stable name (``python -m experiments.reproduce ID``).
    family: the evidence section of docs/RESULTS.md it belongs to.
    paper: short title of the paper (or 'project target').
    arxiv: arXiv id, '' for the project's own targets.
    table: where in the paper the number is ('Table 2', 'Sec. 5', ...).
    statement: the claim, in one sentence.
    paper_value: the paper's number as the paper reports it.
    metric: what is measured, with its unit.
    protocol: one of ``PROTOCOLS``.
    rule: a rule of ``verdict`` that turns a record into a verdict.
    arms: the runs ``experiments.reproduce`` trains (empty: the claim is
      measured by its ``measurement``, or by the command below).
    measurement: the command ``experiments.reproduce`` runs: a timing
      benchmark or a training sweep (no arms), or a benchmark on the
      arms' trained runs (which it names as ``{run:ARM}``).
    samplings: sample-quality arms drawn from the trained ``arms`` (the
      record's arms are then these, at matched entropy, not the bounds).
    derived: a value computed per seed from all the arms' runs (the
      record's arm is then this value, not the arms' bounds).
    scorer: the AR run that scores the samplings (trained once, seed
      ``SCORER_SEED``); required with samplings.
    metric_key: dotted key of the metric in each run's summary.json.
    metric_scale: factor from the summary's value to the metric's unit.
    seeds: the seeds a full reproduction runs.
    command: the command that reproduces the measurement.
    bound: the bound convention of likelihood numbers ('full', 'mdlm',
      'exact NLL') or ''.
    budget_fraction: our training budget over the paper's (sequences
      seen, or model scale where that is what limits the claim); None
      when the claim does not depend on a training budget.
    budget_floor: below this fraction a result against the claim is
      'inconclusive at this budget', not a miss.
    cost_minutes: rough wall time of a full reproduction on 2 CPU cores.
    accelerator: True for claims that only an accelerator run can settle.
    pending: why a CPU claim has no record yet (its runs are queued, with
      their cost); RESULTS lists it under "Not run" with this reason. A
      CPU claim without a record must say why here.
    details: keys of each run's validation record that chose the tested
      parameters (metrics.jsonl, the step summary.json calls best_step),
      recorded per seed beside the metric: diagnostics the verdict does
      not read but a reader needs, such as whether a state-tracking run
      represents its group.
  """

  id: str
  family: str
  paper: str
  arxiv: str
  table: str
  statement: str
  paper_value: str
  metric: str
  protocol: str
  rule: Any
  arms: tuple[Arm, ...] = ()
  samplings: tuple[Sampling, ...] = ()
  scorer: Arm | None = None
  measurement: Measurement | None = None
  derived: Derived | None = None
  metric_key: str = 'validation.bits_per_token'
  metric_scale: float = 1.0
  seeds: tuple[int, ...] = (0, 1, 2)
  command: str = ''
  bound: str = ''
  budget_fraction: float | None = None
  budget_floor: float = 0.01
  cost_minutes: float = 0.0
  accelerator: bool = False
  pending: str = ''
  details: tuple[str, ...] = ()

  def __post_init__(self):
    if self.protocol not in PROTOCOLS:
      raise ValueError(
        f'claim {self.id}: protocol {self.protocol!r} is not one of {PROTOCOLS}'
      )
    names = [a.name for a in self.arms]
    if len(set(names)) != len(names):
      raise ValueError(f'claim {self.id}: arm names repeat: {names}')
    for arm in self.arms:
      if arm.init_from and arm.init_from not in names:
        raise ValueError(
          f'claim {self.id}: arm {arm.name} starts from unknown arm '
          f'{arm.init_from!r}'
        )
    if self.measurement and self.accelerator:
      raise ValueError(
        f'claim {self.id}: a measured claim runs its own command on this '
        'host and needs no accelerator'
      )
    if self.measurement:
      self._check_measured_runs(names)
    if self.derived and (self.samplings or not self.arms):
      raise ValueError(
        f'claim {self.id}: a derived value is computed from trained arms; '
        'give arms and no samplings'
      )
    if not self.samplings:
      return
    draws = [s.name for s in self.samplings]
    if len(set(draws)) != len(draws):
      raise ValueError(f'claim {self.id}: sampling names repeat: {draws}')
    for s in self.samplings:
      if s.arm not in names:
        raise ValueError(
          f'claim {self.id}: sampling {s.name} draws from unknown arm '
          f'{s.arm!r}; name one of {names}'
        )
      if s.light and s.light not in names:
        raise ValueError(
          f'claim {self.id}: sampling {s.name} schedules unknown arm '
          f'{s.light!r} as its light network; name one of {names}'
        )
    if self.scorer is None:
      raise ValueError(
        f'claim {self.id}: samplings need a scorer arm (spec.AR_SCORER)'
      )
    if not self.metric_key.startswith('validation.'):
      raise ValueError(
        f'claim {self.id}: with samplings the trained arms are checked by '
        f'their validation numbers, not {self.metric_key!r}'
      )

  def _check_measured_runs(self, names: list[str]) -> None:
    """A measurement reads exactly the runs the claim trains."""
    wanted = self.measurement.runs
    unknown = sorted(wanted - set(names) - {'scorer'})
    if unknown:
      raise ValueError(
        f'claim {self.id}: its measurement reads runs of unknown arms '
        f'{unknown}; name one of {names}'
      )
    if 'scorer' in wanted and self.scorer is None:
      raise ValueError(
        f'claim {self.id}: its measurement reads {{scorer}}; give a scorer '
        'arm (spec.AR_SCORER)'
      )
    bases = {a.init_from for a in self.arms}
    unread = sorted(set(names) - wanted - bases)
    if unread or self.samplings or self.derived:
      raise ValueError(
        f'claim {self.id}: a measured claim trains only the arms its '
        f'command reads as {{run:ARM}} (not {unread}), with no samplings '
        'or derived value'
      )


# Sample entropies (bits) closer than this count as matched: at this
# corpus's scale ~0.24 bits of sharpening moves gen-ppl by ~11, so 0.02
# bits is worth about one gen-ppl point, the sampling noise of 32 samples.
ENTROPY_TOL = 0.02


def recipe(
  id_, paper, arxiv, table, config, value, target, metric, bound='mdlm'
):
  """A paper-scale recipe: the paper's number, no record until it is run.

  ``config`` is the file (and preset) under experiments/configs; the rule
  asks for the paper's value or better (lower).
  """
  from experiments.claims.verdict import Threshold

  return Claim(
    id=id_,
    family='paper recipes',
    paper=paper,
    arxiv=arxiv,
    table=table,
    statement=f"{config} reaches the paper's {value}.",
    paper_value=value,
    metric=metric,
    protocol=PAPER_VALUE,
    rule=Threshold('recipe', target, '<='),
    arms=(Arm('recipe', f'experiments/configs/{config}'),),
    seeds=(0,),
    command=f'python -m experiments.reproduce {id_} --budget paper',
    bound=bound,
    budget_fraction=1.0,
    accelerator=True,
    cost_minutes=60 * 24 * 7,
  )


def exact_claim(
  id_, *, family, paper, arxiv, table, statement, paper_value, test,
  cost_minutes=1,
):  # fmt: skip
  """A claim settled by a test file (closed form, enumeration, parity):
  `experiments.reproduce` runs it and the verdict is whether every test in
  it ran and passed."""
  from experiments.claims.verdict import ExactTest

  return Claim(
    id=id_,
    family=family,
    paper=paper,
    arxiv=arxiv,
    table=table,
    statement=statement,
    paper_value=paper_value,
    metric='exact test',
    protocol=EXACT,
    rule=ExactTest(test),
    seeds=(),
    command=f'python -m experiments.reproduce {id_}',
    cost_minutes=cost_minutes,
  )
