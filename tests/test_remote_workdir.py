"""Run records on an epath URI workdir (gs://), through a stand-in store.

The stand-in is fsspec's in-memory filesystem registered for the gs/gcs
protocols, which etils.epath uses for gs:// paths when TensorFlow is
absent: the same path API the records code calls on a real bucket.
"""

import json
import sys

import pytest

fsspec = pytest.importorskip('fsspec')
epath = pytest.importorskip('etils.epath')

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from ddlm_jax.evaluation import sample_run  # noqa: E402
from ddlm_jax.training import metrics, plots  # noqa: E402


class StandInGCS(MemoryFileSystem):
  protocol = ('gs', 'gcs')
  store = {}
  pseudo_dirs = ['']


@pytest.fixture
def bucket(monkeypatch):
  """gs://bucket/run backed by memory; emptied afterwards."""
  import etils.epath.gpath as gpath

  if gpath._is_tf_installed():  # epath would use tf.io.gfile instead.
    pytest.skip('TensorFlow is installed: epath reads gs:// through tf.io')
  registry = sys.modules['fsspec.registry']._registry
  for name in StandInGCS.protocol:
    monkeypatch.setitem(registry, name, StandInGCS)
  StandInGCS.store.clear()
  yield 'gs://bucket/run'
  StandInGCS.store.clear()


def test_metrics_and_json_records_go_to_the_uri(bucket):
  assert metrics.is_remote(bucket) and not metrics.is_remote('/tmp/x')
  assert metrics.join(bucket, 'a.json') == 'gs://bucket/run/a.json'
  writer = metrics.MetricsWriter(bucket)
  for step in (2, 4, 6):
    writer.write(step, 'train', {'loss': 1.0 / step})
  writer.write(6, 'final_validation', {'bits_per_token': 2.0})
  writer.close()
  got = metrics.read_metrics(bucket)
  assert [(r['step'], r['split']) for r in got] == [
    (2, 'train'),
    (4, 'train'),
    (6, 'train'),
    (6, 'final_validation'),
  ]
  again = metrics.MetricsWriter(bucket)  # A resumed run at step 4.
  again.drop_after(4)
  again.write(6, 'train', {'loss': 0.5})
  assert [r['step'] for r in metrics.read_metrics(bucket)] == [2, 4, 6]
  metrics.write_json(metrics.join(bucket, 'summary.json'), {'steps': 6})
  assert json.loads(epath.Path('gs://bucket/run/summary.json').read_text()) == {
    'steps': 6
  }
  assert 'gs://bucket/run/metrics.jsonl' in StandInGCS.store


def test_curves_and_samples_are_written_to_the_uri(bucket):
  writer = metrics.MetricsWriter(bucket)
  writer.write(2, 'train', {'nelbo_per_token': 3.0})
  writer.write(
    2, 'validation', {'bits_per_token': 4.0, 'bits_per_token_stderr': 0.1}
  )
  path = plots.plot_curves(bucket)
  assert path == 'gs://bucket/run/curves.png'
  assert epath.Path(path).read_bytes()[:4] == b'\x89PNG'
  first = sample_run.write_samples(bucket, ['a'], {'n': 1})
  second = sample_run.write_samples(bucket, ['b'], {'n': 2})
  assert first[0] == 'gs://bucket/run/samples.txt'
  assert second[0] == 'gs://bucket/run/samples_2.txt'
  assert epath.Path(first[0]).read_text() == '=== sample 0 ===\na\n\n'
