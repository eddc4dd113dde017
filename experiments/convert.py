"""Convert published checkpoints to ddlm_jax directories and back.

  # HF safetensors (LLaDA / Dream layout) -> a converted directory:
  python -m experiments.convert --from=hf --arch=llada SRC --to=WORKDIR
  # A converted directory -> safetensors + config.json transformers loads:
  python -m experiments.convert --from=workdir WORKDIR --to_hf=DIR
  # An MDLM / Duo / BD3-LM DiT checkpoint -> a run of backbone 'dit':
  python -m experiments.convert --from=hf --arch=dit SRC --to=WORKDIR

SRC is a local folder (config.json, *.safetensors or a sharded index,
tokenizer files); nothing is downloaded. WORKDIR becomes a run directory
at step 0 (see ddlm_jax.interop.workdir), so

  python -m experiments.run --config=experiments/configs/imported.py:WORKDIR \
    --workdir=WORKDIR --mode=sample

samples it (and --mode=eval scores it, --mode=train fine-tunes it).
`--mesh=DATA,FSDP,TENSOR` places the parameters on that mesh while reading
(default: all devices on the fsdp axis), tensor by tensor; see
docs/IMPORT.md for memory.
"""

from __future__ import annotations

import argparse
import sys

from ddlm_jax.training.config import ConfigError

ARCHS = ('llada', 'dream', 'dit')


def parse(argv):
  p = argparse.ArgumentParser(
    prog='python -m experiments.convert', description=__doc__.split('\n')[0]
  )
  p.add_argument('src', help='checkpoint folder (or converted directory)')
  p.add_argument('--from', dest='source', choices=('hf', 'workdir'),
                 required=True)  # fmt: skip
  p.add_argument('--arch', choices=ARCHS, help='layout of an hf source')
  p.add_argument('--to', help='converted directory to write (--from=hf)')
  p.add_argument('--to_hf', help='HF folder to write (--from=workdir)')
  p.add_argument('--mesh', default='', help='DATA,FSDP,TENSOR sizes')
  p.add_argument('--param_dtype', default='float32',
                 choices=('float32', 'bfloat16'))  # fmt: skip
  p.add_argument('--mask_token_id', type=int, default=None)
  p.add_argument('--seq_len', type=int, default=1024,
                 help='data.seq_len of the written run config')  # fmt: skip
  args = p.parse_args(argv)
  if args.source == 'hf' and not (args.arch and args.to):
    p.error('--from=hf needs --arch=llada|dream|dit and --to=WORKDIR.')
  if args.source == 'workdir' and not args.to_hf:
    p.error('--from=workdir needs --to_hf=DIR.')
  return args


def run_config(workdir: str, seq_len: int) -> dict:
  """The run config a converted directory is saved with: the template of
  experiments/configs/imported.py with rows of seq_len tokens of the
  model's own tokenizer; override any key when running
  (--config.data.corpus=..., --config.sample.steps=...)."""
  import os

  from experiments.configs import imported

  c = imported.get_config()
  c.data.hf_tokenizer = os.path.abspath(os.path.join(workdir, 'tokenizer'))
  c.data.seq_len = seq_len
  return c.to_dict()


def _mesh(spec: str):
  import jax

  from ddlm_jax.parallel import make_mesh

  if not spec:
    return make_mesh((1, jax.device_count(), 1))
  try:
    shape = tuple(int(x) for x in spec.split(','))
  except ValueError:
    shape = ()
  if len(shape) != 3:
    raise ConfigError(f'--mesh={spec!r}; give DATA,FSDP,TENSOR, e.g. 1,8,1.')
  return make_mesh(shape)


def main(argv=None) -> int:
  args = parse(sys.argv[1:] if argv is None else argv)
  from ddlm_jax.interop import workdir as workdir_lib

  if args.source == 'workdir':
    files = workdir_lib.export_hf(args.src, args.to_hf, args.param_dtype)
    print(f'wrote {len(files)} safetensors file(s) and config.json to '
          f'{args.to_hf}')  # fmt: skip
    return 0
  if args.arch == 'dit':
    from ddlm_jax.interop import dit

    cfg = dit.convert_dir(args.src, args.to, run_config(args.to, args.seq_len))
    print(f"converted a DiT ({cfg['depth']} blocks, width {cfg['width']}) "
          f'into {args.to}')  # fmt: skip
    return 0
  over = {}
  if args.mask_token_id is not None:
    over['mask_token_id'] = args.mask_token_id
  cfg = workdir_lib.convert_hf(
    args.src,
    args.to,
    args.arch,
    run_config=run_config(args.to, args.seq_len),
    mesh=_mesh(args.mesh),
    param_dtype=args.param_dtype,
    **over,
  )
  print(f'converted a {args.arch} model ({cfg.depth} layers, width '
        f'{cfg.width}) into {args.to}')  # fmt: skip
  return 0


if __name__ == '__main__':
  try:
    sys.exit(main())
  except (ConfigError, FileNotFoundError, FileExistsError, KeyError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
