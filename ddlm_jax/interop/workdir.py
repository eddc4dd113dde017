"""An imported checkpoint as a ddlm_jax directory, and back.

Layout of a converted directory:

- `config.json`: `{'kind': 'imported', 'model': {'backbone': family,
  ...LlamaFamilyConfig fields}, 'source': {...}}`;
- `params/`: the pure parameter dict as an orbax checkpoint (each process
  writes its own shards, so an 8B model is never gathered on one host);
- `tokenizer/`: the tokenizer files found next to the weights, as given,
  and (from a `tokenizer.json`) the suite's `ddlm_tokenizer.json`.

`convert_hf` streams the safetensors onto the mesh (`load_params`) and
saves; `load` restores onto any mesh; `export_hf` writes transformers
safetensors, config.json and the tokenizer files back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from ddlm_jax.data import pretrained
from ddlm_jax.interop import llama_family as hf_lib
from ddlm_jax.models.llama_family import LlamaFamily, LlamaFamilyConfig
from ddlm_jax.training import state as state_lib
from ddlm_jax.training.config import ConfigError

KIND = 'imported'
PARAMS_DIR = 'params'
TOKENIZER_DIR = 'tokenizer'
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


def copy_tokenizer(src: str, dst: str) -> list[str]:
  """Copies the tokenizer files present in src into dst; their names."""
  found = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(src, f))]
  if found:
    os.makedirs(dst, exist_ok=True)
  for f in found:
    shutil.copy2(os.path.join(src, f), os.path.join(dst, f))
  return found


def _write_config(workdir: str, cfg: LlamaFamilyConfig, source: dict):
  model = {'backbone': cfg.family, **dataclasses.asdict(cfg)}
  config = {'kind': KIND, 'model': model, 'source': source}
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(config, f, indent=2)


def read_config(workdir: str) -> LlamaFamilyConfig:
  """The model config of a converted directory."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise FileNotFoundError(
      f'{path} not found: convert a checkpoint first (python -m '
      'experiments.convert --from=hf ...).'
    )
  with open(path) as f:
    config = json.load(f)
  if config.get('kind') != KIND:
    raise ConfigError(
      f'{workdir} holds a {config.get("kind")!r} run, not an imported '
      'checkpoint; --from=workdir exports only converted directories.'
    )
  model = dict(config['model'])
  backbone = model.pop('backbone', None)
  if backbone not in hf_lib.ARCHS:
    raise ConfigError(
      f'{workdir} holds a {backbone!r} model; only LLaDA- and Dream-family '
      'directories load as LlamaFamily and export to transformers.'
    )
  return LlamaFamilyConfig(**model)


def convert_hf(
  src: str,
  workdir: str,
  arch: str,
  *,
  mesh=None,
  param_dtype: str = 'float32',
  **overrides,
) -> LlamaFamilyConfig:
  """Reads an HF checkpoint directory and writes a converted directory."""
  with open(os.path.join(src, 'config.json')) as f:
    hf = json.load(f)
  cfg = hf_lib.config_from_hf(hf, arch, **overrides)
  if os.path.exists(os.path.join(workdir, PARAMS_DIR)):
    raise FileExistsError(
      f'{workdir}/{PARAMS_DIR} exists; convert into an empty directory.'
    )
  if param_dtype not in DTYPES:
    raise ConfigError(
      f'param_dtype={param_dtype!r}; choose one of {list(DTYPES)}.'
    )
  dtype = DTYPES[param_dtype]
  params = hf_lib.load_params(src, cfg, mesh=mesh, param_dtype=dtype)
  os.makedirs(workdir, exist_ok=True)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(os.path.abspath(os.path.join(workdir, PARAMS_DIR)), params)
  ckpt.wait_until_finished()
  tok_dir = os.path.join(workdir, TOKENIZER_DIR)
  tok = copy_tokenizer(src, tok_dir)
  if 'tokenizer.json' in tok:
    # The suite's own tokenizer file beside it, so tokenizers.load_tokenizer
    # (what runs use) reads the directory too.
    pretrained.load_hf_tokenizer(tok_dir).save(tok_dir)
  source = dict(
    format='hf', arch=arch, model_type=hf.get('model_type'),
    param_dtype=param_dtype, tokenizer_files=tok,
  )  # fmt: skip
  _write_config(workdir, cfg, source)
  return cfg


def read_source(workdir: str) -> dict:
  """What a converted directory was made from (format, arch, dtype...)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    return json.load(f).get('source', {})


def load(workdir: str, *, mesh=None, **overrides):
  """(config, nnx model) of a converted directory, restored onto `mesh`.

  `overrides` replace config fields that do not change parameter shapes
  (dtype, attention_impl, forbid_mask_output, ...).
  """
  cfg = dataclasses.replace(read_config(workdir), **overrides)
  if mesh is None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  abstract = hf_lib.abstract_params(cfg)
  shardings = state_lib.param_shardings(abstract, mesh, hf_lib.rules_for(mesh))
  path = os.path.abspath(os.path.join(workdir, PARAMS_DIR))
  dtype = DTYPES[read_source(workdir).get('param_dtype', 'float32')]
  target = jax.tree.map(
    lambda v, s: jax.ShapeDtypeStruct(v.shape, dtype, sharding=s),
    nnx.to_pure_dict(abstract),
    shardings,
  )
  params = ocp.StandardCheckpointer().restore(path, target)
  graphdef = nnx.split(
    nnx.eval_shape(lambda: LlamaFamily(cfg, rngs=nnx.Rngs(0))), nnx.Param
  )[0]
  return cfg, nnx.merge(graphdef, params)


def export_hf(workdir: str, out_dir: str, dtype: str = 'float32') -> list[str]:
  """Writes a converted directory as transformers safetensors + config."""
  cfg, model = load(workdir)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  files = hf_lib.export_params(cfg, params, out_dir, dtype)
  copy_tokenizer(os.path.join(workdir, TOKENIZER_DIR), out_dir)
  return files
