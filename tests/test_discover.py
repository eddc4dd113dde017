"""--list and --describe: what can be run, and what every key means."""

import pathlib
import subprocess
import sys

import pytest

from experiments import discover
from experiments.configs import bd3_quickstart, common, quickstart

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_config_file_is_listed_with_its_argument():
  files = sorted(
    p.stem
    for p in (ROOT / 'experiments' / 'configs').glob('*.py')
    if 'def get_config(' in p.read_text()
  )
  assert discover.config_names() == files
  text = discover.list_configs()
  for name in files:
    assert f'  {name} ' in text
  assert 'quickstart         :[smoke]' in text
  assert ':BLOCK[,scratch][,smoke] with BLOCK one of (4, 8, 16)' in text
  assert ':MODEL,TASK[,preset]' in text
  assert 'PIPELINE[,TASK][,cpu|smoke]' in text


def test_argument_form_comes_from_the_parser_itself():
  assert discover.argument_form(quickstart) == '[smoke]'
  form = discover.argument_form(bd3_quickstart)
  assert form.startswith('BLOCK[,scratch][,smoke]')


def test_key_comments_reads_line_and_block_comments():
  source = (
    'def get_config():\n'
    '  c = X()\n'
    '  # Explains a,\n'
    '  # on two lines.\n'
    '  c.a = 1\n'
    '  c.b.c = 2  # Explains b.c.\n'
    '  c.d = 3\n'
    '  x = 4  # Not a key.\n'
  )
  got = discover.key_comments(source)
  assert got == {'a': 'Explains a, on two lines.', 'b.c': 'Explains b.c.'}


def test_describe_shows_every_key_value_and_comment():
  text = discover.describe('quickstart:smoke')
  lines = text.splitlines()
  flat = discover._flat(quickstart.get_config('smoke'))
  for key, value in flat.items():
    hits = [ln for ln in lines if ln[2:].startswith(f'{key} = ')]
    assert len(hits) == 1, key
    assert f'{key} = {value!r}' in hits[0]
  (seq,) = [ln for ln in lines if ln[2:].startswith('data.seq_len = ')]
  assert seq.startswith('* ')  # The smoke preset changed it.
  (corpus,) = [ln for ln in lines if ln[2:].startswith('data.corpus = ')]
  assert corpus.startswith('  ') and "# Text corpora: 'shakespeare'" in corpus
  assert any(ln.startswith('[sample]') for ln in lines)
  base = discover._flat(common.base_config())
  assert set(base) <= set(flat)


def test_describe_marks_other_kinds_against_their_own_default():
  text = discover.describe('state_tracking:pdssm,parity,smoke')
  assert "(* = differs from state_tracking's default;" in text
  lines = text.splitlines()
  (kind,) = [ln for ln in lines if ln[2:].startswith('kind = ')]
  assert kind.startswith('  ')  # Same kind as the default: unmarked.
  assert any(ln.startswith('* train.num_steps = ') for ln in lines)


def test_describe_refuses_an_unknown_config_in_one_line():
  with pytest.raises(ValueError, match='no config .nosuch.; choose one of'):
    discover.describe('nosuch')


def test_cli_list_and_describe_need_no_config_or_workdir():
  def cli(*args):
    return subprocess.run(
      [sys.executable, '-m', 'experiments.run', *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
    )

  out = cli('--list')
  assert out.returncode == 0, out.stderr
  assert 'quickstart' in out.stdout and 'state_tracking' in out.stdout
  out = cli('--describe=experiments/configs/quickstart.py:smoke')
  assert out.returncode == 0, out.stderr
  assert '* train.num_steps = 6' in out.stdout
  out = cli('--describe', 'nosuch')
  assert out.returncode == 2
  assert out.stderr.count('\n') == 1 and 'no config' in out.stderr
  out = cli('--help')
  assert '--describe' in out.stdout and '--[no]list' in out.stdout
