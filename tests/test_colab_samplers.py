"""Executes colab/samplers.ipynb on the suite's shared smoke run.

tests/test_colab.py runs the other notebooks; this one gets the suite's
shared smoke run through DDLM_SAMPLERS_WORKDIR (the path a user sets; with
none the notebook trains its own smoke run) and the test checks what it
shows.
"""

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / 'colab' / 'samplers.ipynb'


@pytest.fixture(scope='module')
def smoke_run(smoke_mdlm_run):
  """The suite's shared smoke run (tests/conftest.py); the notebook samples
  it itself, so the run needs no samples of its own."""
  return smoke_mdlm_run[0]


@pytest.mark.slow
def test_samplers_notebook_on_a_trained_run(smoke_run, monkeypatch):
  monkeypatch.setenv('PYTHONPATH', str(ROOT))
  monkeypatch.setenv('DDLM_SAMPLERS_WORKDIR', smoke_run)
  monkeypatch.delenv('DDLM_SAMPLERS_SCORER', raising=False)
  flags = os.environ.get('XLA_FLAGS', '').split()
  kept = [f for f in flags if 'device_count' not in f]
  monkeypatch.setenv('XLA_FLAGS', ' '.join(kept))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(
    nb,
    timeout=600,
    kernel_name='python3',
    resources={'metadata': {'path': str(ROOT)}},
  ).execute()
  outputs = [
    o for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', [])
  ]
  text = ''.join(o.get('text', '') for o in outputs)
  assert smoke_run in text  # it loaded the run it was given
  assert 'validation bits/char' in text
  images = [o for o in outputs if 'image/png' in o.get('data', {})]
  assert len(images) == 2  # the denoising picture and the NFE plots
  shows = [c for c in nb.cells if 'plt.show()' in c.source]
  assert len(shows) == 2
  for cell in shows:  # Each figure in the cell that draws it.
    assert any('image/png' in o.get('data', {}) for o in cell.outputs)
  for spec in ('first_hitting', 'eb:gamma=2.0', 'confidence:num_steps=16'):
    assert spec in text
  assert '(validation text)' in text
  # Every table row ends with finite NFE, gen-ppl and entropy.
  rows = [
    line.split()[-3:]
    for line in text.splitlines()
    if line.split() and line.split()[0].startswith(('ancestral', 'remdm'))
  ]
  assert len(rows) == 6  # ancestral, ReMDM cap and loop at two step counts
  for nfe, ppl, ent in rows:
    assert float(nfe) >= 1 and 1 < float(ppl) < 1e6 and float(ent) > 0
