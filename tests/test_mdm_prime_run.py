"""MDM-Prime through the run config and `experiments.run`.

The config's variants build the processes they name, bad settings are
refused before anything runs, and `mdm_prime.py:smoke` trains, evaluates
and samples through the CLI (eval and sample from the workdir alone).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import base, prime
from ddlm_jax.diffusion.schedules import LogLinearSchedule
from ddlm_jax.models.transformer import Transformer, TransformerConfig
from ddlm_jax.training.builders import check_process, process_settings
from ddlm_jax.training.config import ConfigError
from experiments.configs import mdm_prime

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
  'arg,subtokens,base_',
  [('', 2, 46), ('l2', 2, 46), ('binary', 11, 2), ('binary,smoke', 9, 2)],
)
def test_variants_build_their_processes(arg, subtokens, base_):
  c = mdm_prime.get_config(arg)
  vocab = c.data.bpe_vocab_size  # 2048, or 300 for the smoke preset
  process = base.process_config(c.process.to_dict()).build(vocab)
  assert isinstance(process, prime.PrimeDiffusion)
  assert (process.subtokens, process.base) == (subtokens, base_)
  assert c.sample.sampler == 'prime_ancestral'
  assert c.process.schedule == 'loglinear' and c.process.t_min == 1e-3


def test_bad_settings_are_refused_before_running():
  c = mdm_prime.get_config('smoke')
  block = dict(c.process.to_dict(), binary=True, subtokens=3)
  with pytest.raises(ConfigError, match='leave subtokens at 2'):
    process_settings(block)
  block = dict(c.process.to_dict(), subtokens=0)
  with pytest.raises(ConfigError, match='subtokens must be >= 1'):
    check_process(base.process_config(block), c.model, c.data.seq_len)
  model = dict(c.model.to_dict(), backbone='hybrid')
  with pytest.raises(ConfigError, match="model.backbone='transformer'"):
    check_process(base.process_config(c.process.to_dict()), model, 32)
  with pytest.raises(ValueError, match='expected \\[VARIANT\\]'):
    mdm_prime.get_config('l7')


@pytest.mark.parametrize('subtokens', [2, 9])
def test_the_transformer_trains_on_sub_token_rows(subtokens):
  """The real network reads the multi-hot rows; the loss and its gradient
  are finite although carry-over puts -inf in the logits, and a few SGD
  steps lower it."""
  vocab = 300
  process = prime.PrimeDiffusion(
    schedule=LogLinearSchedule(), vocab_size=vocab, subtokens=subtokens,
    t_min=1e-3,
  )  # fmt: skip
  cfg = TransformerConfig(
    vocab_size=vocab, input_vocab_size=process.input_vocab_size, width=32,
    depth=1, num_heads=2,
  )  # fmt: skip
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  x = jax.random.randint(jax.random.key(0), (8, 16), 0, 40)  # 40 ids used

  @jax.jit
  def loss_and_grad(params, key):
    def loss(params):
      apply = nnx.merge(graphdef, params)
      return process.loss(apply, key, x)[0].mean()

    return jax.value_and_grad(loss)(params)

  keys = jax.random.split(jax.random.key(1), 31)
  held_out = keys[:8]
  start = np.mean([float(loss_and_grad(params, k)[0]) for k in held_out])
  for key in keys[8:]:
    _, grads = loss_and_grad(params, key)
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
  end = np.mean([float(loss_and_grad(params, k)[0]) for k in held_out])
  assert np.isfinite(start) and end < start, (start, end)


def _run(workdir, *args):
  cmd = [sys.executable, '-m', 'experiments.run', f'--workdir={workdir}']
  out = subprocess.run(
    cmd + list(args), cwd=ROOT, capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_smoke_trains_evaluates_and_samples_through_the_cli(tmp_path):
  workdir = tmp_path / 'prime'
  _run(workdir, '--config=experiments/configs/mdm_prime.py:smoke')
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['process']['kind'] == 'mdm_prime'
  assert saved['process']['subtokens'] == 2
  records = [
    json.loads(line)
    for line in (workdir / 'metrics.jsonl').read_text().splitlines()
  ]
  assert any('loss' in r for r in records)
  _run(workdir, '--mode=eval')
  evaluation = json.loads((workdir / 'eval_validation.json').read_text())
  assert evaluation['bits_per_token'] > 0
  _run(workdir, '--mode=sample')
  stats = json.loads((workdir / 'sample_stats_2.json').read_text())
  assert stats['sampler'] == 'prime_ancestral'
  assert 1 <= stats['nfe'] <= stats['steps']
  assert (workdir / 'samples_2.txt').read_text().strip()
