"""Prompts of different lengths in one batch: each row as if run alone.

Row by row (sampling.rows): a row's draws depend on its own key only, and
padding after a short row is never read as content, so the batch gives
each row, token for token, what that row gives alone with the same seed.
Checked on a toy network, on a trained smoke run through the Python API,
and on a converted LLaDA-family model.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ddlm_jax
from ddlm_jax.api import masked_network
from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models.llama_family import LlamaFamily, LlamaFamilyConfig
from ddlm_jax.models.transformer import Transformer, TransformerConfig
from ddlm_jax.sampling import rows as rows_lib
from ddlm_jax.sampling.registry import get_sampler
from ddlm_jax.training.config import ConfigError

VOCAB, LENGTH = 11, 16
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=VOCAB)
SPECS = {
  'ancestral': dict(num_steps=8),
  'confidence': dict(tokens_per_step=2),
  'llada': dict(block_length=4, num_steps=8, temperature=1.0),
}
LENGTHS = (2, 5, 9)


def _toy(z_BxL, t_B):
  """Time-free toy network whose every position reads the whole row."""
  del t_B
  emb = jax.random.normal(jax.random.key(0), (VOCAB + 1, 8))
  out = jax.random.normal(jax.random.key(1), (8, VOCAB))
  h = emb[z_BxL] + jnp.mean(emb[z_BxL], axis=1, keepdims=True)
  return 2.0 * jnp.tanh(h) @ out


def _prompts(vocab=VOCAB, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, n).astype(np.int32) for n in LENGTHS]


@pytest.mark.parametrize('name', sorted(SPECS))
def test_rows_equal_rows_alone_on_a_toy_network(name):
  sampler = get_sampler(name, **SPECS[name])
  rows, _, _ = rows_lib.prompt_batch(
    _prompts(), LENGTH, generate_id=VOCAB, pad_id=0
  )
  run = jax.jit(
    lambda keys, rows: rows_lib.sample_rows(sampler, _toy, keys, PROCESS, rows)
  )
  seeds = [3, 4, 5]
  batch, nfe = run(rows_lib.row_keys(seeds), rows)
  for b, seed in enumerate(seeds):
    alone, nfe_alone = run(rows_lib.row_keys([seed]), rows[b : b + 1])
    np.testing.assert_array_equal(np.asarray(batch[b]), np.asarray(alone[0]))
    assert int(nfe[b]) == int(nfe_alone[0])
  if name == 'llada':
    assert (np.asarray(nfe) == SPECS[name]['num_steps']).all()
  # The plain batched call, by contrast, ties a row's draws to the batch.
  plain, _ = sampler(
    _toy, jax.random.key(3), PROCESS, batch=3, length=LENGTH,
    prompt_BxL=jnp.asarray(rows),
  )  # fmt: skip
  assert not (np.asarray(plain) == np.asarray(batch)).all()


def test_prompt_batch_layout_and_refusals():
  rows, valid, ends = rows_lib.prompt_batch(
    _prompts(), LENGTH, generate_id=VOCAB, pad_id=0, max_new_tokens=4
  )
  assert ends.tolist() == [6, 9, 13]
  for b, ids in enumerate(_prompts()):
    n = len(ids)
    np.testing.assert_array_equal(rows[b, :n], ids)
    assert (rows[b, n : n + 4] == VOCAB).all()
    assert (rows[b, n + 4 :] == 0).all()
    assert valid[b].sum() == n + 4 and valid[b, : n + 4].all()
  with pytest.raises(ValueError, match='max_new_tokens'):
    rows_lib.prompt_batch(
      _prompts(), LENGTH, generate_id=VOCAB, pad_id=0, max_new_tokens=8
    )


def _transformer():
  cfg = TransformerConfig(
    vocab_size=VOCAB, input_vocab_size=VOCAB + 1, width=32, depth=2,
    num_heads=4, time_conditioning=True, cond_dim=16,
  )  # fmt: skip
  return Transformer(cfg, rngs=nnx.Rngs(0))


def _llama():
  cfg = LlamaFamilyConfig(
    vocab_size=VOCAB + 1, width=32, depth=2, num_heads=4, num_kv_heads=2,
    mlp_dim=48, mask_token_id=VOCAB, data_vocab_size=VOCAB,
  )  # fmt: skip
  return LlamaFamily(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize('build', [_transformer, _llama])
def test_padding_is_never_read_as_content(build):
  """A row padded to LENGTH with its padding masked has, at every content
  position, the logits of the same row alone at its own length; without
  the mask the padding changes them."""
  graphdef, params = nnx.split(build())
  leaves, tree = jax.tree.flatten(params)  # Zero-initialised heads too.
  keys = jax.random.split(jax.random.key(2), len(leaves))
  leaves = [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  model = nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))
  ids = np.random.default_rng(1).integers(0, VOCAB, (1, 10)).astype(np.int32)
  ids[0, 6:] = VOCAB
  padded = np.concatenate([ids, np.full((1, 6), 3, np.int32)], axis=1)
  valid = np.arange(LENGTH)[None] < 10
  net = masked_network(model)(jnp.asarray(valid))
  got = np.asarray(net(jnp.asarray(padded), jnp.ones((1,))))
  alone = np.asarray(model(jnp.asarray(ids), jnp.ones((1,))))
  np.testing.assert_allclose(got[:, :10], alone, atol=1e-5)
  unmasked = np.asarray(model(jnp.asarray(padded), jnp.ones((1,))))
  assert np.abs(unmasked[:, :10] - alone).max() > 1e-3


def test_a_network_without_a_padding_mask_is_refused():
  class Plain(nnx.Module):
    pass

  with pytest.raises(ConfigError, match='omit max_new_tokens'):
    masked_network(Plain())


def _check_model_rows(model, specs, vocab):
  """Batch of prompts of lengths 2, 5, 9 against each row alone."""
  prompts = _prompts(vocab, seed=2)
  for spec in specs:
    sampler = model._sampler(model._sample_config(spec, None, {}))
    for new in (None, 8):
      tokens, ends = model.complete(
        prompts, sampler, seeds=[7, 8, 9], max_new_tokens=new
      )
      for b in range(3):
        alone, end = model.complete(
          [prompts[b]], sampler, seeds=[7 + b], max_new_tokens=new
        )
        np.testing.assert_array_equal(tokens[b], alone[0], err_msg=spec)
        assert ends[b] == end[0]
        np.testing.assert_array_equal(tokens[b, : LENGTHS[b]], prompts[b])
        mask_id = model.process.mask_id
        assert (tokens[b, : ends[b]] != mask_id).all()


GENERATE_SPECS = (
  'ancestral',
  'confidence:tokens_per_step=2',
  'llada:block_length=4,num_steps=8',
)


@pytest.mark.slow
def test_smoke_run_rows_equal_rows_alone(smoke_mdlm_run):
  model = ddlm_jax.load(smoke_mdlm_run[0])
  _check_model_rows(model, GENERATE_SPECS, model.process.vocab_size)
  texts = model.generate(['ab', 'hello'], seed=[1, 2], max_new_tokens=6)
  assert texts[1] == model.generate(['hello'], seed=[2], max_new_tokens=6)[0]
  assert texts[0].startswith('ab') and texts[1].startswith('hello')
  with pytest.raises(ValueError, match='one seed per prompt'):
    model.generate(['ab', 'cd'], seed=[1])


@pytest.mark.slow
def test_converted_llada_rows_equal_rows_alone(tmp_path):
  torch = pytest.importorskip('torch', reason='conversion needs torch')
  transformers = pytest.importorskip(
    'transformers', reason='conversion needs transformers (interop extra)'
  )
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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
  tok.train_from_iterator(
    ['the cat sat on the mat'] * 20,
    trainers.BpeTrainer(
      vocab_size=90, special_tokens=['<|endoftext|>', '<|mdm_mask|>']
    ),
  )
  tok.save(str(tmp_path / 'hf' / 'tokenizer.json'))
  work = tmp_path / 'work'
  assert convert.main(
    ['--from=hf', '--arch=llada', str(tmp_path / 'hf'), f'--to={work}',
     '--mask_token_id=97', '--seq_len=24']
  ) == 0  # fmt: skip
  model = ddlm_jax.load(str(work))
  _check_model_rows(model, GENERATE_SPECS, model.process.vocab_size)


def test_prompt_files_text_and_jsonl(tmp_path):
  from ddlm_jax.evaluation.prompt_file import read_prompts

  text = tmp_path / 'p.txt'
  text.write_text('first prompt\n\n  second\n')
  assert read_prompts(str(text)) == ['first prompt', '  second']
  lines = tmp_path / 'p.jsonl'
  lines.write_text('{"prompt": "two\\nlines"}\n"bare"\n\n')
  assert read_prompts(str(lines)) == ['two\nlines', 'bare']
  lines.write_text('{"text": "x"}\n')
  with pytest.raises(ConfigError, match='line 1: no "prompt"'):
    read_prompts(str(lines))
  lines.write_text('{oops\n')
  with pytest.raises(ConfigError, match='line 1: not JSON'):
    read_prompts(str(lines))
  (tmp_path / 'empty.txt').write_text('\n')
  with pytest.raises(ConfigError, match='holds no prompt'):
    read_prompts(str(tmp_path / 'empty.txt'))
  with pytest.raises(ConfigError, match='no such file'):
    read_prompts(str(tmp_path / 'missing.txt'))


@pytest.mark.slow
def test_cli_prompt_file_writes_the_api_texts(smoke_mdlm_run, tmp_path):
  """--mode=sample --prompt_file: one sample per prompt, each the text the
  Python API gives that prompt with the same row seed."""
  import json
  import pathlib
  import shutil
  import subprocess
  import sys

  root = pathlib.Path(__file__).resolve().parents[1]
  work = tmp_path / 'run'
  shutil.copytree(smoke_mdlm_run[0], work)
  prompts = ['ab', 'the cat', 'hello there']
  path = tmp_path / 'prompts.jsonl'
  path.write_text(''.join(json.dumps({'prompt': p}) + '\n' for p in prompts))
  spec = 'llada:block_length=4,num_steps=6'
  out = subprocess.run(
    [sys.executable, '-m', 'experiments.run', f'--workdir={work}',
     '--config=experiments/configs/quickstart.py:smoke',
     f'--config.sample.sampler={spec}', '--mode=sample',
     f'--prompt_file={path}', '--max_new_tokens=6'],
    cwd=root, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr
  stats = json.loads((work / 'sample_stats.json').read_text())
  assert stats['sampler'] == 'llada' and stats['nfe'] == 6
  written = (work / 'samples.txt').read_text()
  model = ddlm_jax.load(str(work))
  want = model.generate(prompts, sampler=spec, max_new_tokens=6)
  assert written == ''.join(
    f'=== sample {i} ===\n{t}\n\n' for i, t in enumerate(want)
  )
  bad = subprocess.run(
    [sys.executable, '-m', 'experiments.run', f'--workdir={work}',
     '--mode=eval', f'--prompt_file={path}'],
    cwd=root, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert bad.returncode != 0
  assert '--prompt_file and --max_new_tokens belong to --mode=sample' in (
    bad.stderr
  )
