"""What each config kind runs: the dispatch behind experiments.run.

Kept apart from run.py (which defines absl flags at import) so tests and
scripts can dispatch without flags.
"""

from ddlm_jax.planning.trainer import run_planner_executor
from ddlm_jax.training import classification, loop, plan

MODES = {
  'lm': ('train', 'eval', 'sample', 'plan'),
  'state_tracking': ('train', 'eval', 'plan'),
  'planner_executor': ('train', 'eval', 'plan'),
}


def check_mode(config, mode: str) -> str:
  """The config's declared kind, if it can run `mode` (else a clear error)."""
  kind = config.get('kind', 'lm')
  if kind not in MODES:
    raise ValueError(
      f'config.kind={kind!r} is not a task kind; choose one of {sorted(MODES)}.'
    )
  if mode not in MODES[kind]:
    raise ValueError(
      f'--mode={mode}: {kind} configs run --mode='
      f'{"|".join(MODES[kind])}; nothing was run.'
    )
  return kind


def run(config, workdir: str, mode: str = 'train', split: str = 'validation'):
  """Runs `mode` for the config's kind; returns its summary or result."""
  kind = check_mode(config, mode)
  if mode == 'plan':  # In-process: the devices this process already has.
    return plan.write_plan(config, workdir)
  if kind == 'state_tracking':
    if mode == 'eval':
      return classification.evaluate_checkpoint(config, workdir)
    return classification.train_state_tracking(config, workdir)
  if kind == 'planner_executor':
    return run_planner_executor(config, workdir, mode=mode)
  if mode == 'eval':
    return loop.evaluate_checkpoint(config, workdir, split)
  if mode == 'sample':
    return loop.sample_checkpoint(config, workdir)
  return loop.train_and_evaluate(config, workdir)
