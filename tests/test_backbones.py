"""The backbone registry: a run's network comes from its registered name.

The builders of a run name no backbone (they import nothing of
`ddlm_jax.interop`); LLaDA / Dream register themselves when their module
is imported, which the registry does on a lookup miss.
"""

import ast
import pathlib

import jax.numpy as jnp
import pytest
from flax import nnx

from ddlm_jax.models import backbones
from ddlm_jax.training import builders
from ddlm_jax.training.config import ConfigError
from experiments.configs import quickstart

ROOT = pathlib.Path(__file__).resolve().parents[1]


class _Toy(nnx.Module):
  """A stand-in network: embeddings straight to logits."""

  def __init__(self, vocab: int, width: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, width, rngs=rngs)
    self.out = nnx.Linear(width, vocab, rngs=rngs)

  def __call__(self, x_BxL):
    return self.out(self.embed(x_BxL))


def _settings_and_process(c, vocab=11):
  settings = builders.process_settings(c.process)
  return builders.make_process(settings, vocab)


def test_a_backbone_registered_from_outside_is_built_by_name():
  seen = {}

  def config(model, process):
    seen['model'] = dict(model)
    return {'vocab': process.input_vocab_size, 'width': model['width']}

  def build(mcfg, model, rngs):
    return _Toy(mcfg['vocab'], mcfg['width'], rngs)

  backbones.register_backbone('toy_test', config, build)
  c = quickstart.get_config('smoke')
  c.model.backbone = 'toy_test'
  process = _settings_and_process(c)
  assert builders.model_config(c.model, process)['width'] == c.model.width
  net = builders.model_builder(c.model, process)(nnx.Rngs(0))
  assert isinstance(net, _Toy) and seen['model']['backbone'] == 'toy_test'
  logits = net(jnp.zeros((2, 5), jnp.int32))
  assert logits.shape == (2, 5, process.input_vocab_size)


def test_built_in_backbones_build_their_networks():
  c = quickstart.get_config('smoke')
  process = _settings_and_process(c)
  from ddlm_jax.models import hybrid
  from ddlm_jax.models.transformer import Transformer

  net = builders.model_builder(c.model, process)(nnx.Rngs(0))
  assert type(net) is Transformer
  c.model.backbone, c.model.pattern = 'hybrid', 'S'
  net = builders.model_builder(c.model, process)(nnx.Rngs(0))
  assert type(net) is hybrid.HybridTransformer
  c.model.pattern = 'SA'  # depth 1: refused before any network is built.
  with pytest.raises(ValueError, match='pattern'):
    builders.model_builder(c.model, process)


def test_unknown_backbone_names_the_closest():
  c = quickstart.get_config('smoke')
  c.model.backbone = 'transfomer'
  with pytest.raises(ConfigError, match="did you mean 'transformer'"):
    builders.model_config(c.model, _settings_and_process(c))


def test_imported_architectures_register_themselves_on_first_lookup():
  for arch in ('llada', 'dream'):
    assert backbones.get_backbone(arch).name == arch
  from ddlm_jax.interop import llama_family

  assert backbones.get_backbone('llada').config is llama_family.run_model_config


def test_run_builders_import_no_interop_module():
  path = ROOT / 'ddlm_jax' / 'training' / 'builders.py'
  names = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom):
      names += [f'{node.module}.{a.name}' for a in node.names]
    elif isinstance(node, ast.Import):
      names += [a.name for a in node.names]
  assert names and not [n for n in names if n.startswith('ddlm_jax.interop')]
