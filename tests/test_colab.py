"""Executes the Colab notebooks (smoke presets) with a local kernel."""

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
# samplers.ipynb loads a trained run and has its own test
# (tests/test_colab_samplers.py); every other notebook runs here.
OWN_TESTS = ('samplers.ipynb',)
NOTEBOOKS = sorted(
  p for p in (ROOT / 'colab').glob('*.ipynb') if p.name not in OWN_TESTS
)


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
  monkeypatch.setenv('PYTHONPATH', str(ROOT))
  # One CPU device in the kernel (the smoke preset needs no mesh), and the
  # suite's cheap compilation (tests/conftest.py).
  flags = os.environ.get('XLA_FLAGS', '').split()
  kept = [f for f in flags if 'device_count' not in f]
  monkeypatch.setenv('XLA_FLAGS', ' '.join(kept))
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(
    nb,
    timeout=600,
    kernel_name='python3',
    resources={'metadata': {'path': str(ROOT)}},
  )
  client.execute()
  outputs = [
    o.get('text', '') for c in nb.cells if c.cell_type == 'code'
    for o in c.get('outputs', [])
  ]  # fmt: skip
  assert any('validation bits/char' in text for text in outputs)


def test_there_is_a_quickstart_notebook():
  assert (ROOT / 'colab' / 'quickstart.ipynb') in NOTEBOOKS
  assert os.path.getsize(ROOT / 'colab' / 'quickstart.ipynb') > 0
