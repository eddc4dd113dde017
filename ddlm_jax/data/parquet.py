"""Hub datasets as Parquet files: local folders, the Hub, downloads.

`datasets` >= 4 runs no loading scripts, so the script datasets the paper
recipes use (OpenWebText, PTB, AG News, scientific papers) are read from
Parquet: the repository's own files where it has them, else the Parquet
conversion the Hub keeps on the ``refs/convert/parquet`` branch
(``<config>/<split>/NNNN.parquet``). Files are read in sorted path order,
which is the row order of the dataset they were converted from.
"""

from __future__ import annotations

import os

# The Hub's conversion branch; URL-encoded in hf:// paths ('/' would end
# the revision there).
CONVERTED = 'refs/convert/parquet'
_CONVERTED_IN_PATH = CONVERTED.replace('/', '%2F')
SPLIT_NAMES = ('train', 'validation', 'test', 'dev')


def parquet_files(folder: str) -> list[str]:
  """Every .parquet file under `folder`, in sorted relative-path order."""
  root = os.path.expanduser(folder)
  found = []
  for dirpath, _, names in os.walk(root):
    found += [os.path.join(dirpath, n) for n in names if n.endswith('.parquet')]
  return sorted(found, key=lambda p: os.path.relpath(p, root))


def split_files(files: list[str], root: str, split: str) -> list[str]:
  """The files of `split`: under a `split/` folder, or named `split-*`.

  Files with no split in their path (a folder of one split) are all kept.
  """
  root = os.path.expanduser(root)

  def split_of(path):
    parts = os.path.relpath(path, root).split(os.sep)
    for part in parts[:-1]:
      name = part.removeprefix('partial-')
      if name in SPLIT_NAMES or name == split:
        return name
    name = parts[-1].split('-')[0].split('.')[0]
    return name if name in SPLIT_NAMES or name == split else None

  marked = [f for f in files if split_of(f) is not None]
  if not marked:
    return files
  return [f for f in marked if split_of(f) == split]


def records_from_folder(path: str, split: str = 'train'):
  """`split` as a Dataset from a Parquet folder or a save_to_disk folder."""
  import datasets

  files = parquet_files(path)
  if files:
    chosen = split_files(files, path, split)
    if not chosen:
      raise ValueError(f'{path} holds no Parquet files of split {split!r}.')
    return datasets.load_dataset('parquet', data_files=chosen, split='train')
  ds = datasets.load_from_disk(path)
  if isinstance(ds, datasets.DatasetDict):
    if split not in ds:
      raise ValueError(f'{path} holds splits {list(ds)}, no {split!r}.')
    ds = ds[split]
  return ds


def hub_parquet(repo: str, own: str, converted: str, split: str = 'train'):
  """`split` of a Hub dataset from Parquet files, never a loading script.

  Args:
    own: glob of the repository's own Parquet files of the split.
    converted: glob of the split on the refs/convert/parquet branch.
  """
  import datasets

  errors = []
  for files in (
    f'hf://datasets/{repo}/{own}',
    f'hf://datasets/{repo}@{_CONVERTED_IN_PATH}/{converted}',
  ):
    try:
      return datasets.load_dataset(
        'parquet', data_files={split: files}, split=split
      )
    except Exception as e:  # noqa: BLE001 - cache/network/missing files.
      errors.append(f'{files}: {type(e).__name__}')
  raise FileNotFoundError('; '.join(errors))


def download_parquet(
  repo: str, target: str, own: str, converted: str
) -> list[str]:
  """Copies a dataset's Parquet files (own, else converted) to target."""
  from huggingface_hub import snapshot_download

  target = os.path.expanduser(target)
  for revision, pattern in ((None, own), (CONVERTED, converted)):
    snapshot_download(
      repo,
      repo_type='dataset',
      revision=revision,
      allow_patterns=[pattern],
      local_dir=target,
    )
    files = parquet_files(target)
    if files:
      return files
  raise FileNotFoundError(f'{repo} has no Parquet files matching {own!r}.')


__all__ = [
  'CONVERTED',
  'download_parquet',
  'hub_parquet',
  'parquet_files',
  'records_from_folder',
  'split_files',
]
