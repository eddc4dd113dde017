"""Reading and writing safetensors checkpoints one tensor at a time.

A published checkpoint is one `model.safetensors` or several shards listed
by `model.safetensors.index.json` (its `weight_map`: tensor name -> file).
`load_tree` reads each tensor alone (`safetensors.safe_open`), converts it
on the host and hands it to `jax.make_array_from_callback`, which copies to
each device only that device's slice of the target sharding; the host copy
is then dropped. Peak host memory is therefore the placed parameters (on
host-backed devices) plus about one tensor, never a second full copy of
the checkpoint.

`safetensors` is imported when first used, so the rest of the library (and
its tests) runs where the `interop` extra is not installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

INDEX_NAME = 'model.safetensors.index.json'
SINGLE_NAME = 'model.safetensors'


def tensor_files(src: str) -> dict[str, str]:
  """Tensor name -> the safetensors file holding it, for a checkpoint dir.

  Uses the index file when there is one, else every `*.safetensors` file.
  """
  if not os.path.isdir(src):
    raise FileNotFoundError(
      f'{src} is not a directory; pass the folder holding the checkpoint '
      '(config.json and *.safetensors).'
    )
  index = os.path.join(src, INDEX_NAME)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)['weight_map']
    return {name: os.path.join(src, fn) for name, fn in weight_map.items()}
  files = sorted(f for f in os.listdir(src) if f.endswith('.safetensors'))
  if not files:
    raise FileNotFoundError(
      f'{src} holds no *.safetensors file; save the model with '
      'safe_serialization (the default of save_pretrained).'
    )
  from safetensors import safe_open

  out = {}
  for fn in files:
    path = os.path.join(src, fn)
    with safe_open(path, framework='numpy') as f:
      out.update(dict.fromkeys(f.keys(), path))
  return out


def place(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A host array as a global jax.Array, each device given its own slice."""
  return jax.make_array_from_callback(
    host.shape, sharding, lambda idx: np.ascontiguousarray(host[idx])
  )


def load_tree(
  files: Mapping[str, str],
  wanted: Iterable[tuple[str, Any]],
  convert: Callable[[Any, np.ndarray], np.ndarray],
  sharding_of: Callable[[Any], jax.sharding.Sharding],
) -> dict[Any, jax.Array]:
  """Reads tensors one by one: {key: placed array}.

  `wanted` pairs a tensor name with a key; `convert(key, tensor)` returns
  the host array in its final shape and dtype; `sharding_of(key)` gives its
  target sharding. Files are opened once each, in order.
  """
  by_file: dict[str, list[tuple[str, Any]]] = {}
  missing = []
  for name, key in wanted:
    if name not in files:
      missing.append(name)
    else:
      by_file.setdefault(files[name], []).append((name, key))
  if missing:
    raise KeyError(
      f'the checkpoint lacks {len(missing)} tensor(s) the model needs, e.g. '
      f'{missing[:3]}; check --arch and that every shard is present.'
    )
  from safetensors import safe_open

  out = {}
  for path, entries in by_file.items():
    with safe_open(path, framework='numpy') as f:
      for name, key in entries:
        host = convert(key, f.get_tensor(name))
        out[key] = place(host, sharding_of(key))
        del host
  return out


def save_tree(
  tensors: Iterable[tuple[str, np.ndarray]],
  out_dir: str,
  *,
  max_shard_bytes: int = 5 * 2**30,
) -> list[str]:
  """Writes (name, array) pairs as safetensors shards (+ index if > 1).

  Arrays are gathered into shards of at most `max_shard_bytes` (one
  tensor larger than that gets a shard of its own); returns the files.
  """
  from safetensors.numpy import save_file

  os.makedirs(out_dir, exist_ok=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, arr in tensors:
    arr = np.ascontiguousarray(arr)
    if shards[-1] and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = arr
    size += arr.nbytes
  metadata = {'format': 'pt'}  # What transformers expects of its files.
  if len(shards) == 1:
    save_file(shards[0], os.path.join(out_dir, SINGLE_NAME), metadata)
    return [SINGLE_NAME]
  names, weight_map, total = [], {}, 0
  for i, shard in enumerate(shards):
    fn = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
    save_file(shard, os.path.join(out_dir, fn), metadata)
    names.append(fn)
    for name, arr in shard.items():
      weight_map[name] = fn
      total += arr.nbytes
  index = {'metadata': {'total_size': total}, 'weight_map': weight_map}
  with open(os.path.join(out_dir, INDEX_NAME), 'w') as f:
    json.dump(index, f, indent=2)
  return names
