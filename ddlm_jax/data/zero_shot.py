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

Loading order for a name: a ``save_to_disk`` folder ``data_dir/<name>``
(a ``Dataset`` or a ``DatasetDict`` holding the split) if present, then
``datasets.load_dataset`` (HF cache, then the Hub unless offline). LM1B
comes from TFDS like the LM1B training source. ``ptb_text_only``,
``scientific_papers`` and ``ag_news`` were script datasets; ``datasets>=4``
no longer runs scripts, so on a recent ``datasets`` save them with an older
one (or from their parquet conversion) into ``data_dir`` first; the error
message prints the command.
"""

from __future__ import annotations

import dataclasses
import os

from ddlm_jax.data import detokenizers
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


ZERO_SHOT_DATASETS: dict[str, ZeroShotDataset] = {
  d.name: d
  for d in (
    ZeroShotDataset(
      'ptb', 'ptb_text_only', None, 'validation', 'sentence', 'ptb'
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
  config = f', {spec.hf_config!r}' if spec.hf_config else ''
  target = os.path.join(data_dir or '~/ddlm_data/zero_shot', spec.name)
  return (
    'python -c "import datasets; datasets.load_dataset('
    f'{spec.hf_path!r}{config}, split={split!r}).save_to_disk('
    f"'{target}')\""
  )


def _from_disk(path: str, split: str):
  import datasets

  ds = datasets.load_from_disk(path)
  if isinstance(ds, datasets.DatasetDict):
    if split not in ds:
      raise ValueError(f'{path} has splits {list(ds)}, not {split!r}.')
    ds = ds[split]
  return ds


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
    data_dir: folder of ``save_to_disk`` copies, one sub-folder per name.
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
    return TextColumn(_from_disk(local, split), spec.column, detokenizer=detok)
  if spec.via == 'tfds':
    from ddlm_jax.data.lm1b import lm1b_records

    return TextColumn(
      lm1b_records(split, tfds_data_dir), spec.column, detokenizer=detok
    )
  import datasets

  try:
    ds = datasets.load_dataset(spec.hf_path, spec.hf_config, split=split)
  except Exception as e:  # noqa: BLE001 - cache/network/script errors.
    first = str(e).splitlines()[0] if str(e) else ''
    raise DataUnavailableError(
      f'Zero-shot set {name!r} ({spec.hf_path}, {split}) is not in '
      f'{local or "data_dir"} nor the HF cache ({type(e).__name__}: {first}).'
      f' Save it once, on a machine with internet, with:\n  '
      f'{save_command(spec, split, data_dir)}\nthen pass --data_dir='
      f'{data_dir or "~/ddlm_data/zero_shot"}. (Script datasets need '
      "pip install 'datasets<4' for that step.)"
    ) from e
  return TextColumn(ds, spec.column, detokenizer=detok)


__all__ = [
  'SUITE',
  'ZERO_SHOT_DATASETS',
  'ZeroShotDataset',
  'get_dataset',
  'load_zero_shot',
]
