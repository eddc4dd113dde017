"""A run's ConfigDict becomes typed blocks in one function.

`ddlm_jax.training.builders.typed_blocks` is the only library code that
reads a raw `config.process` or `config.data` block (the saved-config
migration of `training/config.py` aside, which rewrites the raw dict
before any conversion). Every module below the entry points reads the
frozen `RunSettings` it returns; the AST scan here fails when one reads a
raw block again.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib

import pytest

from ddlm_jax.data.settings import DataConfig
from ddlm_jax.diffusion.base import ProcessConfig
from ddlm_jax.training import builders
from ddlm_jax.training.config import ConfigError, TrainerConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = ('data', 'process')
CONFIG_NAMES = ('config', 'cfg')
CONVERTERS = ('process_settings', 'data_settings')
# Where a raw block may be read: the one conversion, and the migration of
# a saved config's raw dict (it runs before the conversion).
ALLOWED = {
  'ddlm_jax/training/builders.py': 'typed_blocks',
  'ddlm_jax/training/config.py': None,
}


def _config_like(node) -> bool:
  """Whether `node` spells a config: `config`, `cfg`, `x.config`."""
  if isinstance(node, ast.Name):
    return node.id in CONFIG_NAMES
  return isinstance(node, ast.Attribute) and node.attr in CONFIG_NAMES


def _raw_read(node) -> str | None:
  """The raw-block read `node` is (as source), or None."""
  if isinstance(node, ast.Attribute):
    if node.attr in BLOCKS and _config_like(node.value):
      return ast.unparse(node)
  elif isinstance(node, ast.Subscript):
    key = node.slice
    if (
      isinstance(key, ast.Constant)
      and key.value in BLOCKS
      and _config_like(node.value)
    ):
      return ast.unparse(node)
  elif isinstance(node, ast.Call):
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else None
    name = func.id if isinstance(func, ast.Name) else name
    if name in CONVERTERS:
      return ast.unparse(node)
    if (
      name == 'get'
      and isinstance(func, ast.Attribute)
      and _config_like(func.value)
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and node.args[0].value in BLOCKS
    ):
      return ast.unparse(node)
  return None


def raw_block_reads(source: str, filename: str = '<src>', allowed=None):
  """'file:line read' for each raw config.process / config.data read.

  allowed: the name of the one function whose reads are the conversion
  (None: every read counts).
  """
  tree = ast.parse(source, filename=filename)
  skip = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef) and node.name == allowed:
      skip.update(id(sub) for sub in ast.walk(node))
  out = []
  for node in ast.walk(tree):
    read = None if id(node) in skip else _raw_read(node)
    if read:
      out.append(f'{filename}:{node.lineno} {read}')
  return sorted(out)


def test_no_library_module_reads_a_raw_process_or_data_block():
  found = []
  for path in sorted((ROOT / 'ddlm_jax').rglob('*.py')):
    name = str(path.relative_to(ROOT))
    if name in ALLOWED and ALLOWED[name] is None:
      continue
    found += raw_block_reads(path.read_text(), name, ALLOWED.get(name))
  assert not found, (
    'read RunSettings (builders.typed_blocks, converted by the entry '
    'point) instead:\n' + '\n'.join(found)
  )


def test_the_scan_finds_planted_reads():
  src = (
    'def typed_blocks(config):\n'
    '  return config.data, process_settings(config.process)\n'
    'def f(run, config, cfg, settings):\n'
    '  a = run.config.data.seq_len\n'
    "  b = config.process.kind + cfg['data']\n"
    "  c = builders.data_settings(cfg.get('process'))\n"
    '  d = settings.data.seq_len + run.process.causal\n'  # typed: fine
    "  e = mesh.shape['data']\n"  # not a config: fine
  )
  found = [r.split()[0] for r in raw_block_reads(src, allowed='typed_blocks')]
  assert found == ['<src>:4', '<src>:5', '<src>:5', '<src>:6', '<src>:6']
  assert len(raw_block_reads(src)) == 8  # The conversion's 3 reads too.


def _config(name='quickstart', arg='smoke'):
  return importlib.import_module(f'experiments.configs.{name}').get_config(arg)


def test_typed_blocks_are_frozen_and_typed():
  config = _config()
  settings = builders.typed_blocks(config)
  assert isinstance(settings.process, ProcessConfig)
  assert isinstance(settings.data, DataConfig)
  assert isinstance(settings.trainer, TrainerConfig)
  assert settings.process.kind == config.process.kind
  assert settings.data.seq_len == config.data.seq_len
  assert settings.data.corpus == config.data.corpus
  assert settings.trainer.num_steps == config.train.num_steps
  assert settings.optimizer.learning_rate == config.optim.learning_rate
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.data = DataConfig()


@pytest.mark.parametrize(
  'block, key, closest',
  [('data', 'seq_lne', 'seq_len'), ('process', 'antithetc', 'antithetic')],
)
def test_a_misspelt_key_is_refused_naming_the_closest(block, key, closest):
  config = _config()
  with config.unlocked():
    config[block][key] = 1
  with pytest.raises(ConfigError, match=f'did you mean {block}.{closest}'):
    builders.typed_blocks(config)


def test_data_seq_len_out_of_range_is_refused():
  config = _config()
  config.data.seq_len = 0
  with pytest.raises(ConfigError, match='data.seq_len'):
    builders.typed_blocks(config)


def test_prepare_data_takes_typed_settings_only():
  with pytest.raises(TypeError, match='typed_blocks'):
    builders.prepare_data(_config().data, None)


def test_the_command_line_converts_once_and_hands_the_settings_down(
  monkeypatch, tmp_path
):
  from ddlm_jax.tasks import language_model
  from experiments import modes

  calls, seen = [], {}
  convert = builders.typed_blocks

  def counting(config):
    calls.append(config)
    return convert(config)

  def mode(config, workdir, *, settings=None, allow_fresh_start=False):
    seen['settings'] = settings
    return {}

  monkeypatch.setattr(builders, 'typed_blocks', counting)
  monkeypatch.setattr(language_model, 'train_and_evaluate', mode)
  modes.run(_config(), str(tmp_path), 'train')
  assert len(calls) == 1
  assert isinstance(seen['settings'], builders.RunSettings)
  assert seen['settings'].process.kind == _config().process.kind
