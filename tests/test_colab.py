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
_RESOURCES = {'metadata': {'path': str(ROOT)}}


@pytest.fixture(scope='module')
def kernel():
  """One kernel for the notebooks of this file: its start and the jax /
  ddlm_jax imports (~5 s of CPU) are paid once, not once per notebook."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('PYTHONPATH', str(ROOT))
    # One CPU device in the kernel (the smoke preset needs no mesh), and the
    # suite's cheap compilation (tests/conftest.py).
    flags = os.environ.get('XLA_FLAGS', '').split()
    kept = [f for f in flags if 'device_count' not in f]
    mp.setenv('XLA_FLAGS', ' '.join(kept))
    owner = NotebookClient(
      nbformat.v4.new_notebook(), kernel_name='python3', resources=_RESOURCES
    )
    with owner.setup_kernel():
      yield owner


def _execute(nb, kernel):
  """Runs `nb` in the shared kernel and returns it (with outputs)."""
  client = NotebookClient(
    nb, km=kernel.km, timeout=600, kernel_name='python3', resources=_RESOURCES
  )
  client.kc = kernel.kc
  return client.execute()


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, kernel):
  # An empty namespace, as in a fresh kernel: a notebook must define (and
  # import) every name it uses itself.
  _execute(nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell('%reset -f')
  ]), kernel)  # fmt: skip
  nb = _execute(nbformat.read(path, as_version=4), kernel)
  outputs = [
    o.get('text', '') for c in nb.cells if c.cell_type == 'code'
    for o in c.get('outputs', [])
  ]  # fmt: skip
  assert any('validation bits/char' in text for text in outputs)


def test_there_is_a_quickstart_notebook():
  assert (ROOT / 'colab' / 'quickstart.ipynb') in NOTEBOOKS
  assert os.path.getsize(ROOT / 'colab' / 'quickstart.ipynb') > 0
