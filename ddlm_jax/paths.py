"""Workdir paths: one API for local directories and object stores.

A workdir is a local directory or any `etils.epath` URI (``gs://bucket/run``,
``s3://...``). Every read and write of a run's files (checkpoints' listing,
records, config.json, tokenizer, samples, the lock) goes through these
functions, which hand URIs to `etils.epath` (the path API orbax writes
checkpoints through) and keep local paths on the operating system's calls,
where a rename is atomic and a file can be appended to.

Paths stay strings: they are joined with '/' for URIs (no OS separators)
and made absolute only when local.
"""

from __future__ import annotations

import os


def is_remote(path) -> bool:
  """Whether `path` is a URI (gs://, s3://, ...) rather than a local path."""
  text = os.fspath(path) if not isinstance(path, str) else path
  return '://' in text and not text.startswith('file://')


def absolute(path) -> str:
  """The absolute form of a local path; a URI as given (no trailing /)."""
  text = os.fspath(path)
  if is_remote(text):
    scheme, rest = text.split('://', 1)
    return f'{scheme}://{rest.rstrip("/")}'
  return os.path.abspath(text)


def join(path, *names) -> str:
  """path/name... for local paths and URIs alike."""
  text = os.fspath(path)
  if not is_remote(text):
    return os.path.join(text, *names)
  return '/'.join([text.rstrip('/'), *names])


def epath(path):
  """`path` as an `etils.epath.Path` (imported on first use: it is not
  needed to import the package)."""
  from etils import epath as epath_lib

  return epath_lib.Path(os.fspath(path))


def exists(path) -> bool:
  if is_remote(path):
    return epath(path).exists()
  return os.path.exists(path)


def isdir(path) -> bool:
  if is_remote(path):
    return epath(path).is_dir()
  return os.path.isdir(path)


def isfile(path) -> bool:
  if is_remote(path):
    return epath(path).is_file()
  return os.path.isfile(path)


def listdir(path) -> list[str]:
  """Names in directory `path`; FileNotFoundError when there is none.

  An object store has no empty directories: a prefix without objects is
  reported missing, as a missing local directory is.
  """
  if not is_remote(path):
    return os.listdir(path)
  target = epath(path)
  if not target.is_dir():
    raise FileNotFoundError(f'No such directory: {path}')
  return [p.name for p in target.iterdir()]


def makedirs(path) -> None:
  if is_remote(path):
    epath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def read_text(path) -> str:
  if is_remote(path):
    return epath(path).read_text()
  with open(path, encoding='utf-8') as f:
    return f.read()


def read_bytes(path) -> bytes:
  if is_remote(path):
    return epath(path).read_bytes()
  with open(path, 'rb') as f:
    return f.read()


def write_text(path, text: str) -> None:
  """Writes a whole file: atomically on local disks (tmp + rename); an
  object store's single upload is atomic already."""
  write_bytes(path, text.encode('utf-8'))


def write_bytes(path, data: bytes) -> None:
  """`write_text` for bytes."""
  path = os.fspath(path)
  if is_remote(path):
    target = epath(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return
  with open(path + '.tmp', 'wb') as f:
    f.write(data)
  os.replace(path + '.tmp', path)


def rename(src, dst) -> None:
  """Moves `src` to `dst` (a file or a directory tree); an object store
  copies and deletes, so there it is not atomic."""
  if is_remote(src) or is_remote(dst):
    epath(src).rename(epath(dst))
  else:
    os.rename(src, dst)


def remove(path) -> None:
  """Deletes a file; a missing one is no error."""
  try:
    if is_remote(path):
      epath(path).unlink()
    else:
      os.unlink(path)
  except FileNotFoundError:
    pass


def copy_file(src, dst) -> None:
  """Copies one file between any two paths (local or URI)."""
  if is_remote(src) or is_remote(dst):
    epath(dst).parent.mkdir(parents=True, exist_ok=True)
    epath(src).copy(epath(dst), overwrite=True)
  else:
    import shutil

    shutil.copy2(src, dst)


def copy_tree(src, dst) -> None:
  """Copies directory `src` into `dst` (created), keeping files there."""
  makedirs(dst)
  for name in listdir(src):
    here, there = join(src, name), join(dst, name)
    if isdir(here):
      copy_tree(here, there)
    else:
      copy_file(here, there)
