"""Values read off training curves: how many steps a run needs to reach a bound.

A "FLOPs-efficiency" claim (objective A reaches a loss in x% fewer steps
than objective B at the same model and batch) is a statement about two
validation curves, not about two final numbers. These functions read the
periodic validation evaluations of a run (``metrics.jsonl``) and find where
one curve reaches another's bound. Both runs must use a learning rate that
does not depend on the run's length (constant after warm-up), or the
shorter run's curve is not a prefix of the longer one's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlm_jax.training.metrics import read_metrics


def validation_curve(workdir: str, key: str = 'bits_per_token'):
  """[(step, value)] of a run's periodic validation evaluations, by step.

  A step evaluated twice (a run resumed from a checkpoint before an
  evaluation it had already logged) keeps its last row.
  """
  by_step = {}
  for row in read_metrics(workdir):
    if row.get('split') == 'validation' and key in row:
      by_step[int(row['step'])] = float(row[key])
  return sorted(by_step.items())


def steps_to_reach(curve: Sequence[tuple[int, float]], target: float):
  """The first step at which a curve reaches ``target`` (value <= target),
  interpolating linearly between evaluations; None if it never does."""
  prev = None
  for step, value in curve:
    if value <= target:
      if prev is None:
        return float(step)
      step0, value0 = prev
      frac = (value0 - target) / (value0 - value)
      return step0 + frac * (step - step0)
    prev = (step, value)
  return None


def extra_steps_percent(fast, slow) -> float:
  """How many more steps `slow` needs than `fast` to reach fast's final
  bound, in % of fast's steps (negative: slow gets there first).

  Args:
    fast, slow: validation curves [(step, bound)], as ``validation_curve``
      returns them; fast's last evaluation sets the target and its steps.

  Raises ValueError if `slow` never reaches the target: the value is then
  only bounded below, so `slow` needs a longer run.
  """
  if not fast or not slow:
    raise ValueError('a run has no validation evaluations in metrics.jsonl')
  fast_steps, target = fast[-1]
  reached = steps_to_reach(slow, target)
  if reached is None:
    last_step, last_value = slow[-1]
    raise ValueError(
      f'the slower run ends at {last_value:.4f} after {last_step} steps, '
      f'above the target {target:.4f}: it needs more than '
      f'{100 * (last_step / fast_steps - 1):+.0f}% steps; train it longer '
      '(its train.num_steps)'
    )
  return 100.0 * (reached / fast_steps - 1.0)


def extra_steps_of(fast_arm: str, slow_arm: str):
  """A ``spec.Derived`` function: `extra_steps_percent` of two arms' runs."""

  def fn(workdirs: Mapping[str, str]) -> float:
    return extra_steps_percent(
      validation_curve(workdirs[fast_arm]),
      validation_curve(workdirs[slow_arm]),
    )

  return fn
