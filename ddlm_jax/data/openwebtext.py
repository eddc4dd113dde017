"""OpenWebText through HF ``datasets``, GPT-2 tokens, packed to 1024.

Data: the 8,013,769 documents of OpenWebText (one ``train`` split, column
``text``), read without any dataset script (``datasets`` >= 4 runs none):

* ``config.data.data_dir`` a folder of Parquet files (the Hub's Parquet
  conversion, e.g. ``plain_text/train/0000.parquet`` ...; files are read in
  sorted path order, which is the corpus's document order) or a folder
  written by ``Dataset.save_to_disk``; the offline route, e.g. copied to
  every host. ``python -m ddlm_jax.data.openwebtext --save_to=DIR``
  downloads the Parquet files there.
* no data_dir: the Parquet files of ``config.data.hf_dataset`` from the HF
  cache (and the Hub unless ``HF_DATASETS_OFFLINE=1``): the repository's own
  Parquet files if it has them, else its ``refs/convert/parquet`` branch.

Either way the documents and their order are those of the original
dataset, so the splits below select the same documents as before.

Tokenizer: ``gpt2`` (``<|endoftext|>`` is both BOS and EOS). Each document
is followed by EOS and the documents are joined into one stream, cached on
disk as uint16 (~18 GB for all of OWT) and memory-mapped. Rows of
``seq_len`` tokens are framed by ``config.data.wrap``: ``'bos_eos'`` (MDLM:
``[BOS] ... [EOS]`` around every row) or ``'eos'`` (md4: plain 1024-token
chunks of the EOS-separated stream).

Splits (``config.data.owt_split``):

* ``'mdlm'``: the last ``owt_validation_docs`` (100,000) documents are
  validation, the rest train (MDLM's ``train[:-100000]`` /
  ``train[-100000:]``);
* ``'md4'``: the whole corpus is cut into rows and a seeded
  ``owt_validation_fraction`` (2%) of the rows is validation. md4's
  ``prepare_openwebtext_data.py`` does the same per group of 10k documents
  with an unseeded shuffle, so its exact rows cannot be reproduced; here the
  choice is a fixed seeded permutation (``MD4_SPLIT_SEED``) over all rows.

MDLM groups the concatenation per 1000-document ``map`` batch (dropping each
batch's tail); this stream drops only the final tail, and the training
windows move by a random per-epoch offset (``ddlm_jax.data.pipeline``).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from ddlm_jax.data import parquet
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.pretrained import (
  TEST_TOKENIZERS,
  DataUnavailableError,
  build_test_tokenizer,
  load_hf_tokenizer,
  subword_tokenizer,
)
from ddlm_jax.data.settings import OWT_SPLITS, DataConfig
from ddlm_jax.data.sources import (
  PackedSplit,
  Source,
  TextColumn,
  cached_stream,
  default_cache_dir,
  document_stream,
  framing_ids,
  prep_processes,
  stream_dtype,
)
from ddlm_jax.data.tokenizers import tokenizer_fingerprint

DEFAULT_TOKENIZER = 'gpt2'
NUM_DOCUMENTS = 8_013_769
MD4_SPLIT_SEED = 0x4D44
_TEST_TOKENIZER_DOCS = 5_000


# Parquet globs: the repository's own files, and its Hub conversion.
OWN_PARQUET = '**/*.parquet'
CONVERTED_PARQUET = 'plain_text/*/*.parquet'


def save_command(hf_dataset: str, target: str = '~/ddlm_data/openwebtext'):
  return (
    'python -m ddlm_jax.data.openwebtext '
    f'--hf_dataset={hf_dataset} --save_to={target}'
  )


def owt_records(cfg: DataConfig):
  """The OWT ``train`` records from Parquet (or a save_to_disk folder).

  Raises:
    DataUnavailableError: neither the folder nor a cached copy exists.
  """
  if cfg.data_dir:
    path = os.path.expanduser(cfg.data_dir)
    if not os.path.isdir(path):
      raise DataUnavailableError(
        f'OpenWebText folder {path} not found. Download its Parquet files '
        f'there with:\n  {save_command(cfg.hf_dataset, cfg.data_dir)}'
      )
    return parquet.records_from_folder(path)
  try:
    ds = parquet.hub_parquet(cfg.hf_dataset, OWN_PARQUET, CONVERTED_PARQUET)
  except Exception as e:  # noqa: BLE001 - network, cache and missing files.
    raise DataUnavailableError(
      f'Could not load the Parquet files of {cfg.hf_dataset!r} from the HF '
      f'cache or Hub ({str(e).splitlines()[0] if str(e) else ""}). '
      'On a machine with internet save it once with:\n  '
      f'{save_command(cfg.hf_dataset)}\nthen pass '
      '--config.data.data_dir=~/ddlm_data/openwebtext.'
    ) from e
  if cfg.hf_dataset == 'Skylion007/openwebtext' and len(ds) != NUM_DOCUMENTS:
    raise DataUnavailableError(
      f'{cfg.hf_dataset} loaded {len(ds)} documents, not {NUM_DOCUMENTS} '
      '(a partial Parquet conversion?); the document split would differ. '
      f'Save the full corpus with:\n  {save_command(cfg.hf_dataset)}'
    )
  return ds


def _tokenizer(cfg: DataConfig, tokenizer, records):
  if tokenizer is not None:
    return subword_tokenizer(tokenizer, 'OpenWebText')
  name = cfg.hf_tokenizer or DEFAULT_TOKENIZER
  if name in TEST_TOKENIZERS:
    docs = TextColumn(records(), 'text')
    texts = docs.get_many(range(min(len(docs), _TEST_TOKENIZER_DOCS)))
    return build_test_tokenizer(name, texts, cfg.test_tokenizer_vocab)
  return load_hf_tokenizer(name)


def md4_window_split(
  num_windows: int, fraction: float, seed: int = MD4_SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
  """(train, validation) row ids: a seeded ``fraction`` of rows held out."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f'owt_validation_fraction {fraction} not in (0, 1).')
  n_val = max(1, int(round(fraction * num_windows)))
  if n_val >= num_windows:
    raise ValueError(
      f'{num_windows} rows are too few to hold out {n_val} for validation.'
    )
  perm = np.random.default_rng([seed, num_windows]).permutation(num_windows)
  return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def openwebtext_source(
  cfg: DataConfig, tokenizer: tok_lib.Tokenizer | None = None
) -> Source:
  """The OpenWebText Source of a run's data settings (module docstring)."""
  if cfg.owt_split not in OWT_SPLITS:
    raise ValueError(
      f'data.owt_split={cfg.owt_split!r}; choose one of {OWT_SPLITS}.'
    )
  if cfg.packing != 'packed':
    raise ValueError(
      "OpenWebText is packed only; set --config.data.packing='packed'."
    )
  num_proc = prep_processes(cfg)  # Refused now, not at the first split.
  state: dict = {}

  def records():
    if 'records' not in state:
      state['records'] = owt_records(cfg)
    return state['records']

  tok = _tokenizer(cfg, tokenizer, records)
  specials = tok.special_ids
  bos, eos = framing_ids(cfg.wrap, specials, 'OpenWebText')
  fingerprint = tokenizer_fingerprint(tok)
  cache_dir = default_cache_dir(cfg.cache_dir)

  def stream(start: int, stop: int | None, tag: str):
    recs = records()
    docs = TextColumn(recs, 'text', start=start, stop=stop)
    meta = {
      'dataset': 'openwebtext',
      'num_documents_total': len(recs),
      'documents': [docs.start, docs.stop],
      'tokenizer': fingerprint,
      'eos': specials.eos,
    }
    return cached_stream(
      cache_dir,
      f'openwebtext-{tag}-{docs.start}-{docs.stop}-{fingerprint}',
      meta,
      lambda: document_stream(
        docs,
        tok,
        specials.eos,
        label=f'openwebtext {tag}',
        num_proc=num_proc,
      ),
      dtype=stream_dtype(tok.vocab_size),
    )

  def mdlm_range(split):
    n = len(records())
    n_val = int(cfg.owt_validation_docs)
    if not 0 < n_val < n:
      raise ValueError(
        f'owt_validation_docs={n_val} must be in (0, {n}) for a corpus of '
        f'{n} documents.'
      )
    return (0, n - n_val) if split == 'train' else (n - n_val, n)

  def factory(split):
    def build():
      if cfg.owt_split == 'mdlm':
        start, stop = mdlm_range(split)
        return PackedSplit(stream(start, stop, split), bos=bos, eos=eos)
      tokens = stream(0, None, 'all')
      grid = PackedSplit(tokens, bos=bos, eos=eos)
      inner = grid.inner_len(cfg.seq_len)
      train, val = md4_window_split(
        tokens.shape[0] // inner, cfg.owt_validation_fraction
      )
      return PackedSplit(
        tokens,
        bos=bos,
        eos=eos,
        window_ids=train if split == 'train' else val,
        grid_len=cfg.seq_len,
      )

    return build

  return Source(
    'openwebtext',
    tok,
    {name: factory(name) for name in ('train', 'validation')},
    notes=f'{cfg.owt_split} split; wrap={cfg.wrap}.',
  )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description='Download OpenWebText as Parquet files (no dataset script).'
  )
  parser.add_argument('--save_to', required=True)
  parser.add_argument('--hf_dataset', default='Skylion007/openwebtext')
  args = parser.parse_args(argv)
  files = parquet.download_parquet(
    args.hf_dataset, args.save_to, OWN_PARQUET, CONVERTED_PARQUET
  )
  ds = parquet.records_from_folder(args.save_to)
  print(f'{len(ds)} documents in {len(files)} Parquet files -> {args.save_to}')


if __name__ == '__main__':
  main()


__all__ = [
  'DEFAULT_TOKENIZER',
  'OWT_SPLITS',
  'md4_window_split',
  'openwebtext_source',
  'owt_records',
]
