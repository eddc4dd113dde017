"""Accelerator check of imported LLaDA / Dream models against transformers.

  python -m experiments.benchmarks.interop_check --out=DIR

On the default JAX backend and torch's CUDA device (CPU if none): random
`transformers` LlamaForCausalLM / Qwen2ForCausalLM (width 128, 2 layers, 4
heads, 2 K/V heads, vocabulary 1000), run bidirectionally with right
padding, saved, converted, and compared with ours in float32 (matmuls at
'highest' precision on both sides, so TF32 does not enter) and bfloat16,
for each attention backend that runs here ('xla', and 'cudnn' in bf16 on
CUDA). Writes DIR/interop_check.json with the max |diff| over content
positions per (arch, dtype, impl); the CPU parity tests bound the same
numbers at 1e-4 (f32) and 2e-2 (bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import traceback


def _reference(arch: str, path: str, torch, transformers):
  torch.manual_seed(0)
  kw = dict(
    vocab_size=1000, hidden_size=128, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
  )  # fmt: skip
  if arch == 'llada':
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
  else:
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
  with torch.no_grad():
    for name, p in model.named_parameters():
      if 'norm' in name or name.endswith('bias'):
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(path)
  return model.eval()


def check(out_dir: str) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from ddlm_jax.interop import llama_family as interop
  from ddlm_jax.models.llama_family import LlamaFamily

  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  rows = []
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 1000, (4, 64)).astype(np.int32)
  valid = np.ones((4, 64), bool)
  valid[1, 40:] = valid[3, 50:] = False
  ids[~valid] = 0
  for arch in ('llada', 'dream'):
    src = tempfile.mkdtemp(prefix=f'interop_{arch}_')
    ref = _reference(arch, src, torch, transformers).to(dev)
    with open(os.path.join(src, 'config.json')) as f:
      hf = json.load(f)
    for dtype in ('float32', 'bfloat16'):
      tdt = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
      m = ref.to(tdt)
      mask = torch.zeros(4, 1, 64, 64, device=dev)
      v = torch.tensor(valid, device=dev)
      mask = mask.masked_fill(~v[:, None, None, :], torch.finfo(tdt).min)
      with torch.no_grad():
        want = (
          m(
            input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            attention_mask=mask.to(tdt),
          )
          .logits.float()
          .cpu()
          .numpy()
        )
      if arch == 'dream':
        want = np.concatenate([want[:, :1], want[:, :-1]], axis=1)
      impls = ['xla']
      if jax.default_backend() == 'gpu' and dtype == 'bfloat16':
        impls.append('cudnn')
      for impl in impls:
        row = dict(arch=arch, dtype=dtype, impl=impl, backend=dev)
        try:
          cfg = interop.config_from_hf(
            hf, arch, dtype=dtype, attention_impl=impl
          )
          params = interop.load_params(src, cfg)
          graphdef = nnx.split(
            nnx.eval_shape(lambda c=cfg: LlamaFamily(c, rngs=nnx.Rngs(0))),
            nnx.Param,
          )[0]
          model = nnx.merge(graphdef, params)
          with jax.default_matmul_precision('highest'):
            got = np.asarray(
              jax.jit(lambda x, w, mo=model: mo(x, None, valid_BxL=w))(
                jnp.asarray(ids), jnp.asarray(valid)
              )
            )
          err = float(np.abs(got[valid] - want[valid]).max())
          row.update(max_abs_diff=err, max_abs_logit=float(np.abs(want).max()))
        except Exception as e:  # noqa: BLE001 - recorded, the check goes on.
          row['error'] = f'{type(e).__name__}: {e}'
          row['trace'] = traceback.format_exc()[-2000:]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != 'trace'}))
  result = dict(
    jax=jax.__version__,
    jax_backend=jax.default_backend(),
    devices=[str(d) for d in jax.devices()],
    torch=torch.__version__,
    transformers=transformers.__version__,
    rows=rows,
  )
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, 'interop_check.json'), 'w') as f:
    json.dump(result, f, indent=2)
  return result


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--out', default='.')
  return check(p.parse_args(argv).out)


if __name__ == '__main__':
  main()
