"""Peak host memory of streaming a ~100M-parameter checkpoint onto 8 devices.

  python -m experiments.benchmarks.convert_memory [--dir=TMP] [--mesh=1,4,2]
  python -m experiments.benchmarks.convert_memory --devices=default --mesh=1,1,1

Writes a random LLaMA-layout checkpoint (bfloat16 safetensors in shards
with an index, as published models are stored) in one process, then
converts it onto a mesh of 8 host-platform devices in a fresh process that
reports its own peak resident set (`resource.getrusage`, ru_maxrss) before
and after loading. Placed float32 parameters live in host memory here
(the devices are CPU devices), so the expected peak is the baseline plus
the placed parameters plus about one tensor; a second full copy of the
checkpoint would show as another checkpoint-size step. Memory, not time,
is measured, so a loaded machine does not change the numbers. With
`--devices=default` the parameters go to the machine's accelerators
instead, and the host keeps only the transient per-tensor copies.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# A LLaMA layout of ~100M parameters (vocab 16000, width 768, 12 layers,
# 12 query / 4 K-V heads, SwiGLU 2048).
HF_CONFIG = dict(
  model_type='llama',
  architectures=['LlamaForCausalLM'],
  vocab_size=16_000,
  hidden_size=768,
  intermediate_size=2048,
  num_hidden_layers=12,
  num_attention_heads=12,
  num_key_value_heads=4,
  rms_norm_eps=1e-5,
  rope_theta=10_000.0,
  tie_word_embeddings=False,
)
# --tiny (tests): the same layout at a size that converts in seconds.
TINY = dict(
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
)
SHARD_BYTES = 64 * 2**20


def _peak_rss_mib() -> float:
  """The process's high-water resident set (ru_maxrss, KiB on Linux)."""
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
  """The resident set now (VmRSS), to subtract: the high-water mark may
  already sit above it from imports."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  return float('nan')


def write_checkpoint(out_dir: str, hf_config: dict) -> dict:
  """Random bf16 tensors named as transformers' LLaMA, sharded."""
  import ml_dtypes
  import numpy as np
  from flax import nnx

  from ddlm_jax.interop import llama_family, safetensors_io

  cfg = llama_family.config_from_hf(hf_config, 'llada')
  shapes = {
    path: v.shape
    for path, v in nnx.to_flat_state(llama_family.abstract_params(cfg))
  }
  rng = np.random.default_rng(0)

  def tensors():
    for path, name in llama_family.param_names(cfg):
      shape = shapes[path]
      host = rng.standard_normal(shape, np.float32) * 0.02
      yield name, llama_family.to_hf(path, host).astype(ml_dtypes.bfloat16)

  shard_bytes = min(SHARD_BYTES, n_bytes(shapes) // 3)
  files = safetensors_io.save_tree(
    tensors(), out_dir, max_shard_bytes=shard_bytes
  )
  with open(os.path.join(out_dir, 'config.json'), 'w') as f:
    json.dump(hf_config, f)
  n = sum(int(np.prod(s)) for s in shapes.values())
  size = sum(os.path.getsize(os.path.join(out_dir, fn)) for fn in files)
  return {'num_params': n, 'checkpoint_bytes': size, 'shards': len(files)}


def n_bytes(shapes: dict) -> int:
  """bf16 bytes of all parameters."""
  return 2 * sum(math.prod(s) for s in shapes.values())


def convert(src: str, mesh_spec: str) -> dict:
  """Runs in the measuring process: load onto the mesh, report memory."""
  import jax

  from ddlm_jax.interop import llama_family
  from ddlm_jax.parallel import make_mesh

  mesh = make_mesh(tuple(int(x) for x in mesh_spec.split(',')))
  with open(os.path.join(src, 'config.json')) as f:
    cfg = llama_family.config_from_hf(json.load(f), 'llada')
  jax.block_until_ready(jax.device_put(0.0))  # Backend up before baseline.
  before, peak_before = _current_rss_mib(), _peak_rss_mib()
  params = llama_family.load_params(src, cfg, mesh=mesh)
  jax.block_until_ready(params)
  leaves = jax.tree.leaves(params)
  placed = sum(x.nbytes for x in leaves)
  peak = _peak_rss_mib()
  per_device = {}
  for x in leaves:
    for shard in x.addressable_shards:
      key = str(shard.device)
      per_device[key] = per_device.get(key, 0) + shard.data.nbytes
  return {
    'devices': jax.device_count(),
    'mesh': mesh_spec,
    'rss_before_load_mib': round(before, 1),
    'rss_peak_before_load_mib': round(peak_before, 1),
    'rss_peak_mib': round(peak, 1),
    'rss_after_load_mib': round(_current_rss_mib(), 1),
    'placed_param_bytes': placed,
    'device_buffer_bytes': sum(per_device.values()),
    'max_bytes_on_one_device': max(per_device.values()),
  }


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--dir', default='')
  p.add_argument('--mesh', default='1,4,2')
  p.add_argument('--child', default='')
  p.add_argument('--tiny', action='store_true', help='test size')
  # host8: 8 host-platform CPU devices; default: the machine's accelerators.
  p.add_argument('--devices', default='host8', choices=('host8', 'default'))
  args = p.parse_args(argv)
  if args.child:
    out = convert(args.child, args.mesh)
    print(json.dumps(out))
    return out
  root = args.dir or tempfile.mkdtemp(prefix='convert_memory_')
  src = os.path.join(root, 'ckpt')
  info = write_checkpoint(src, {**HF_CONFIG, **(TINY if args.tiny else {})})
  env = dict(os.environ)
  if args.devices == 'host8':
    env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
    env['JAX_PLATFORMS'] = 'cpu'
  else:  # The machine's accelerators: parameters leave the host.
    env.pop('JAX_PLATFORMS', None)
  out = subprocess.run(
    [sys.executable, '-m', 'experiments.benchmarks.convert_memory',
     f'--child={src}', f'--mesh={args.mesh}'],
    env=env, check=True, capture_output=True, text=True,
  )  # fmt: skip
  info.update(json.loads(out.stdout.strip().splitlines()[-1]))
  mib = 2**20
  info['checkpoint_mib'] = round(info['checkpoint_bytes'] / mib, 1)
  info['placed_param_mib'] = round(info['placed_param_bytes'] / mib, 1)
  info['device_buffer_mib'] = round(info['device_buffer_bytes'] / mib, 1)
  info['load_growth_mib'] = round(
    info['rss_peak_mib'] - info['rss_before_load_mib'], 1
  )
  info['growth_minus_buffers_mib'] = round(
    info['load_growth_mib'] - info['device_buffer_mib'], 1
  )
  print(json.dumps(info, indent=2))
  return info


if __name__ == '__main__':
  main()
