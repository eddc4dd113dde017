"""An imported checkpoint as a ddlm_jax run directory, and back.

A converted directory is a run directory at step 0:

- `config.json`: a language-model run config (`kind: lm`, a masked
  process) whose `model` block is `{'backbone': 'llada' | 'dream',
  'time_conditioning': False, ...LlamaFamilyConfig fields}`; the run
  builders hand that block to `llama_family.run_model_config`;
- `checkpoints/0`: the parameters in the suite's checkpoint format, as a
  train state with an empty optimizer state (a run restoring it starts the
  optimizer, and the EMA, fresh: `Checkpointer.restore_latest` fills parts
  whose structure changed from the run's initial state);
- `tokenizer/`: the tokenizer files found next to the weights, as given,
  and (from a `tokenizer.json`) the suite's `ddlm_tokenizer.json`, which
  the run's data pipeline reads;
- `imported.json`: what it was converted from.

So `--mode=eval|sample` (with `--config=experiments/configs/imported.py:DIR`),
`train.init_from=DIR` and `tasks.language_model.load_run(DIR)` load it like any
run. `convert_hf` streams the safetensors onto the mesh (`load_params`)
and saves; `load` restores the parameters alone onto any mesh; `export_hf`
writes transformers safetensors, config.json and the tokenizer files back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax import paths
from ddlm_jax.data import pretrained
from ddlm_jax.interop import llama_family as hf_lib
from ddlm_jax.models.llama_family import LlamaFamily, LlamaFamilyConfig
from ddlm_jax.training import state as state_lib
from ddlm_jax.training.checkpoint import Checkpointer
from ddlm_jax.training.config import ConfigError

CHECKPOINTS_DIR = 'checkpoints'
TOKENIZER_DIR = 'tokenizer'
SOURCE_FILE = 'imported.json'
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# Files of a Hugging Face tokenizer that travel with the weights.
TOKENIZER_FILES = (
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'tokenizer.model',
  'vocab.json',
  'merges.txt',
  'vocab.txt',
  'added_tokens.json',
  'generation_config.json',
)
# Fields a run derives from its tokenizer (run_model_config), not saved.
_DERIVED = ('data_vocab_size', 'forbid_mask_output')


def copy_tokenizer(src: str, dst: str) -> list[str]:
  """Copies the tokenizer files present in src into dst; their names.

  Either side may be local or a URI (a gs:// workdir's tokenizer/).
  """
  found = [f for f in TOKENIZER_FILES if paths.exists(paths.join(src, f))]
  if found:
    paths.makedirs(dst)
  for f in found:
    paths.copy_file(paths.join(src, f), paths.join(dst, f))
  return found


def model_block(cfg: LlamaFamilyConfig) -> dict:
  """The run config's `model` block for cfg."""
  fields = {
    k: v for k, v in dataclasses.asdict(cfg).items() if k not in _DERIVED
  }
  return {'backbone': cfg.family, 'time_conditioning': False, **fields}


def read_config(workdir: str) -> LlamaFamilyConfig:
  """The model config of a converted (or fine-tuned) directory."""
  path = paths.join(workdir, 'config.json')
  if not paths.exists(path):
    raise FileNotFoundError(
      f'{path} not found: convert a checkpoint first (python -m '
      'experiments.convert --from=hf ...).'
    )
  model = dict(json.loads(paths.read_text(path)).get('model', {}))
  backbone = model.pop('backbone', None)
  if backbone not in hf_lib.ARCHS:
    raise ConfigError(
      f'{workdir} holds a {backbone!r} model; only LLaDA- and Dream-family '
      'directories load as LlamaFamily and export to transformers.'
    )
  model.pop('time_conditioning', None)
  for k in _DERIVED:
    model.pop(k, None)
  return LlamaFamilyConfig(**model)


def _initial_state(params, seed: int = 0) -> state_lib.TrainState:
  """A train state holding only params (optimizer state empty, no EMA)."""
  return state_lib.TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state={},
    ema_params=None,
    rng=jax.random.key(seed),
    bad_step=jnp.full((), -1, jnp.int32),
  )


def convert_hf(
  src: str,
  workdir: str,
  arch: str,
  *,
  run_config: Mapping,
  mesh=None,
  param_dtype: str = 'float32',
  **overrides,
) -> LlamaFamilyConfig:
  """Reads an HF checkpoint directory and writes a run directory at step 0.

  `run_config` is the run's config dict (data, process, sample, ...); its
  `model` block is replaced by the imported model's.
  """
  if param_dtype not in DTYPES:
    raise ConfigError(
      f'param_dtype={param_dtype!r}; choose one of {list(DTYPES)}.'
    )
  if paths.exists(paths.join(workdir, CHECKPOINTS_DIR)):
    raise FileExistsError(
      f'{workdir}/{CHECKPOINTS_DIR} exists; convert into an empty directory.'
    )
  with open(os.path.join(src, 'config.json')) as f:
    hf = json.load(f)
  cfg = hf_lib.config_from_hf(hf, arch, **overrides)
  if cfg.mask_token_id < 0:
    raise ConfigError(
      'the checkpoint names no mask token inside its vocabulary; pass '
      '--mask_token_id=ID (the id the model was trained to unmask).'
    )
  params = hf_lib.load_params(
    src, cfg, mesh=mesh, param_dtype=DTYPES[param_dtype]
  )
  paths.makedirs(workdir)
  tok_dir = paths.join(workdir, TOKENIZER_DIR)
  tok = copy_tokenizer(src, tok_dir)
  if 'tokenizer.json' in tok:
    # The suite's own tokenizer file beside it: what a run's data reads.
    pretrained.load_hf_tokenizer(tok_dir).save(tok_dir)
  ckpt = Checkpointer(paths.join(workdir, CHECKPOINTS_DIR))
  try:
    ckpt.save(0, _initial_state(params), None, force=True)
    ckpt.wait()
  finally:
    ckpt.close()
  config = {**run_config, 'model': model_block(cfg)}
  paths.write_text(
    paths.join(workdir, 'config.json'), json.dumps(config, indent=2)
  )
  source = dict(
    format='hf', arch=arch, model_type=hf.get('model_type'),
    param_dtype=param_dtype, tokenizer_files=tok,
  )  # fmt: skip
  paths.write_text(
    paths.join(workdir, SOURCE_FILE), json.dumps(source, indent=2)
  )
  return cfg


def load(workdir: str, *, mesh=None, use_ema: bool = False, **overrides):
  """(config, nnx model) of a converted or fine-tuned directory.

  The newest checkpoint's parameters (its EMA ones with use_ema, where a
  run kept them) restored onto `mesh`, nothing else. `overrides` replace
  config fields that keep parameter shapes (dtype, attention_impl,
  forbid_mask_output, ...).
  """
  cfg = dataclasses.replace(read_config(workdir), **overrides)
  if mesh is None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  abstract = hf_lib.abstract_params(cfg)
  shardings = state_lib.param_shardings(abstract, mesh, hf_lib.rules_for(mesh))
  source = {}
  if paths.exists(paths.join(workdir, SOURCE_FILE)):
    source = json.loads(paths.read_text(paths.join(workdir, SOURCE_FILE)))
  dtype = DTYPES[source.get('param_dtype', 'float32')]
  params = jax.tree.map(
    lambda v, s: jax.ShapeDtypeStruct(v.shape, dtype, sharding=s),
    nnx.to_pure_dict(abstract),
    shardings,
  )
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  initial = _initial_state(None)
  scalar = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl)
  target = initial.replace(
    step=scalar(initial.step),
    params=params,
    ema_params=params if use_ema else None,
    rng=scalar(initial.rng),
    bad_step=scalar(initial.bad_step),
  )
  ckpt = Checkpointer(paths.join(workdir, CHECKPOINTS_DIR))
  try:
    found = ckpt.restore_latest(target, initial_state=initial)
  finally:
    ckpt.close()
  if found is None:
    raise FileNotFoundError(f'{workdir} has no checkpoint to load.')
  state = found[0]
  tree = state_lib.eval_params(state, use_ema)
  graphdef = nnx.split(
    nnx.eval_shape(lambda: LlamaFamily(cfg, rngs=nnx.Rngs(0))), nnx.Param
  )[0]
  return cfg, nnx.merge(graphdef, tree)


def export_hf(workdir: str, out_dir: str, dtype: str = 'float32') -> list[str]:
  """Writes a converted directory as transformers safetensors + config."""
  cfg, model = load(workdir)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  files = hf_lib.export_params(cfg, params, out_dir, dtype)
  copy_tokenizer(paths.join(workdir, TOKENIZER_DIR), out_dir)
  return files
