"""Supervised fine-tuning: the prompt is never masked and never in the loss.

The gradient check adds a per-position perturbation to a real network's
logits and differentiates the train step's loss with respect to it: the
gradient must be exactly zero at every prompt position (and at response
positions left unmasked), nonzero at masked response positions. The loss
value must be LLaDA's: the mean over rows of the 1/t-weighted masked
response cross-entropy divided by the response length.
"""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.data import reasoning, sft_pairs
from ddlm_jax.data.settings import DataConfig
from ddlm_jax.diffusion import base
from ddlm_jax.diffusion.masked import token_cross_entropy
from ddlm_jax.models.llama_family import LlamaFamily, LlamaFamilyConfig
from ddlm_jax.training import steps
from ddlm_jax.training.config import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB, LENGTH = 13, 24


def _process():
  return base.process_config({'kind': 'mdlm_sft', 'schedule': 'linear'}).build(
    VOCAB
  )


def _batch():
  """Three rows with prompts of 3, 7 and 12 tokens."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, VOCAB, (3, LENGTH)).astype(np.int32)
  mask = np.ones((3, LENGTH), np.float32)
  for b, n in enumerate((3, 7, 12)):
    mask[b, :n] = 0.0
  return jnp.asarray(tokens), jnp.asarray(mask)


def _network():
  cfg = LlamaFamilyConfig(
    vocab_size=VOCAB + 1, width=32, depth=2, num_heads=4, num_kv_heads=2,
    mlp_dim=48, mask_token_id=VOCAB, data_vocab_size=VOCAB,
  )  # fmt: skip
  return nnx.split(LlamaFamily(cfg, rngs=nnx.Rngs(0)))


def _loss_fn(process, graphdef, params, seen):
  """The train step's loss with a perturbation delta added to the logits."""

  def loss(delta_BxLxV, key, tokens, mask):
    net = steps.make_apply(graphdef, params)

    def apply(z, t):
      seen.append(z)
      return net(z, t) + delta_BxLxV

    objective_B, _, _ = process.loss(apply, key, tokens, mask)
    return objective_B.sum() / mask.sum()  # steps._loss_and_metrics' sum.

  return loss


def test_prompt_positions_get_exactly_zero_gradient():
  process = _process()
  graphdef, params = _network()
  tokens, mask = _batch()
  seen = []
  loss = _loss_fn(process, graphdef, params, seen)
  delta = jnp.zeros((3, LENGTH, VOCAB))
  for seed in range(4):
    seen.clear()
    grad = jax.grad(loss)(delta, jax.random.key(seed), tokens, mask)
    z = np.asarray(seen[-1])
    per_position = np.abs(np.asarray(grad)).sum(-1)
    prompt = np.asarray(mask) == 0
    masked = z == process.mask_id
    assert not masked[prompt].any()  # The prompt is never masked.
    np.testing.assert_array_equal(z[prompt], np.asarray(tokens)[prompt])
    assert (per_position[prompt] == 0.0).all()
    assert (per_position[~prompt & ~masked] == 0.0).all()
    assert (per_position[masked] > 0).all() and masked.any()


def test_loss_is_llada_sft_normalised_per_response():
  """Through the train step: mean_b sum_masked CE / t_b / |r_b|."""
  process = _process()
  graphdef, params = _network()
  tokens, mask = _batch()
  seen = []
  apply = steps.make_apply(graphdef, params)

  def recording(z, t):
    seen.append((z, t))
    return apply(z, t)

  key = jax.random.key(7)
  value, metrics = steps._loss_and_metrics(
    params, graphdef, process, key, tokens, mask
  )
  del metrics
  # The same draw again, recorded, to compute the formula by hand.
  process.loss(recording, key, tokens, mask)
  z, t = (np.asarray(a) for a in seen[-1])
  ce = np.asarray(token_cross_entropy(apply(jnp.asarray(z), t), tokens))
  masked = z == process.mask_id
  length = np.asarray(mask).sum(-1)
  # The linear schedule's weight is 1/t (up to its eps guard and the
  # (1 - t_min) density factor of t ~ U[t_min, 1]).
  weight = np.asarray(process.time_weight(jnp.asarray(t)))
  np.testing.assert_allclose(weight, 1.0 / t, rtol=2e-3)
  want = np.mean((ce * masked).sum(-1) * weight / length)
  np.testing.assert_allclose(float(value), want, rtol=1e-5)


def test_arithmetic_pairs_are_right_and_masks_mark_the_response():
  pairs = sft_pairs.arithmetic_pairs(20, (1, 2, 3), seed=0)
  for prompt, response in pairs:
    question = prompt.removeprefix('Compute mod 10: ').removesuffix('=')
    answer = response.rstrip(';').split(';')[-1]
    assert int(answer) == reasoning.evaluate_question(question)
  source = sft_pairs.arithmetic_source(
    DataConfig(corpus='sft_arithmetic', sft_pairs={'validation': 8})
  )
  batch = source.eval_batches('validation', seq_len=40, batch_size=4)[0]
  tok = source.tokenizer
  end = sft_pairs.end_id(tok)
  for b in range(4):
    prompt, response = source.split('validation')[b]
    n = len(tok.encode(prompt))
    row, m = batch['tokens'][b], batch['loss_mask'][b]
    assert (m[:n] == 0).all() and (m[n:] == 1).all()
    assert tok.decode(row[:n]) == prompt
    assert tok.decode(row[n : n + len(response)]) == response
    assert (row[n + len(response) :] == end).all()
  with pytest.raises(ConfigError, match='raise data.seq_len'):
    source.eval_batches('validation', seq_len=20, batch_size=4)


@pytest.mark.slow
def test_sft_smoke_recipe_trains_through_experiments_run(tmp_path):
  """sft.py:smoke from scratch through the CLI: trains, evaluates the
  response bound and samples with the llada sampler."""
  out = subprocess.run(
    [sys.executable, '-m', 'experiments.run',
     '--config=experiments/configs/sft.py:smoke',
     f'--workdir={tmp_path}', '--config.mesh.shape=(1,1,1)'],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-2000:]
  config = json.loads((tmp_path / 'config.json').read_text())
  assert config['process']['kind'] == 'mdlm_sft'
  assert (tmp_path / 'samples.txt').read_text().count(
    'Compute mod 10: 3+4*2='
  ) == 2


@pytest.mark.slow
def test_sft_fine_tunes_a_converted_model(tmp_path):
  """sft.py:DIR,smoke starts from a converted LLaDA-family model (its
  parameters and tokenizer) and trains it through experiments.run."""
  torch = pytest.importorskip('torch', reason='conversion needs torch')
  transformers = pytest.importorskip(
    'transformers', reason='conversion needs transformers (interop extra)'
  )
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  from ddlm_jax.interop import workdir as workdir_lib
  from experiments import convert

  torch.manual_seed(0)
  hf = transformers.LlamaConfig(
    vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
  )  # fmt: skip
  transformers.LlamaForCausalLM(hf).save_pretrained(tmp_path / 'hf')
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  pairs = sft_pairs.arithmetic_pairs(200, (1, 2, 3), seed=5)
  tok.train_from_iterator(
    [p + r for p, r in pairs],
    trainers.BpeTrainer(
      vocab_size=90, special_tokens=['<|endoftext|>', '<|mdm_mask|>']
    ),
  )
  tok.save(str(tmp_path / 'hf' / 'tokenizer.json'))
  base_dir = tmp_path / 'base'
  assert convert.main(
    ['--from=hf', '--arch=llada', str(tmp_path / 'hf'), f'--to={base_dir}',
     '--mask_token_id=97', '--seq_len=32']
  ) == 0  # fmt: skip
  work = tmp_path / 'sft'
  out = subprocess.run(
    [sys.executable, '-m', 'experiments.run',
     f'--config=experiments/configs/sft.py:{base_dir},smoke',
     f'--workdir={work}', '--config.mesh.shape=(1,1,1)',
     '--config.sample.num_samples=0'],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-2000:]
  assert f'Initialised from {base_dir}' in out.stdout
  _, before = workdir_lib.load(str(base_dir))
  from ddlm_jax.tasks.language_model import load_run

  tuned = load_run(str(work))
  assert tuned.checkpointer.latest_step() == 6
  assert tuned.config.model.backbone == 'llada'
  emb = np.asarray(tuned.params['embedding'])
  assert np.abs(emb - np.asarray(before.embedding[...])).max() > 0
  tuned.close()
