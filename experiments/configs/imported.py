"""Runs of converted checkpoints (LLaDA / Dream; experiments.convert).

  python -m experiments.convert --from=hf --arch=llada SRC --to=DIR
  python -m experiments.run --config=experiments/configs/imported.py:DIR \
    --workdir=DIR --mode=sample   # or --mode=eval, or train to fine-tune

With a directory after the colon, the config is that converted directory's
config.json (a masked-diffusion run whose model block is the imported
model); --config.KEY=VALUE overrides apply on top as usual. Without one
(or with the preset 'smoke') it is the template `experiments.convert`
writes, before the model block is filled in: MDLM's process (log-linear,
SUBS, continuous time, no time conditioning) on OpenWebText rows in the
model's own tokenizer.
"""

import os

from experiments.configs import common


def get_config(arg: str = ''):
  if arg and os.path.isdir(arg):
    from ddlm_jax.tasks.language_model import load_config

    return load_config(arg)
  c = common.mdlm()
  c.data.corpus = 'openwebtext'
  return common.finish(c, arg)
