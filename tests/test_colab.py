"""Executes the Colab notebooks (smoke presets) with a local kernel."""

import os
import pathlib
import re

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
# A cell that shows a figure: pyplot's show or IPython's display of one.
FIGURE_CELL = re.compile(r'plt\.show\(\)|display\(fig')


def figure_cells_without_image(nb) -> list[str]:
  """The first lines of figure cells that produced no image output."""
  return [
    cell.source.splitlines()[0]
    for cell in nb.cells
    if cell.cell_type == 'code'
    and FIGURE_CELL.search(cell.source)
    and not any('image/png' in o.get('data', {}) for o in cell.outputs)
  ]


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
  assert figure_cells_without_image(nb) == []
  figures = [c for c in nb.cells if FIGURE_CELL.search(c.source)]
  assert figures, 'each notebook plots its run'


def test_the_library_never_chooses_a_matplotlib_backend():
  """matplotlib.use / pyplot would turn a notebook's inline plots off."""
  for path in (ROOT / 'ddlm_jax').rglob('*.py'):
    text = path.read_text()
    assert 'matplotlib.use(' not in text, path
    assert 'import matplotlib.pyplot' not in text, path


def test_curves_are_saved_without_touching_the_backend(tmp_path):
  import json

  import matplotlib

  from ddlm_jax.training import plots

  records = [
    {'step': 2, 'split': 'train', 'nelbo_per_token': 3.0},
    {
      'step': 2,
      'split': 'validation',
      'bits_per_token': 4.0,
      'bits_per_token_stderr': 0.1,
    },
  ]
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  before = matplotlib.get_backend()
  path = plots.plot_curves(str(tmp_path))
  assert matplotlib.get_backend() == before
  assert open(path, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
  fig = plots.curves_figure(records)
  assert [ax.get_title() for ax in fig.axes] == ['training loss', 'validation']


def test_there_is_a_quickstart_notebook():
  assert (ROOT / 'colab' / 'quickstart.ipynb') in NOTEBOOKS
  assert os.path.getsize(ROOT / 'colab' / 'quickstart.ipynb') > 0


def test_the_quickstart_notebook_uses_the_python_api():
  nb = nbformat.read(ROOT / 'colab' / 'quickstart.ipynb', as_version=4)
  code = '\n'.join(c.source for c in nb.cells if c.cell_type == 'code')
  assert 'ddlm_jax.load(workdir)' in code
  for call in ('model.score(', 'model.generate(', 'model.infill('):
    assert call in code
