"""Nonsense is refused before compute, with the key, and nothing written.

Each case goes through `lm.train_and_evaluate` on the quickstart smoke
config; the error must come before any training, data or file (the
workdir is left empty: the lock file goes with the lock).
"""

import os

import pytest

from ddlm_jax.tasks import language_model as lm
from ddlm_jax.training.config import ConfigError
from experiments.configs import ar_quickstart, quickstart
from experiments.configs.common import override


def _config(**overrides):
  c = quickstart.get_config('smoke')
  c.mesh.shape = (1, 1, 1)
  return override(c, overrides)


@pytest.mark.parametrize(
  'overrides,match',
  [
    ({'train.num_steps': -5}, r'train.num_steps=-5: must be in \[1'),
    ({'train.halt_after_steps': -1}, 'train.halt_after_steps=-1'),
    ({'train.checkpoint_every': -1}, 'train.checkpoint_every=-1'),
    ({'train.log_every': 0}, 'train.log_every=0'),
    ({'train.max_checkpoints': 0}, 'train.max_checkpoints=0'),
    ({'optim.learning_rate': -1e-3}, 'optim.learning_rate=-0.001'),
    ({'optim.warmup_steps': -1}, 'optim.warmup_steps=-1'),
    ({'model.depth': 0}, 'model.depth=0'),
    ({'model.width': 30}, 'not divisible by model.num_heads'),
    ({'eval.batch_size': 0}, 'eval.batch_size=0'),
    ({'sample.sampler': 'ancestrall'}, 'ancestrall'),
    ({'sample.sampler': 'eb:gamma=-1'}, 'gamma'),
    ({'sample.top_p': 1.5}, r'sample.top_p=1.5: must be in \(0, 1\]'),
    ({'sample.temperature': 0.0}, 'sample.temperature=0.0'),
    ({'sample.num_samples': -2}, 'sample.num_samples=-2'),
    ({'process.kind': 'mdml'}, "process.kind='mdml'"),
    ({'mesh.shape': (0, 1, 1)}, 'mesh.shape'),
    ({'data.seq_len': 0}, 'data.seq_len=0'),
    ({'train.batch_size': -8}, 'train.batch_size=-8'),
    # Process families: a sampler that does not apply, a
    # uniform process without time conditioning, nonsense process options.
    ({'sample.sampler': 'uniform_ancestral'}, 'for a masked process use'),
    ({'sample.sampler': 'block'}, 'block applies to block processes'),
    ({'process.kind': 'udlm'}, 'model.time_conditioning=True'),
    (
      {'process.kind': 'udlm', 'model.time_conditioning': True},
      'ancestral applies to masked processes; for a uniform process use one '
      "of \\['loo_gibbs', 'psi', 'uniform_ancestral'\\]",
    ),
    (
      {
        'process.kind': 'udlm',
        'model.time_conditioning': True,
        'process.parameterization': 'plugin',
      },
      'parameterization',
    ),
    (
      {
        'process.kind': 'interpolating',
        'model.time_conditioning': True,
        'process.mixing': 1.5,
        'sample.sampler': 'psi',
      },
      'mixing',
    ),
    (
      {
        'process.kind': 'bd3',
        'process.block_size': 5,
        'sample.sampler': 'block',
      },
      'does not divide data.seq_len=32',
    ),
    (
      {
        'process.kind': 'bd3',
        'process.block_size': 64,
        'sample.sampler': 'block',
      },
      'process.block_size=64 does not divide',
    ),
    (
      {
        'process.kind': 'bd3',
        'model.backbone': 'hybrid',
        'sample.sampler': 'block',
      },
      'transformer backbone',
    ),
    (
      {
        'process.kind': 'bd3',
        'model.attention_impl': 'cudnn',
        'sample.sampler': 'block',
      },
      "attention_impl='cudnn' has no 'block_diffusion' mask",
    ),
    ({'model.attention_impl': 'flash'}, "attention_impl='flash'"),
    ({'process.bound': 'fulll'}, "bound_kind='fulll'"),
    ({'sample.scorer': '/nonexistent/ar_run'}, 'train the AR scorer run'),
    (
      {
        'process.kind': 'bd3',
        'model.time_conditioning': True,
        'sample.sampler': 'block',
      },
      'block diffusion is time-free',
    ),
    ({'model.time_conditioning': True}, 'caching needs a time-free network'),
    (
      {'process.kind': 'bd3', 'sample.sampler': 'block:inner=loo_gibbs'},
      "inner sampler 'loo_gibbs'",
    ),
    (
      {
        'process.kind': 'duo',
        'model.time_conditioning': True,
        'process.curriculum_steps': 3,
        'process.tau': 0.0,
        'sample.sampler': 'uniform_ancestral',
      },
      'tau',
    ),
    (
      {
        'process.kind': 'udlm',
        'model.time_conditioning': True,
        'soft_mask.enabled': True,
        'sample.sampler': 'uniform_ancestral',
      },
      'soft_mask.enabled needs a masked-diffusion process',
    ),
  ],
)
def test_refused_before_anything_runs(tmp_path, overrides, match):
  workdir = tmp_path / 'run'
  with pytest.raises(ValueError, match=match):
    lm.train_and_evaluate(_config(**overrides), str(workdir))
  assert not workdir.exists() or os.listdir(workdir) == []


def test_config_errors_are_value_errors_with_one_line():
  with pytest.raises(ConfigError) as err:
    lm.train_and_evaluate(_config(**{'train.num_steps': 0}), '/nonexistent')
  assert '\n' not in str(err.value)


def test_ar_run_refuses_a_diffusion_sampler_spec(tmp_path):
  c = ar_quickstart.get_config('smoke')
  c.mesh.shape = (1, 1, 1)
  c.sample.sampler = 'eb:gamma=0.5'
  with pytest.raises(ValueError, match='AR run samples left to right'):
    lm.train_and_evaluate(c, str(tmp_path / 'ar'))
  assert not (tmp_path / 'ar' / 'config.json').exists()
