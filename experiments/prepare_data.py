"""Builds a config's data ahead of training: tokenizer and token caches.

  python -m experiments.prepare_data --config=experiments/configs/mdlm_owt.py

Loads (or downloads into the HF cache) the tokenizer, reads every split once
and writes the packed token streams into config.data.cache_dir, so that the
training job starts at once. Run it on every host of a multi-host slice
whose cache_dir is a local disk (the caches are deterministic, so hosts that
build them separately get identical files), or once on a shared folder.
Prints each split's size. Sources that read lazily and cache nothing (text8,
padded LM1B) are only checked.
"""

from absl import app, flags
from ml_collections import config_flags

from ddlm_jax.training import builders

_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Experiment config file (path[:preset]).', lock_config=True
)
flags.mark_flags_as_required(['config'])


def main(argv):
  del argv
  cfg = builders.typed_blocks(_CONFIG.value).data
  data = builders.prepare_data(cfg, None)
  data.source.prepare()
  print(data.source.describe())
  for name in data.source.split_names:
    split = data.source.split(name)
    if hasattr(split, 'docs'):
      print(f'  {name}: {len(split.docs)} documents (padded)')
    else:
      rows = split.num_windows(cfg.seq_len)
      print(f'  {name}: {split.tokens.shape[0]} tokens, {rows} rows')


if __name__ == '__main__':
  app.run(main)
