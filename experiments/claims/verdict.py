"""Verdict rules: measured numbers with their spread -> a verdict.

Every rule is a small frozen dataclass (what the claim asserts) and
``judge(claim, record)`` applies it to a record (what was measured). The
functions are pure: no files, no clocks, so each outcome is unit-tested on
synthetic records.

The verdicts:
  reproduced   the claim holds on >= ``min_seeds`` training seeds (each
               seed, and the mean by more than twice its standard error),
               or an exact test of it passes; a timing claim on code that
               trains nothing counts fresh processes instead of seeds;
  partial      the mean points the claim's way, but too few training
               seeds, a seed against it, a difference inside the noise, or
               an unmatched protocol (sample entropy) keeps it from
               settling;
  miss         the measurement points against the claim;
  not matched  it points against the claim, but the arms' samples differ in
               entropy, beyond the claim's tolerance, the way that handicaps
               the claimed winner (a flatter arm has a higher gen-ppl for
               its entropy alone), so it cannot settle the claim either way;
  inconclusive at this budget
               it points against the claim, but our training budget is so
               far below the paper's that it cannot settle it either way;
  not run      no record.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

REPRODUCED = 'reproduced'
PARTIAL = 'partial'
MISS = 'miss'
NOT_MATCHED = 'not matched'
INCONCLUSIVE = 'inconclusive at this budget'
NOT_RUN = 'not run'
VERDICTS = (REPRODUCED, PARTIAL, MISS, NOT_MATCHED, INCONCLUSIVE, NOT_RUN)


@dataclasses.dataclass(frozen=True)
class Verdict:
  label: str
  reason: str


@dataclasses.dataclass(frozen=True)
class Threshold:
  """One arm's metric meets a target: ``value <= target`` or ``>=``."""

  arm: str
  target: float
  direction: str = '<='  # or '>='
  min_seeds: int = 3


@dataclasses.dataclass(frozen=True)
class Ratio:
  """``arm``'s metric over ``baseline``'s, seed by seed, meets a target.

  ``entropy_tol`` (bits) makes it a matched-entropy ratio: both arms'
  sample entropies must be recorded, and the arm may not be sharper than
  the baseline by more than this where sharpness flatters the ratio (a
  lower entropy lowers gen-ppl, so it helps a ``<=`` target).
  A miss the other way round (the arm handicapped) is 'not matched'.
  ``field`` is the per-seed list of the arms that is divided: their
  ``values`` (the metric), or another such as ``flops_per_sample``.
  """

  arm: str
  baseline: str
  target: float
  direction: str = '<='  # or '>='
  min_seeds: int = 3
  entropy_tol: float | None = None
  field: str = 'values'

  @property
  def name(self) -> str:
    ratio = f'{self.arm}/{self.baseline}'
    return ratio if self.field == 'values' else f'{ratio} {self.field}'


@dataclasses.dataclass(frozen=True)
class Compare:
  """``arm`` beats ``baseline``: its metric is lower (or higher).

  ``entropy_tol`` (bits) makes it a matched-entropy comparison: the two
  arms' sample entropies must be recorded, and the arm may be sharper than
  the baseline by at most this; with ``better='higher'`` it may not be
  flatter by more either. A result against the claim is a miss only if
  the arm was not handicapped the mirror way (flatter, or either way for
  ``'higher'``); otherwise it is 'not matched'.
  ``min_effect`` is the smallest difference that counts as the claim's.
  """

  arm: str
  baseline: str
  better: str = 'lower'  # or 'higher'
  min_seeds: int = 3
  entropy_tol: float | None = None
  min_effect: float = 0.0


@dataclasses.dataclass(frozen=True)
class Match:
  """One arm matches the paper's number within the two spreads.

  The tolerance is ``tol`` when given, else twice the root sum of squares
  of our seed sd and the paper's sd.
  """

  arm: str
  paper_mean: float
  paper_sd: float = 0.0
  tol: float | None = None
  min_seeds: int = 3
  # Our seeds may spread up to twice the paper's sd (or twice this floor,
  # in the metric's unit) before the match stops counting as one.
  spread_floor: float = 1.0


@dataclasses.dataclass(frozen=True)
class Ordering:
  """The arms' metric increases in the order listed, on every seed."""

  arms: tuple[str, ...]
  min_seeds: int = 3


@dataclasses.dataclass(frozen=True)
class AllOf:
  """Every rule of ``rules`` holds on the same record.

  For a claim with several parts: "the middle third of the steps is the
  most sensitive" holds only if the middle beats the first third and the
  last. The verdict is the weakest part's (a miss in any part is a miss),
  with every part's reason.
  """

  rules: tuple[Any, ...]

  def __post_init__(self):
    if len(self.rules) < 2 or any(isinstance(r, AllOf) for r in self.rules):
      raise ValueError(
        'AllOf takes two or more plain rules; give the single rule itself '
        'for one part'
      )


@dataclasses.dataclass(frozen=True)
class ExactTest:
  """A test that checks the claim exactly (by enumeration, bit equality)."""

  test: str


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for a single value)."""
  n = len(values)
  if n == 0:
    raise ValueError('no values')
  mean = sum(values) / n
  if n == 1:
    return mean, 0.0
  var = sum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var)


def _arm(record: Mapping[str, Any], name: str) -> Mapping[str, Any]:
  arms = record.get('arms', {})
  arm = arms.get(name)
  if not arm or not (arm.get('values') or arm.get('mean') is not None):
    raise KeyError(f'the record has no values for arm {name!r}')
  return arm


@dataclasses.dataclass(frozen=True)
class Stats:
  """An arm's numbers: per-seed values when recorded, else a summary."""

  values: tuple[float, ...] | None
  mean: float
  sd: float | None  # Spread over seeds; None when unknown.
  n: int

  @property
  def se(self) -> float | None:
    if self.sd is None or self.n < 2:
      return None
    return self.sd / math.sqrt(self.n)


def stats(arm: Mapping[str, Any]) -> Stats:
  """Per-seed values, or a summary: mean, n and sd (or se) over seeds."""
  if arm.get('values'):
    values = tuple(float(v) for v in arm['values'])
    mean, sd = mean_sd(values)
    return Stats(values, mean, sd if len(values) > 1 else None, len(values))
  n = int(arm.get('n', 1))
  sd = arm.get('sd')
  if sd is None and arm.get('se') is not None and n > 1:
    sd = float(arm['se']) * math.sqrt(n)
  return Stats(None, float(arm['mean']), None if sd is None else float(sd), n)


# Seed kinds whose values are independent replicates: training seeds, and
# fresh processes timing code that trains nothing (experiments.claims.spec).
_REPLICATES = {'training': 'training seeds', 'processes': 'fresh processes'}


def _replicates(kind: str, n: int) -> int:
  """How many of `n` values count towards min_seeds for this seed kind."""
  return n if kind in _REPLICATES else 0


def _unit(kind: str, n: int = 2) -> str:
  """'training seeds' / 'fresh process' and so on, for `n` of them."""
  plural = _REPLICATES.get(kind, 'training seeds')
  if n != 1:
    return plural
  return plural[:-2] if plural.endswith('sses') else plural[:-1]


def _training_seeds(record: Mapping[str, Any], st: Stats) -> int:
  """How many of the arm's numbers are replicates (``_REPLICATES``)."""
  return _replicates(record.get('seed_kind', 'training'), st.n)


def _single_se(arm: Mapping[str, Any]) -> float | None:
  """The standard error of a one-value arm, if the record carries it."""
  se = arm.get('stderr')
  if se is None:
    return None
  if isinstance(se, (list, tuple)):
    return float(se[0]) if len(se) == 1 else None
  return float(se)


def _few(n: int, need: int, kind: str) -> str:
  if kind == 'sampling':
    return 'sampling seeds of one model, not training seeds'
  if kind not in _REPLICATES:
    return f'{kind}, not training seeds'
  return f'{n} {_unit(kind, n)}, {need} needed'


def threshold(rule: Threshold, record: Mapping[str, Any]) -> Verdict:
  st = stats(_arm(record, rule.arm))
  if rule.direction == '<=':
    ok = lambda v: v <= rule.target
  else:
    ok = lambda v: v >= rule.target
  n = _training_seeds(record, st)
  kind = record.get('seed_kind', 'training')
  text = f'mean {st.mean:.4g} against target {rule.direction} {rule.target:g}'
  if not ok(st.mean):
    return Verdict(MISS, f'{text}: the mean misses it')
  if st.values is not None:
    met = sum(ok(v) for v in st.values)
    if met < len(st.values):
      return Verdict(PARTIAL, f'{text}: met on {met} of {st.n} values')
    every = f'met on all {n} {_unit(kind)}'
  else:
    # A summary only: the mean must clear the target by two standard errors.
    se = st.se
    margin = (
      None
      if se is None
      else st.mean + (2 * se if rule.direction == '<=' else -2 * se)
    )
    if margin is None or not ok(margin):
      return Verdict(PARTIAL, f'{text}: met by the mean, not by 2 se')
    every = f'met by the mean - 2 se over {n} {_unit(kind)}'
  if n < rule.min_seeds:
    return Verdict(PARTIAL, f'{text}: met, but {_few(n, rule.min_seeds, kind)}')
  return Verdict(REPRODUCED, f'{text}: {every}')


def ratios(rule: Ratio, record: Mapping[str, Any]) -> dict[str, Any]:
  """The record's per-seed ratios of ``rule``, as an arm {'seeds', 'values'}.

  Raises KeyError (the claim is then 'not run') unless both arms carry
  the per-seed field on the same seeds: a ratio of means hides its spread.
  """
  a, b = _arm(record, rule.arm), _arm(record, rule.baseline)
  top, bottom = a.get(rule.field), b.get(rule.field)
  if not top or not bottom or a.get('seeds') != b.get('seeds'):
    raise KeyError(
      f'{rule.name} needs per-seed {rule.field} of both arms on the same seeds'
    )
  values = [float(x) / float(y) for x, y in zip(top, bottom)]
  return {'seeds': list(a['seeds']), 'values': values}


def ratio(rule: Ratio, record: Mapping[str, Any]) -> Verdict:
  arm = ratios(rule, record)
  got = threshold(
    Threshold(rule.name, rule.target, rule.direction, rule.min_seeds),
    {**record, 'arms': {rule.name: arm}},
  )
  got = Verdict(got.label, f'{rule.name}: {got.reason}')
  if rule.entropy_tol is None or got.label not in (REPRODUCED, MISS):
    return got
  # A sharper arm flatters a ratio that must stay low (gen-ppl), a
  # flatter one a ratio that must stay high; the other way it handicaps
  # the arm, and a miss is not settled.
  low = rule.direction == '<='
  if got.label == MISS:
    handicap = _unmatched(
      rule.arm, rule.baseline, record, rule.entropy_tol, sharper=not low,
      flatter=low,
    )  # fmt: skip
    if handicap:
      return Verdict(NOT_MATCHED, f'{got.reason}, but {handicap}')
    return got
  unmatched = _unmatched(
    rule.arm, rule.baseline, record, rule.entropy_tol, sharper=low,
    flatter=not low,
  )  # fmt: skip
  if unmatched:
    return Verdict(PARTIAL, f'{got.reason}; {unmatched}')
  return got


def _unmatched(
  arm: str,
  baseline: str,
  record: Mapping[str, Any],
  tol: float,
  *,
  sharper: bool,
  flatter: bool,
) -> str | None:
  """Why ``arm``'s samples are not entropy-matched to ``baseline``'s in the
  direction(s) asked (None when they are matched): ``sharper``, the arm
  has less entropy; ``flatter``, more. Unrecorded entropy is unmatched."""
  ha = _entropy(_arm(record, arm))
  hb = _entropy(_arm(record, baseline))
  if ha is None or hb is None:
    return 'sample entropy not recorded'
  if sharper and hb - ha > tol:
    return f'{arm} has {hb - ha:.3f} bits less entropy (> {tol:g}): not matched'
  if flatter and ha - hb > tol:
    return f'{arm} has {ha - hb:.3f} bits more entropy (> {tol:g}): not matched'
  return None


def _entropy(arm: Mapping[str, Any]) -> float | None:
  h = arm.get('entropy')
  if h is None:
    return None
  if isinstance(h, (list, tuple)):
    return mean_sd([float(x) for x in h])[0]
  return float(h)


def compare(rule: Compare, record: Mapping[str, Any]) -> Verdict:
  a = _arm(record, rule.arm)
  b = _arm(record, rule.baseline)
  sa, sb = stats(a), stats(b)
  sign = 1.0 if rule.better == 'lower' else -1.0
  paired = (
    sa.values is not None
    and sb.values is not None
    and a.get('seeds') is not None
    and a.get('seeds') == b.get('seeds')
  )
  every = True
  if paired:
    # Improvement per seed, positive when the claim holds.
    gains = [sign * (y - x) for x, y in zip(sa.values, sb.values)]
    gain, sd = mean_sd(gains)
    n = len(gains)
    se = sd / math.sqrt(n) if n > 1 else None
    every = all(g > rule.min_effect for g in gains)
  else:
    gain = sign * (sb.mean - sa.mean)
    n = min(sa.n, sb.n)
    se = None
    if sa.se is not None and sb.se is not None:
      se = math.sqrt(sa.se**2 + sb.se**2)
  if se is None:
    sea, seb = _single_se(a), _single_se(b)
    if sea is not None and seb is not None:
      se = math.sqrt(sea**2 + seb**2)
  kind = record.get('seed_kind', 'training')
  n_train = _replicates(kind, n)
  text = f'{rule.arm} vs {rule.baseline}: gain {gain:+.4g}'
  text += f' (se {se:.2g})' if se is not None else ' (spread unknown)'
  if gain <= rule.min_effect:
    # Against the claim; settled only if the claimed winner was not
    # handicapped: flatter for a lower-is-better metric, either way for
    # higher-is-better (as below, mirrored).
    handicap = rule.entropy_tol is not None and _unmatched(
      rule.arm,
      rule.baseline,
      record,
      rule.entropy_tol,
      sharper=rule.better == 'higher',
      flatter=True,
    )
    if handicap:
      return Verdict(
        NOT_MATCHED, f'{text}: not the claimed direction, but {handicap}'
      )
    return Verdict(MISS, f'{text}: not the claimed direction')
  caps = []
  if rule.entropy_tol is not None:
    # For a lower-is-better metric (gen-ppl) only a sharper winner is
    # suspect: lower entropy alone lowers gen-ppl. Higher-is-better (MAUVE,
    # or gen-ppl as a measure of damage): a flatter arm can be ahead by its
    # entropy alone, so either way counts.
    unmatched = _unmatched(
      rule.arm,
      rule.baseline,
      record,
      rule.entropy_tol,
      sharper=True,
      flatter=rule.better == 'higher',
    )
    if unmatched:
      caps.append(unmatched)
  if se is None or gain - rule.min_effect <= 2 * se:
    caps.append('inside twice its standard error')
  if not every:
    caps.append('not on every seed')
  if n_train < rule.min_seeds:
    caps.append(_few(n_train, rule.min_seeds, kind))
  if caps:
    return Verdict(PARTIAL, f'{text}: ' + '; '.join(caps))
  how = 'on every seed' if paired else 'in the means'
  return Verdict(REPRODUCED, f'{text}: {how}, > 2 se, {n} {_unit(kind)}')


def match(rule: Match, record: Mapping[str, Any]) -> Verdict:
  st = stats(_arm(record, rule.arm))
  sd = st.sd or 0.0
  tol = rule.tol
  if tol is None:
    tol = 2 * math.sqrt((st.se or 0.0) ** 2 + rule.paper_sd**2)
  diff = st.mean - rule.paper_mean
  text = (
    f'ours {st.mean:.4g} +- {sd:.2g} vs paper {rule.paper_mean:g} +- '
    f'{rule.paper_sd:g}: difference {diff:+.3g}, tolerance {tol:.3g}'
  )
  if abs(diff) > tol:
    return Verdict(MISS, f'{text}: outside')
  allowed = 2 * max(rule.paper_sd, rule.spread_floor)
  if sd > allowed:
    return Verdict(
      PARTIAL, f'{text}: our seeds spread sd {sd:.3g} > {allowed:.3g}'
    )
  n = _training_seeds(record, st)
  if n < rule.min_seeds:
    kind = record.get('seed_kind', 'training')
    return Verdict(PARTIAL, f'{text}: {_few(n, rule.min_seeds, kind)}')
  unit = _unit(record.get('seed_kind', 'training'))
  return Verdict(REPRODUCED, f'{text}: within, {n} {unit}')


def ordering(rule: Ordering, record: Mapping[str, Any]) -> Verdict:
  arms = [_arm(record, name) for name in rule.arms]
  st = [stats(a) for a in arms]
  means = [x.mean for x in st]
  text = ' < '.join(f'{n} {m:.4g}' for n, m in zip(rule.arms, means))
  if not all(x < y for x, y in zip(means, means[1:])):
    return Verdict(MISS, f'means not in the claimed order: {text}')
  seeds = [a.get('seeds') for a in arms]
  per_seed = (
    all(x.values is not None for x in st)
    and seeds[0] is not None
    and all(s == seeds[0] for s in seeds)
  )
  kind = record.get('seed_kind', 'training')
  if not per_seed:
    return Verdict(PARTIAL, f'{text}: per-seed values not aligned')
  rows = list(zip(*[x.values for x in st]))
  good = sum(all(x < y for x, y in zip(r, r[1:])) for r in rows)
  if good < len(rows):
    return Verdict(PARTIAL, f'{text}: in order on {good} of {len(rows)}')
  n_train = _replicates(kind, len(rows))
  if n_train < rule.min_seeds:
    return Verdict(PARTIAL, f'{text}: {_few(n_train, rule.min_seeds, kind)}')
  return Verdict(REPRODUCED, f'{text}: in order on all {n_train} {_unit(kind)}')


def exact(rule: ExactTest, record: Mapping[str, Any]) -> Verdict:
  result = record.get('exact_test')
  if not result:
    return Verdict(NOT_RUN, f'{rule.test} has no recorded result')
  if result.get('passed'):
    return Verdict(REPRODUCED, f'exact test {rule.test} passes')
  if result.get('skipped') and not (
    result.get('failures') or result.get('errors')
  ):
    return Verdict(
      NOT_RUN,
      f'{result["skipped"]} of {result.get("tests")} tests of {rule.test} '
      'skipped (a missing optional dependency?): not checked',
    )
  return Verdict(MISS, f'exact test {rule.test} fails')


# How far each verdict is from settling a claim, for AllOf's weakest part.
_WEAKNESS = {REPRODUCED: 0, PARTIAL: 1, NOT_MATCHED: 2, MISS: 3, NOT_RUN: 4}


def all_of(rule: AllOf, record: Mapping[str, Any]) -> Verdict:
  parts = [_JUDGES[type(r)](r, record) for r in rule.rules]
  worst = max(parts, key=lambda got: _WEAKNESS[got.label])
  return Verdict(worst.label, '; '.join(got.reason for got in parts))


_JUDGES = {
  AllOf: all_of,
  Threshold: threshold,
  Ratio: ratio,
  Compare: compare,
  Match: match,
  Ordering: ordering,
  ExactTest: exact,
}


def judge(
  rule: Any,
  record: Mapping[str, Any] | None,
  budget_fraction: float | None = None,
  budget_floor: float = 0.01,
) -> Verdict:
  """The verdict of ``rule`` on ``record``.

  ``budget_fraction`` is our training budget over the paper's (the
  record's own value wins over the claim's); below ``budget_floor`` a
  result against the claim (a miss, matched in entropy or not) becomes
  'inconclusive at this budget'. A record made at the
  test-only ``smoke`` budget is always inconclusive.
  """
  if not record:
    return Verdict(NOT_RUN, 'no record')
  judge_fn = _JUDGES.get(type(rule))
  if judge_fn is None:
    raise TypeError(f'unknown rule {rule!r}')
  try:
    result = judge_fn(rule, record)
  except KeyError as e:
    return Verdict(NOT_RUN, str(e.args[0]))
  if record.get('budget') == 'smoke':
    return Verdict(
      INCONCLUSIVE,
      f'smoke budget (a test run, not a measurement); {result.reason}',
    )
  fraction = record.get('budget_fraction', budget_fraction)
  against = result.label in (MISS, NOT_MATCHED)
  if against and fraction is not None and fraction < budget_floor:
    return Verdict(
      INCONCLUSIVE,
      f"{result.reason}; at {fraction:.2g} of the paper's budget "
      f'(< {budget_floor:g}) this cannot settle the claim',
    )
  return result


# The source of every record experiments.reproduce measures itself.
REPRODUCE = 'python -m experiments.reproduce'


def next_step(label: str, record: Mapping[str, Any] | None, accelerator: bool):
  """What a claim needs next: 'accelerator run', 'rerun' or ''.

  A claim that only an accelerator can settle (its budget, or a device
  path) is marked for the accelerator run. One whose record another
  command made (transcribed from earlier notes, or written by a
  benchmark before ``reproduce`` measured the claim, perhaps by a
  protocol since changed) and that is neither reproduced nor a miss on
  >= 3 training seeds is marked for a rerun on CPU.
  """
  if accelerator or label == INCONCLUSIVE:
    return 'accelerator run'
  if label == REPRODUCED or not record:
    return ''
  if record.get('source') == REPRODUCE:
    return ''
  settled = (
    label == MISS
    and record.get('seed_kind', 'training') == 'training'
    and len(record.get('seeds', [])) >= 3
  )
  return '' if settled else 'rerun'
