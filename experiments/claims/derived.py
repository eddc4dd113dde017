"""Values derived from several runs at once (``spec.Derived``).

Some claims are about a relation between runs, not one run's number:

- A "FLOPs-efficiency" claim (objective A reaches a loss in x% fewer steps
  than objective B at the same model and batch) is about two validation
  curves. These functions read the periodic validation evaluations of a
  run (``metrics.jsonl``) and find where one curve reaches another's
  bound. Both runs must use a learning rate that does not depend on the
  run's length (constant after warm-up), or the shorter run's curve is not
  a prefix of the longer one's.
- A gap between a diffusion model's bound and its AR twin's NLL, compared
  across tokenizers, is a difference of two runs in bits per character.
"""

from __future__ import annotations

import json
import os
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


def bits_per_char(workdir: str, chars_per_token: float) -> float:
  """A finished run's final validation bound (or NLL) in bits/character."""
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  return summary['validation']['bits_per_token'] / chars_per_token


def ar_gaps_of(pairs: Mapping[str, tuple[str, str]]):
  """A ``spec.Derived`` function: for each name, (diffusion arm, AR arm)
  -> the diffusion bound minus the AR NLL of that seed, in bits/char."""

  def fn(workdirs: Mapping[str, str]) -> dict[str, float]:
    from ddlm_jax.tasks.language_model import chars_per_token

    out = {}
    for name, (diffusion, ar) in pairs.items():
      # The two runs of a pair share the tokenizer: one ratio for both.
      cpt = chars_per_token(workdirs[diffusion])
      out[name] = bits_per_char(workdirs[diffusion], cpt) - bits_per_char(
        workdirs[ar], cpt
      )
    return out

  return fn
