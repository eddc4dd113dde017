"""LM1B (One Billion Word benchmark) through TFDS ArrayRecord, read without TF.

Data: the TFDS dataset ``lm1b`` (30,301,028 train and 306,688 test
sentences, one sentence per record, feature ``text``) prepared in the
ArrayRecord format, read with ``tfds.data_source`` (random access, no
TensorFlow needed at read time). LM1B has no validation split: like MDLM this
suite evaluates on the test split, so ``validation`` and ``test`` are both the
TFDS ``test`` split.

Preparation (once, ~4 GB download):

* with TensorFlow installed: ``tfds build lm1b --file_format=array_record
  --data_dir=DIR``;
* without TensorFlow: ``python -m ddlm_jax.data.lm1b --data_dir=DIR``. The
  TFDS ``lm1b`` builder needs TensorFlow only for the ``tf.io.gfile.glob`` of
  its ``_split_generators`` (tensorflow-datasets 4.9.10); ``build_lm1b`` runs
  a subclass of it (unregistered, same name, version, metadata and
  checksums) whose ``_split_generators`` globs with Python, producing the
  same ArrayRecord files. An already extracted archive is given to TFDS as
  its ``manual_dir``. It also needs the small ``importlib_resources``
  package.

Tokenizer: ``bert-base-uncased`` (``config.data.hf_tokenizer``), whose
``[CLS]``/``[SEP]``/``[PAD]`` serve as BOS/EOS/PAD. Variants
(``config.data.packing``):

* ``'padded'``: one sentence per row, ``[CLS] ids[:126] [SEP] [PAD]...`` with
  ``batch['loss_mask']`` (MDLM's ``lm1b`` config, ``wrap: False``, the
  setting of its <= 27.04 perplexity);
* ``'packed'``: sentences joined with ``[SEP]``, rows framed by ``[CLS]`` and
  ``[SEP]`` (MDLM's ``wrap: True``), cached as a token stream.

MDLM applies its LM1B detokenizer before tokenizing (``config.data.detokenize
= True`` in the paper configs).
"""

from __future__ import annotations

import argparse
import functools
import glob
import os

from ddlm_jax.data import detokenizers
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.pretrained import (
  TEST_TOKENIZERS,
  DataUnavailableError,
  build_test_tokenizer,
  load_hf_tokenizer,
  subword_tokenizer,
)
from ddlm_jax.data.settings import DataConfig
from ddlm_jax.data.sources import (
  PACKINGS,
  DocumentSplit,
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

TFDS_NAME = 'lm1b'
TFDS_SPLITS = {'train': 'train', 'validation': 'test', 'test': 'test'}
DEFAULT_TOKENIZER = 'bert-base-uncased'
# The statmt archive: its top folder and the raw files of each TFDS split.
ARCHIVE_URL = (
  'http://www.statmt.org/lm-benchmark/'
  '1-billion-word-language-modeling-benchmark-r13output.tar.gz'
)
ARCHIVE_TOP = '1-billion-word-language-modeling-benchmark-r13output'
RAW_FILES = {
  'train': ('training-monolingual.tokenized.shuffled', 'news.en-*'),
  'test': ('heldout-monolingual.tokenized.shuffled', 'news.en.heldout-*'),
}
_TEST_TOKENIZER_DOCS = 20_000


def build_command(data_dir: str) -> str:
  target = data_dir or '~/tensorflow_datasets'
  return (
    f'python -m ddlm_jax.data.lm1b --data_dir={target}   (no TensorFlow '
    f'needed)\n  or, with TensorFlow: tfds build lm1b '
    f'--file_format=array_record --data_dir={target}'
  )


def lm1b_records(split: str, data_dir: str = ''):
  """The TFDS ``lm1b`` split as a random-access ArrayRecord data source.

  Raises:
    DataUnavailableError: not prepared (or not as ArrayRecord) in data_dir.
  """
  import tensorflow_datasets as tfds

  try:
    return tfds.data_source(
      TFDS_NAME,
      split=split,
      data_dir=os.path.expanduser(data_dir) if data_dir else None,
      download=False,
    )
  except Exception as e:  # noqa: BLE001 - tfds raises several types.
    where = data_dir or '$TFDS_DATA_DIR or ~/tensorflow_datasets'
    raise DataUnavailableError(
      f'LM1B ({TFDS_NAME}, split {split!r}) is not prepared as ArrayRecord '
      f'in {where} ({type(e).__name__}: {str(e).splitlines()[0]}). Build '
      f'it with:\n  {build_command(data_dir)}\nthen pass '
      '--config.data.data_dir=DIR.'
    ) from e


def lm1b_documents(split: str, data_dir: str = '', detokenize: bool = False):
  """Sentences of a suite split ('train', 'validation', 'test') as text."""
  if split not in TFDS_SPLITS:
    raise ValueError(f'LM1B split {split!r}; have {sorted(TFDS_SPLITS)}.')
  detok = detokenizers.lm1b if detokenize else None
  return TextColumn(
    lm1b_records(TFDS_SPLITS[split], data_dir), 'text', detokenizer=detok
  )


def _tokenizer(cfg: DataConfig, tokenizer):
  if tokenizer is not None:
    return subword_tokenizer(tokenizer, 'LM1B')
  name = cfg.hf_tokenizer or DEFAULT_TOKENIZER
  if name in TEST_TOKENIZERS:
    docs = lm1b_documents('train', cfg.data_dir, cfg.detokenize)
    texts = docs.get_many(range(min(len(docs), _TEST_TOKENIZER_DOCS)))
    return build_test_tokenizer(name, texts, cfg.test_tokenizer_vocab)
  return load_hf_tokenizer(name)


def lm1b_source(
  cfg: DataConfig, tokenizer: tok_lib.Tokenizer | None = None
) -> Source:
  """The LM1B Source of a run's data settings (module docstring)."""
  if cfg.packing not in PACKINGS:
    raise ValueError(f'data.packing={cfg.packing!r}; choose one of {PACKINGS}.')
  num_proc = prep_processes(cfg)  # Refused now, not at the first split.
  tok = _tokenizer(cfg, tokenizer)
  specials = tok.special_ids
  cache_dir = default_cache_dir(cfg.cache_dir)

  def factory(split):
    def build():
      docs = lm1b_documents(split, cfg.data_dir, cfg.detokenize)
      if cfg.packing == 'padded':
        if specials.pad is None:
          raise ValueError('padded LM1B needs a PAD (or EOS) token.')
        return DocumentSplit(docs, specials.bos, specials.eos, specials.pad)
      bos, eos = framing_ids(cfg.wrap, specials, 'LM1B')
      fingerprint = tokenizer_fingerprint(tok)
      tfds_split = TFDS_SPLITS[split]
      detok = '-detok' if cfg.detokenize else ''
      tokens = cached_stream(
        cache_dir,
        f'lm1b-{tfds_split}{detok}-{fingerprint}',
        {
          'dataset': 'lm1b',
          'split': tfds_split,
          'num_documents': len(docs),
          'detokenize': bool(cfg.detokenize),
          'tokenizer': fingerprint,
          'eos': specials.eos,
        },
        lambda: document_stream(
          docs,
          tok,
          specials.eos,
          label=f'lm1b {tfds_split}',
          num_proc=num_proc,
        ),
        dtype=stream_dtype(tok.vocab_size),
      )
      return PackedSplit(tokens, bos=bos, eos=eos)

    return build

  return Source(
    'lm1b',
    tok,
    {name: factory(name) for name in TFDS_SPLITS},
    notes=(
      f'{cfg.packing}; validation = test = the TFDS test split; '
      f'detokenize={bool(cfg.detokenize)}.'
    ),
  )


@functools.cache
def builder_class():
  """TFDS's ``lm1b`` builder, globbing without TensorFlow (module doc).

  Defined on first use (importing TFDS takes seconds) and not registered,
  so ``tfds.builder('lm1b')`` stays TFDS's own; both read and write the
  same ``DIR/lm1b/1.1.0``.
  """
  import tensorflow_datasets as tfds

  base = tfds.builder_cls(TFDS_NAME)

  class Lm1bWithoutTF(base, skip_registration=True):
    name = TFDS_NAME
    # Metadata and download checksums live beside TFDS's own builder.
    code_path = base.code_path
    pkg_dir_path = base.code_path.parent
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f'Extract {ARCHIVE_URL} here (the folder {ARCHIVE_TOP}/), or leave '
      'this folder empty to download it.'
    )

    def _split_generators(self, dl_manager):
      root = _extracted_archive(dl_manager)
      return [
        tfds.core.SplitGenerator(
          name=split,
          gen_kwargs={'files': sorted(glob.glob(os.path.join(root, *parts)))},
        )
        for split, parts in (
          (tfds.Split.TRAIN, (ARCHIVE_TOP, *RAW_FILES['train'])),
          (tfds.Split.TEST, (ARCHIVE_TOP, *RAW_FILES['test'])),
        )
      ]

  return Lm1bWithoutTF


def _extracted_archive(dl_manager) -> str:
  """The folder holding ``ARCHIVE_TOP``: the manual_dir, else downloaded."""
  try:
    manual = dl_manager.manual_dir
  except AssertionError:  # TFDS: no manual_dir, or an empty one.
    manual = None
  if manual is not None and os.path.isdir(os.path.join(manual, ARCHIVE_TOP)):
    return str(manual)
  return str(dl_manager.download_and_extract(ARCHIVE_URL))


def build_lm1b(data_dir: str, extracted_dir: str | None = None) -> str:
  """Prepares TFDS ``lm1b`` as ArrayRecord without TensorFlow.

  Args:
    data_dir: the TFDS data_dir to write (``DIR/lm1b/1.1.0/...``).
    extracted_dir: an already extracted copy of the statmt archive (the
      folder holding ``1-billion-word-language-modeling-benchmark-r13output``);
      None downloads it (~1.7 GB) through TFDS.

  Returns:
    The prepared dataset folder.
  """
  import tensorflow_datasets as tfds

  config = None
  if extracted_dir is not None:
    folder = os.path.expanduser(extracted_dir)
    if not os.path.isdir(os.path.join(folder, ARCHIVE_TOP)):
      raise DataUnavailableError(
        f'{folder} does not hold the extracted statmt archive (no '
        f'{ARCHIVE_TOP}/ folder in it); extract {ARCHIVE_URL} there.'
      )
    config = tfds.download.DownloadConfig(manual_dir=folder)
  builder = builder_class()(
    data_dir=os.path.expanduser(data_dir), file_format='array_record'
  )
  builder.download_and_prepare(download_config=config)
  return str(builder.data_dir)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description='Prepare TFDS lm1b as ArrayRecord without TensorFlow.'
  )
  parser.add_argument('--data_dir', required=True, help='TFDS data_dir.')
  parser.add_argument(
    '--extracted_dir',
    default=None,
    help='Folder of an already extracted statmt archive (skip download).',
  )
  args = parser.parse_args(argv)
  print(build_lm1b(args.data_dir, args.extracted_dir))


if __name__ == '__main__':
  main()


__all__ = [
  'DEFAULT_TOKENIZER',
  'TFDS_SPLITS',
  'build_lm1b',
  'builder_class',
  'lm1b_documents',
  'lm1b_records',
  'lm1b_source',
]
