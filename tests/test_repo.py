"""The README's test command is what CI runs, and the configs load."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
  readme = (ROOT / 'README.md').read_text()
  blocks = re.findall(r'```bash\n(.*?)\n\s*```', readme, re.S)
  test_cmds = [b for b in blocks if 'pytest' in b]
  assert len(test_cmds) == 1, test_cmds
  ci = (ROOT / '.ci' / 'run').read_text()
  assert test_cmds[0].strip() in ci.splitlines()


@pytest.mark.parametrize(
  'name', sorted(p.stem for p in (ROOT / 'experiments/configs').glob('*.py'))
)
def test_every_config_has_a_docstring_with_its_command(name):
  if name in ('__init__', 'common'):
    return
  import importlib

  module = importlib.import_module(f'experiments.configs.{name}')
  assert module.__doc__ and 'python -m experiments.run' in module.__doc__
  # Configs with arguments (e.g. 'MODEL,TASK') name their smoke argument.
  config = module.get_config(getattr(module, 'SMOKE_ARG', 'smoke'))
  # Smoke presets train at most 50 steps (planner configs: per stage).
  steps = config.train.get('num_steps') or config.train.max_stage_steps
  assert 0 < steps <= 50
