"""LLaDA- and Dream-family parity against transformers' LLaMA and Qwen2.

The references are `transformers`' own LlamaForCausalLM / Qwen2ForCausalLM,
randomly initialised at a tiny size, run bidirectionally the way the
published models run (a prepared 4-D additive mask is used as is, so no
causal mask is built) and saved with their own `save_pretrained`. Our
converter reads the saved directory; both models see the same ids, with
mask ids and padding, and their logits must agree.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch', reason='parity needs torch (interop)')
transformers = pytest.importorskip(
  'transformers', reason='parity needs transformers (interop extra)'
)

from ddlm_jax.interop import llama_family as interop  # noqa: E402
from ddlm_jax.interop import safetensors_io  # noqa: E402
from ddlm_jax.models.llama_family import (  # noqa: E402
  FORBIDDEN_LOGIT,
  LlamaFamily,
)
from ddlm_jax.parallel import make_mesh  # noqa: E402
from ddlm_jax.training.config import ConfigError  # noqa: E402

VOCAB, MASK_ID, PAD_ID = 100, 97, 0
TOL = {'float32': 1e-4, 'bfloat16': 2e-2}


def _hf_config(arch: str):
  kw = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=PAD_ID,
  )
  if arch == 'llada':
    return transformers.LlamaConfig(rms_norm_eps=1e-5, **kw)
  return transformers.Qwen2Config(
    rms_norm_eps=1e-6,
    rope_parameters={'rope_type': 'default', 'rope_theta': 1e6},
    **kw,
  )


def _reference(arch: str, path, seed: int = 0):
  """A random transformers model saved (safetensors) to path."""
  torch.manual_seed(seed)
  cls = (
    transformers.LlamaForCausalLM
    if arch == 'llada'
    else transformers.Qwen2ForCausalLM
  )
  model = cls(_hf_config(arch)).eval()
  with torch.no_grad():  # Non-trivial norms and biases, so both are tested.
    for name, p in model.named_parameters():
      if 'norm' in name or name.endswith('bias'):
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(path)
  return model


def _hf_logits(model, ids_BxL, valid_BxL, dtype: str):
  """The reference's logits with bidirectional attention over valid keys."""
  torch_dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
  model = model.to(torch_dtype)
  valid = torch.tensor(valid_BxL)
  # Additive [B, 1, L, S] mask: 0 where a key may be read, -inf-like else.
  bias = torch.zeros(valid.shape[0], 1, valid.shape[1], valid.shape[1])
  bias = bias.masked_fill(
    ~valid[:, None, None, :], torch.finfo(torch_dtype).min
  )
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(ids_BxL, dtype=torch.long),
      attention_mask=bias.to(torch_dtype),
    ).logits
  return out.float().numpy()


def _ids():
  """Two rows: data, mask ids and right padding (row 1)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(1, MASK_ID, size=(2, 16)).astype(np.int32)
  ids[0, [3, 4, 9]] = MASK_ID
  ids[1, [1, 6]] = MASK_ID
  ids[1, 12:] = PAD_ID
  valid = np.ones((2, 16), bool)
  valid[1, 12:] = False
  return ids, valid


def _ours(src, arch, dtype='float32', mesh=None, **over):
  hf = json.loads((src / 'config.json').read_text())
  cfg = interop.config_from_hf(hf, arch, dtype=dtype, **over)
  params = interop.load_params(str(src), cfg, mesh=mesh)
  return cfg, params


def _model(cfg, params):
  """The nnx model of cfg holding params."""
  graphdef, _ = nnx.split(
    nnx.eval_shape(lambda: LlamaFamily(cfg, rngs=nnx.Rngs(0))), nnx.Param
  )
  return nnx.merge(graphdef, params)


def _apply(cfg, params, ids, valid=None):
  valid = None if valid is None else jnp.asarray(valid)
  model = _model(cfg, params)
  return np.asarray(model(jnp.asarray(ids), None, valid_BxL=valid))


@pytest.mark.parametrize('arch', ['llada', 'dream'])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_logits_match_transformers(tmp_path, arch, dtype):
  ref = _reference(arch, tmp_path)
  ids, valid = _ids()
  mesh = make_mesh((2, 2, 2))
  cfg, params = _ours(tmp_path, arch, dtype, mesh=mesh, mask_token_id=MASK_ID)
  assert cfg.num_kv_heads == 2 and cfg.qkv_bias == (arch == 'dream')
  # Streamed onto the mesh: width over fsdp, MLP hidden over tensor.
  up = params['blocks'][0]['mlp']['up']['kernel']
  assert tuple(up.sharding.spec) == ('fsdp', 'tensor')
  assert up.addressable_shards[0].data.shape == (32, 48)
  want = _hf_logits(ref, ids, valid, dtype)
  if arch == 'dream':  # Dream's generation code: concat(out[:1], out[:-1]).
    want = np.concatenate([want[:, :1], want[:, :-1]], axis=1)
  got = _apply(cfg, params, ids, valid)
  assert got.shape == want.shape == (2, 16, VOCAB)
  err = np.abs(got[valid] - want[valid]).max()  # content positions
  assert err <= TOL[dtype], (arch, dtype, err)
  # The comparison is not vacuous: logits vary across positions.
  assert np.abs(want[0, 1] - want[0, 2]).max() > 10 * TOL[dtype]


def test_dream_shift_is_one_position(tmp_path):
  """Position i of Dream's output is the unshifted network's i - 1."""
  _reference('dream', tmp_path)
  ids, _ = _ids()
  cfg, params = _ours(tmp_path, 'dream')
  plain = _apply(cfg.__class__(**{**cfg.__dict__, 'shift_logits': False}),
                 params, ids)  # fmt: skip
  shifted = _apply(cfg, params, ids)
  np.testing.assert_array_equal(shifted[:, 1:], plain[:, :-1])
  np.testing.assert_array_equal(shifted[:, 0], plain[:, 0])
  assert np.abs(shifted[:, 1:] - plain[:, 1:]).max() > 1e-3


def test_padding_is_not_read_as_content(tmp_path):
  """Changing padded tokens changes nothing at the valid positions."""
  _reference('llada', tmp_path)
  ids, valid = _ids()
  cfg, params = _ours(tmp_path, 'llada')
  other = ids.copy()
  other[1, 12:] = 5
  a = _apply(cfg, params, ids, valid)
  b = _apply(cfg, params, other, valid)
  np.testing.assert_allclose(a[1, :12], b[1, :12], atol=1e-6)
  c = _apply(cfg, params, other)  # Without the padding mask it is content.
  assert np.abs(a[1, :12] - c[1, :12]).max() > 1e-4


def test_suite_mask_id_reads_as_published_mask(tmp_path):
  """Id V (the suite's mask) embeds as the published mask token, and
  forbid_mask_output keeps samplers from drawing that token."""
  _reference('llada', tmp_path)
  ids, _ = _ids()
  cfg, params = _ours(tmp_path, 'llada', mask_token_id=MASK_ID)
  suite = np.where(ids == MASK_ID, VOCAB, ids)
  np.testing.assert_array_equal(
    _apply(cfg, params, suite), _apply(cfg, params, ids)
  )
  strict = cfg.__class__(**{**cfg.__dict__, 'forbid_mask_output': True})
  out = _apply(strict, params, suite)
  assert (out[..., MASK_ID] == FORBIDDEN_LOGIT).all()
  keep = np.arange(VOCAB) != MASK_ID
  np.testing.assert_array_equal(
    out[..., keep], _apply(cfg, params, ids)[..., keep]
  )


def test_llada_native_names_load(tmp_path):
  """LLaDA's own tensor names (OLMo layout) give the same model."""
  _reference('llada', tmp_path / 'hf')
  files = safetensors_io.tensor_files(str(tmp_path / 'hf'))
  from safetensors.numpy import load_file, save_file

  tensors = {}
  for path in set(files.values()):
    tensors.update(load_file(path))
  inverse = {interop.llada_to_hf_name(n): n for n in _llada_names(2)}
  native = {inverse[name]: w for name, w in tensors.items()}
  assert set(native) == set(_llada_names(2))
  (tmp_path / 'native').mkdir()
  save_file(native, str(tmp_path / 'native' / 'model.safetensors'))
  ids, _ = _ids()
  cfg, params = _ours(tmp_path / 'hf', 'llada')
  params_native = interop.load_params(str(tmp_path / 'native'), cfg)
  np.testing.assert_array_equal(
    _apply(cfg, params, ids), _apply(cfg, params_native, ids)
  )


def _llada_names(depth):
  yield 'model.transformer.wte.weight'
  yield 'model.transformer.ln_f.weight'
  yield 'model.transformer.ff_out.weight'
  parts = ('attn_norm', 'q_proj', 'k_proj', 'v_proj', 'attn_out', 'ff_norm',
           'ff_proj', 'up_proj', 'ff_out')  # fmt: skip
  for i in range(depth):
    for part in parts:
      yield f'model.transformer.blocks.{i}.{part}.weight'


def test_llada_native_config_keys():
  native = dict(
    d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=96,
    vocab_size=126464, embedding_size=126464, rope_theta=500000.0,
    rms_norm_eps=1e-5, weight_tying=False, activation_type='silu',
  )  # fmt: skip
  cfg = interop.config_from_hf(native, 'llada')
  assert (cfg.width, cfg.depth, cfg.num_kv_heads, cfg.mlp_dim) == (
    64, 2, 2, 96,
  )  # fmt: skip
  assert cfg.mask_token_id == 126336 and cfg.rope_theta == 500000.0
  assert not cfg.shift_logits and not cfg.qkv_bias


def test_bad_configs_refused():
  base = _hf_config('llada').to_dict()
  with pytest.raises(ConfigError, match='rope_type'):
    interop.config_from_hf(
      {**base, 'rope_parameters': {'rope_type': 'llama3', 'factor': 8.0}},
      'llada',
    )
  with pytest.raises(ConfigError, match='--arch'):
    interop.config_from_hf(base, 'gpt2')
  with pytest.raises(ConfigError, match='num_kv_heads'):
    interop.config_from_hf({**base, 'num_key_value_heads': 3}, 'llada')


def test_missing_tensor_named(tmp_path):
  _reference('llada', tmp_path)
  hf = json.loads((tmp_path / 'config.json').read_text())
  cfg = interop.config_from_hf({**hf, 'num_hidden_layers': 3}, 'llada')
  with pytest.raises(KeyError, match='model.layers.2'):
    interop.load_params(str(tmp_path), cfg)


@pytest.mark.parametrize('arch', ['llada', 'dream'])
def test_export_round_trip(tmp_path, arch):
  """Convert in, export out, load with transformers: same logits."""
  ref = _reference(arch, tmp_path / 'in')
  cfg, params = _ours(tmp_path / 'in', arch)
  interop.export_params(cfg, params, str(tmp_path / 'out'))
  back = transformers.AutoModelForCausalLM.from_pretrained(
    str(tmp_path / 'out'), dtype=torch.float32
  ).eval()
  assert type(back) is type(ref)
  ids, valid = _ids()
  want = _hf_logits(ref, ids, valid, 'float32')
  got = _hf_logits(back, ids, valid, 'float32')
  np.testing.assert_allclose(got, want, atol=1e-6)
  # And ours equals the exported model's (unshifted for Dream).
  ours = _apply(cfg, params, ids, valid)
  if arch == 'dream':
    got = np.concatenate([got[:, :1], got[:, :-1]], axis=1)
  assert np.abs(ours[valid] - got[valid]).max() <= TOL['float32']


def test_sharded_index_is_read(tmp_path):
  """A checkpoint split over shards with an index loads the same."""
  _reference('llada', tmp_path / 'one')
  cfg, params = _ours(tmp_path / 'one', 'llada')
  tensors = [
    (name, interop.to_hf(path, np.asarray(jax.device_get(_at(params, path)))))
    for path, name in interop.param_names(cfg)
  ]
  files = safetensors_io.save_tree(
    tensors, str(tmp_path / 'many'), max_shard_bytes=40_000
  )
  assert len(files) > 2
  assert (tmp_path / 'many' / safetensors_io.INDEX_NAME).exists()
  again = interop.load_params(str(tmp_path / 'many'), cfg)
  ids, _ = _ids()
  np.testing.assert_array_equal(
    _apply(cfg, params, ids), _apply(cfg, again, ids)
  )


def _at(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_cli_convert_and_export(tmp_path):
  """experiments.convert: hf -> converted dir -> hf, tokenizer carried."""
  from ddlm_jax.interop import workdir as workdir_lib
  from experiments import convert

  ref = _reference('dream', tmp_path / 'hf')
  (tmp_path / 'hf' / 'tokenizer_config.json').write_text('{"x": 1}')
  _byte_bpe().save(str(tmp_path / 'hf' / 'tokenizer.json'))
  work, out = tmp_path / 'work', tmp_path / 'out'
  assert convert.main(
    ['--from=hf', '--arch=dream', str(tmp_path / 'hf'), f'--to={work}',
     '--mesh=1,4,2', f'--mask_token_id={MASK_ID}', '--seq_len=16']
  ) == 0  # fmt: skip
  cfg, model = workdir_lib.load(str(work), mesh=make_mesh((2, 2, 2)))
  assert cfg.family == 'dream' and cfg.mask_token_id == MASK_ID
  ids, valid = _ids()
  ours = np.asarray(model(jnp.asarray(ids), None, valid_BxL=valid))
  want = _hf_logits(ref, ids, valid, 'float32')
  want = np.concatenate([want[:, :1], want[:, :-1]], axis=1)
  assert np.abs(ours[valid] - want[valid]).max() <= TOL['float32']
  assert convert.main(['--from=workdir', str(work), f'--to_hf={out}']) == 0
  assert (out / 'tokenizer_config.json').read_text() == '{"x": 1}'
  from ddlm_jax.data import tokenizers

  tok = tokenizers.load_tokenizer(work / 'tokenizer')  # What runs read.
  assert tok.decode(tok.encode('the cat sat')) == 'the cat sat'
  assert (out / 'tokenizer.json').exists()
  back = transformers.AutoModelForCausalLM.from_pretrained(
    str(out), dtype=torch.float32
  ).eval()
  np.testing.assert_allclose(
    _hf_logits(back, ids, valid, 'float32'),
    _hf_logits(ref, ids, valid, 'float32'),
    atol=1e-6,
  )
  with pytest.raises(FileExistsError, match='empty directory'):
    convert.main(['--from=hf', '--arch=dream', str(tmp_path / 'hf'),
                  f'--to={work}'])  # fmt: skip


def _byte_bpe():
  """A small byte-level BPE tokenizer (the `tokenizers` library's own)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=90, special_tokens=['<|endoftext|>', '<|mdm_mask|>']
  )
  tok.train_from_iterator(['the cat sat on the mat'] * 20, trainer)
  return tok


def test_bfloat16_params_convert(tmp_path):
  """--param_dtype=bfloat16 stores and restores bf16 parameters."""
  from ddlm_jax.interop import workdir as workdir_lib

  _reference('llada', tmp_path / 'hf')
  workdir_lib.convert_hf(
    str(tmp_path / 'hf'), str(tmp_path / 'w'), 'llada',
    run_config={}, param_dtype='bfloat16', mask_token_id=MASK_ID,
  )  # fmt: skip
  _, model = workdir_lib.load(str(tmp_path / 'w'))
  assert model.blocks[0].attn.q.kernel[...].dtype == jnp.bfloat16


@pytest.mark.parametrize('name', ['ancestral', 'confidence'])
def test_suite_samplers_run_an_imported_model(tmp_path, name):
  """A converted LLaDA model under the suite's masked process and samplers:
  prompts kept, every other position filled with a real token (never the
  suite's mask id V nor the published mask token)."""
  from ddlm_jax.diffusion.masked import MaskedDiffusion
  from ddlm_jax.diffusion.schedules import get_schedule
  from ddlm_jax.sampling.registry import get_sampler

  _reference('llada', tmp_path)
  cfg, params = _ours(
    tmp_path, 'llada', mask_token_id=MASK_ID, forbid_mask_output=True
  )
  model = _model(cfg, params)
  process = MaskedDiffusion(get_schedule('loglinear'), vocab_size=VOCAB)
  assert process.mask_id == VOCAB
  ids = np.random.default_rng(1).integers(1, MASK_ID, (2, 16))
  keep = np.zeros_like(ids, bool)
  keep[:, :5] = True
  sampler = get_sampler(name, num_steps=4)
  out, _ = sampler(
    model, jax.random.key(0), process, batch=2, length=16,
    prompt_BxL=(jnp.asarray(ids), jnp.asarray(keep)),
  )  # fmt: skip
  out = np.asarray(out)
  np.testing.assert_array_equal(out[:, :5], ids[:, :5])
  gen = out[:, 5:]
  assert ((gen >= 0) & (gen < VOCAB) & (gen != MASK_ID)).all()


def test_convert_memory_benchmark_runs_tiny(tmp_path):
  """The memory benchmark at test size: 8 devices in a fresh process,
  sharded placement, every reported number present."""
  from experiments.benchmarks import convert_memory

  info = convert_memory.main(['--tiny', f'--dir={tmp_path}'])
  assert info['devices'] == 8 and info['shards'] > 1
  assert info['device_buffer_bytes'] >= info['placed_param_bytes'] > 0
  # Split over the 1x4x2 mesh: no device holds the whole model.
  assert info['max_bytes_on_one_device'] < info['placed_param_bytes'] / 2
  for k in ('rss_before_load_mib', 'rss_peak_mib', 'load_growth_mib'):
    assert np.isfinite(info[k])
  assert info['rss_peak_mib'] >= info['rss_before_load_mib'] > 0


@pytest.mark.parametrize('arch', ['llada', 'dream'])
def test_left_padded_rows_match_transformers_and_run_alone(tmp_path, arch):
  """Left padding with per-row positions (cumsum(valid) - 1, as Dream's
  generation code passes them): the same logits as transformers given the
  same position ids, and each row's content as that row run alone (the
  building block of batched prompts of different lengths)."""
  ref = _reference(arch, tmp_path)
  cfg, params = _ours(tmp_path, arch)
  rng = np.random.default_rng(3)
  lengths = (16, 11)
  ids = rng.integers(1, VOCAB, (2, 16)).astype(np.int32)
  valid = np.arange(16)[None] >= 16 - np.array(lengths)[:, None]
  ids = np.where(valid, ids, PAD_ID)
  pos = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
  model = _model(cfg, params)
  got = np.asarray(
    model(jnp.asarray(ids), None, valid_BxL=valid, positions_BxL=pos)
  )
  torch_valid = torch.tensor(valid)
  bias = torch.zeros(2, 1, 16, 16).masked_fill(
    ~torch_valid[:, None, None, :], torch.finfo(torch.float32).min
  )
  with torch.no_grad():
    want = ref.float()(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=bias,
      position_ids=torch.tensor(pos, dtype=torch.long),
    ).logits.numpy()
  if arch == 'dream':
    want = np.concatenate([want[:, :1], want[:, :-1]], axis=1)
  # Dream's shift reads position i - 1, which for the first content token
  # of a left-padded row is padding: compare where both are content.
  both = valid & np.roll(valid, 1, axis=1) if arch == 'dream' else valid
  assert np.abs(got[both] - want[both]).max() <= TOL['float32']
  alone = np.asarray(model(jnp.asarray(ids[1:, 16 - lengths[1] :]), None))
  np.testing.assert_allclose(
    got[1, 16 - lengths[1] + 1 :], alone[0, 1:], atol=1e-5
  )
  # Rotary scores depend on position differences only, so a uniform offset
  # changes nothing; stretched positions must change the logits.
  stretched = np.asarray(
    model(jnp.asarray(ids), None, valid_BxL=valid, positions_BxL=2 * pos)
  )
  assert np.abs(stretched[1, 6:] - got[1, 6:]).max() > 1e-3


@pytest.mark.slow
def test_converted_directory_is_a_run(tmp_path):
  """A converted directory loads like a run: load_run restores step 0,
  --mode=sample writes samples from the imported model, and --mode=eval
  scores it on text through the run's own pipeline."""
  from ddlm_jax.tasks.language_model import load_config, load_run
  from experiments import convert, modes

  _reference('llada', tmp_path / 'hf')
  _byte_bpe().save(str(tmp_path / 'hf' / 'tokenizer.json'))
  work = tmp_path / 'work'
  assert convert.main(
    ['--from=hf', '--arch=llada', str(tmp_path / 'hf'), f'--to={work}',
     f'--mask_token_id={MASK_ID}', '--seq_len=16']
  ) == 0  # fmt: skip
  text = tmp_path / 'val.txt'
  text.write_text('the cat sat on the mat. ' * 40)
  over = {
    'mesh.shape': (1, 1, 1), 'sample.num_samples': 2, 'sample.batch_size': 2,
    'sample.steps': 4, 'eval.batch_size': 2, 'eval.final_num_batches': 1,
    'eval.final_time_samples': 1, 'train.batch_size': 2,
    'data.corpus': 'text_files', 'data.files.train': str(text),
    'data.files.validation': str(text),
  }  # fmt: skip
  run = load_run(str(work), over)
  assert run.checkpointer.latest_step() == 0
  from ddlm_jax.data import tokenizers

  vocab = tokenizers.load_tokenizer(work / 'tokenizer').vocab_size
  assert run.process.vocab_size == run.model_config.data_vocab_size == vocab
  assert run.model_config.vocab_size == VOCAB > vocab
  # The restored parameters are the checkpoint's, not a fresh init.
  _, params = _ours(tmp_path / 'hf', 'llada')
  np.testing.assert_array_equal(
    np.asarray(run.params['embedding']), np.asarray(params['embedding'])
  )
  run.close()
  config = load_config(str(work), over)
  stats = modes.run(config, str(work), 'sample')
  assert stats['step'] == 0
  assert (work / 'samples.txt').read_text().count('=== sample') == 2
  result = modes.run(config, str(work), 'eval')
  assert result['step'] == 0 and np.isfinite(result['nats_per_token'])
  # --mode=train fine-tunes from the imported step 0.
  tune = load_config(str(work), {**over, 'train.num_steps': 2})
  modes.run(tune, str(work), 'train')
  tuned = load_run(str(work), over)
  assert tuned.checkpointer.latest_step() == 2
  assert np.abs(
    np.asarray(tuned.params['embedding']) - np.asarray(
      params['embedding'])
  ).max() > 0  # fmt: skip
  tuned.close()
  import shutil

  from ddlm_jax.training.checkpoint import NoCheckpointError

  shutil.rmtree(work / 'checkpoints')  # Without its step 0: not a run.
  with pytest.raises(NoCheckpointError):
    load_run(str(work), over)
