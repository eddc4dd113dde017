"""One argument parser for every config (`experiments.configs.common`).

Each config declares the parts its argument takes (`Choice`, `Flag`) and
the presets it knows; `common.parse_arg` reads them all, and a misspelt
part fails in one line naming the closest valid value.
"""

import importlib
import pathlib
import re

import pytest

from experiments import discover
from experiments.configs import common
from experiments.configs.common import Choice, Flag, parse_arg

CONFIG_DIR = pathlib.Path(common.__file__).parent
SLOTS = (Choice('block', (4, 8, 16)), Flag('scratch'))


def test_only_common_defines_an_argument_parser():
  defining = sorted(
    p.stem
    for p in CONFIG_DIR.glob('*.py')
    if re.search(r'^def parse_arg\(', p.read_text(), re.M)
  )
  assert defining == ['common']


@pytest.mark.parametrize(
  'arg,want',
  [
    ('8', (8, False, '')),
    ('8,scratch', (8, True, '')),
    ('16,smoke', (16, False, 'smoke')),
    (' 4 , scratch , smoke ', (4, True, 'smoke')),
  ],
)
def test_parts_are_read_in_order_and_optional_ones_default(arg, want):
  assert parse_arg(arg, *SLOTS) == want


def test_optional_choice_takes_its_default_when_left_out():
  slots = (Choice('pipeline', ('a', 'b')), Choice('task', ('x', 'y'), 'x'))
  assert parse_arg('b', *slots) == ('b', 'x', '')
  assert parse_arg('b,y,cpu', *slots, presets=('', 'cpu')) == ('b', 'y', 'cpu')
  assert parse_arg('a,cpu', *slots, presets=('', 'cpu')) == ('a', 'x', 'cpu')
  assert parse_arg(None) == ('',)


@pytest.mark.parametrize(
  'arg,message',
  [
    ('8,smok', "unknown preset 'smok' (did you mean 'smoke'?)"),
    ('8,scrach', "unknown option 'scrach' (did you mean 'scratch'?)"),
    ('9', "unknown block '9'"),
    ('', 'no block given'),
    ('8,,smoke', 'an empty part'),
    ('8,scratch,smoke,x', "'x' is one part too many"),
  ],
)
def test_bad_argument_is_one_line_naming_the_problem_and_form(arg, message):
  with pytest.raises(ValueError) as err:
    parse_arg(arg, *SLOTS)
  text = str(err.value)
  assert '\n' not in text and message in text
  assert 'expected BLOCK[,scratch][,smoke] with BLOCK one of (4, 8, 16)' in text


@pytest.mark.parametrize('name', discover.config_names())
def test_every_config_refuses_a_misspelt_preset_naming_smoke(name):
  module = importlib.import_module(f'experiments.configs.{name}')
  smoke = getattr(module, 'SMOKE_ARG', 'smoke')
  misspelt = smoke[: -len('smoke')] + 'smoek'
  with pytest.raises(ValueError, match="did you mean 'smoke'"):
    module.get_config(misspelt)
  steps = _num_steps(module.get_config(smoke).to_dict())
  assert steps and max(steps) <= 50, steps  # The preset really is a smoke.


def _num_steps(block) -> list[int]:
  """Every `num_steps` value of a nested config dict (stages included)."""
  found = []
  for key, value in block.items():
    if isinstance(value, dict):
      found += _num_steps(value)
    elif key == 'num_steps':
      found.append(value)
  return found
