"""The zero-shot likelihood suite of MDLM/SEDD: datasets, splits, columns.

Models trained on OpenWebText are scored on other corpora without training
on them. The suite (MDLM Table 3) and where each set comes from:

=========== ============================== ========== ======== ==============
name        source                         split      column   detokenizer
=========== ============================== ========== ======== ==============
ptb         HF ``ptb_text_only``           validation sentence ptb
wikitext2   HF ``wikitext-2-raw-v1``       validation text     wikitext
wikitext103 HF ``wikitext-103-raw-v1``     validation text     wikitext
lm1b        TFDS ``lm1b`` (ArrayRecord)    test       text     lm1b
lambada     HF ``EleutherAI/lambada_openai`` test     text     lambada
ag_news     HF ``ag_news``                 test       text     (none)
pubmed      HF ``scientific_papers/pubmed`` validation article scientific
arxiv       HF ``scientific_papers/arxiv`` validation article  scientific
=========== ============================== ========== ======== ==============

The splits are MDLM's: its loader uses ``test`` for lm1b and ag_news and
``validation`` for the others; for LAMBADA it reads OpenAI's
``lambada_test.jsonl`` (5,153 passages), which ``EleutherAI/lambada_openai``
(config ``en``) serves as its ``test`` split. Each row is one document (as in
MDLM: a WikiText row is one line of the article, empty lines included).

Loading order for a name, never through a loading script (``datasets`` >= 4
runs none): a folder ``data_dir/<name>`` of Parquet files (the split's
files are picked by their ``<split>/`` folder or ``<split>-`` prefix) or
written by ``save_to_disk``; then the Hub repository (HF cache first) as
``datasets.load_dataset`` reads data-only repositories; then, for the
former script datasets (``ptb_text_only``, ``ag_news``,
``scientific_papers``), the Parquet conversion the Hub keeps for them
(``ddlm_jax.data.parquet``). ``python -m ddlm_jax.data.zero_shot
--save_to=DIR`` downloads the suite's Parquet files into ``DIR/<name>``
for offline hosts. LM1B comes from TFDS like the LM1B training source.
"""

from __future__ import annotations

import dataclasses
import os

from ddlm_jax.data import detokenizers, parquet
from ddlm_jax.data.pretrained import DataUnavailableError
from ddlm_jax.data.sources import TextColumn


@dataclasses.dataclass(frozen=True)
class ZeroShotDataset:
  """Where one zero-shot set comes from and how its text is cleaned."""

  name: str
  hf_path: str
  hf_config: str | None
  split: str
  column: str
  detokenizer: str = ''
  via: str = 'hf'  # 'hf' or 'tfds'
  # The config folder of the Hub's Parquet conversion ('' = hf_config,
  # else 'default').
  parquet_config: str = ''

  @property
  def parquet_dir(self) -> str:
    return self.parquet_config or self.hf_config or 'default'


ZERO_SHOT_DATASETS: dict[str, ZeroShotDataset] = {
  d.name: d
  for d in (
    ZeroShotDataset(
      'ptb', 'ptb_text_only', None, 'validation', 'sentence', 'ptb',
      parquet_config='penn_treebank',
    ),
    ZeroShotDataset(
      'wikitext2', 'wikitext', 'wikitext-2-raw-v1', 'validation', 'text',
      'wikitext',
    ),
    ZeroShotDataset(
      'wikitext103', 'wikitext', 'wikitext-103-raw-v1', 'validation', 'text',
      'wikitext',
    ),
    ZeroShotDataset('lm1b', 'lm1b', None, 'test', 'text', 'lm1b', via='tfds'),
    ZeroShotDataset(
      'lambada', 'EleutherAI/lambada_openai', 'en', 'test', 'text', 'lambada'
    ),
    ZeroShotDataset('ag_news', 'ag_news', None, 'test', 'text'),
    ZeroShotDataset(
      'pubmed', 'scientific_papers', 'pubmed', 'validation', 'article',
      'scientific_papers',
    ),
    ZeroShotDataset(
      'arxiv', 'scientific_papers', 'arxiv', 'validation', 'article',
      'scientific_papers',
    ),
  )
}  # fmt: skip
# MDLM Table 3's columns, in its order.
SUITE = ('ptb', 'wikitext2', 'lm1b', 'lambada', 'ag_news', 'pubmed', 'arxiv')


def get_dataset(name: str) -> ZeroShotDataset:
  if name not in ZERO_SHOT_DATASETS:
    raise ValueError(
      f'Unknown zero-shot dataset {name!r}; choose from '
      f'{sorted(ZERO_SHOT_DATASETS)}.'
    )
  return ZERO_SHOT_DATASETS[name]


def save_command(spec: ZeroShotDataset, split: str, data_dir: str) -> str:
  target = data_dir or '~/ddlm_data/zero_shot'
  return (
    f'python -m ddlm_jax.data.zero_shot --names={spec.name} '
    f'--split={split} --save_to={target}'
  )


def _globs(spec: ZeroShotDataset, split: str) -> tuple[str, str]:
  """Parquet globs of a split: the repository's own files, the conversion."""
  folder = spec.parquet_dir
  return f'{folder}/{split}-*.parquet', f'{folder}/*{split}/*.parquet'


def _from_hub(spec: ZeroShotDataset, split: str):
  import datasets

  try:  # A data-only repository (Parquet, JSON, ...): no script runs.
    return datasets.load_dataset(spec.hf_path, spec.hf_config, split=split)
  except Exception as e:  # noqa: BLE001 - a script dataset, cache, network.
    first = f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'
  try:
    return parquet.hub_parquet(spec.hf_path, *_globs(spec, split), split=split)
  except FileNotFoundError as e:
    raise FileNotFoundError(f'{first}; Parquet: {e}') from e


def load_zero_shot(
  name: str,
  *,
  data_dir: str = '',
  tfds_data_dir: str = '',
  split: str = '',
  detokenize: bool = True,
) -> TextColumn:
  """The documents of zero-shot set ``name``, detokenized (module docstring).

  Args:
    name: a key of ``ZERO_SHOT_DATASETS``.
    data_dir: folder of Parquet (or ``save_to_disk``) copies, one
      sub-folder per name.
    tfds_data_dir: TFDS data_dir for ``lm1b``.
    split: override the suite's split.
    detokenize: apply the set's detokenizer (the papers do).

  Raises:
    DataUnavailableError: no local copy and nothing cached; says how to get
      it.
  """
  spec = get_dataset(name)
  split = split or spec.split
  detok = detokenizers.get_detokenizer(spec.detokenizer) if detokenize else None
  local = os.path.join(os.path.expanduser(data_dir), name) if data_dir else ''
  if local and os.path.isdir(local):
    return TextColumn(
      parquet.records_from_folder(local, split), spec.column, detokenizer=detok
    )
  if spec.via == 'tfds':
    from ddlm_jax.data.lm1b import lm1b_records

    return TextColumn(
      lm1b_records(split, tfds_data_dir), spec.column, detokenizer=detok
    )
  try:
    ds = _from_hub(spec, split)
  except Exception as e:  # noqa: BLE001 - cache/network/missing files.
    first = str(e).splitlines()[0] if str(e) else ''
    raise DataUnavailableError(
      f'Zero-shot set {name!r} ({spec.hf_path}, {split}) is not in '
      f'{local or "data_dir"} nor the HF cache ({type(e).__name__}: {first}).'
      f' Save it once, on a machine with internet, with:\n  '
      f'{save_command(spec, split, data_dir)}\nthen pass --data_dir='
      f'{data_dir or "~/ddlm_data/zero_shot"} (Parquet or save_to_disk '
      'folders, one per set).'
    ) from e
  return TextColumn(ds, spec.column, detokenizer=detok)


def main(argv=None) -> None:
  """Downloads zero-shot sets as Parquet files into SAVE_TO/<name>."""
  import argparse

  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument('--save_to', required=True)
  parser.add_argument('--names', default=','.join(SUITE))
  parser.add_argument('--split', default='', help="'' = each set's split")
  args = parser.parse_args(argv)
  for name in filter(None, args.names.split(',')):
    spec = get_dataset(name)
    if spec.via != 'hf':
      print(f'{name}: from TFDS (docs/LAUNCH.md), skipped')
      continue
    split = args.split or spec.split
    target = os.path.join(os.path.expanduser(args.save_to), name)
    files = parquet.download_parquet(spec.hf_path, target, *_globs(spec, split))
    docs = len(parquet.records_from_folder(target, split))
    print(f'{name}: {docs} documents in {len(files)} Parquet files -> {target}')


if __name__ == '__main__':
  main()


__all__ = [
  'SUITE',
  'ZERO_SHOT_DATASETS',
  'ZeroShotDataset',
  'get_dataset',
  'load_zero_shot',
]
