"""Zero-shot perplexity bounds of a trained run (the MDLM/SEDD suite).

  python -m experiments.zero_shot --workdir=RUN --datasets=ptb,wikitext2

Restores RUN (workdir/config.json, tokenizer/ and the newest checkpoint),
scores each dataset (ddlm_jax.evaluation.zero_shot) and prints a table of
nats/token and perplexity bounds; the full results go to
RUN/zero_shot.json. Datasets: ptb, wikitext2, wikitext103, lm1b, lambada,
ag_news, pubmed, arxiv (default: MDLM Table 3's seven). Local copies are
read from --data_dir/<name> (datasets.save_to_disk folders), else from the
HF cache; lm1b from TFDS (--tfds_data_dir).
"""

from absl import app, flags, logging

from ddlm_jax.data.zero_shot import SUITE, ZERO_SHOT_DATASETS
from ddlm_jax.evaluation import zero_shot
from ddlm_jax.parallel import initialize_distributed
from ddlm_jax.tasks import language_model as lm

_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.')
_DATASETS = flags.DEFINE_list(
  'datasets',
  list(SUITE),
  f'Comma-separated names from {sorted(ZERO_SHOT_DATASETS)}.',
)
_DATA_DIR = flags.DEFINE_string(
  'data_dir', '', 'Folder of save_to_disk copies, one sub-folder per name.'
)
_TFDS_DATA_DIR = flags.DEFINE_string('tfds_data_dir', '', 'TFDS data_dir.')
_SPLIT = flags.DEFINE_string('split', '', "Override each set's split.")
_BATCH = flags.DEFINE_integer('batch_size', 0, '0: config.eval.batch_size.')
_MAX_BATCHES = flags.DEFINE_integer('max_batches', 0, '0: every row.')
_MAX_DOCS = flags.DEFINE_integer('max_documents', 0, '0: every document.')
_TIME_SAMPLES = flags.DEFINE_integer(
  'time_samples', 0, '0: config.eval.final_time_samples.'
)
_SEED = flags.DEFINE_integer('seed', 0, 'Evaluation seed.')
_MESH = flags.DEFINE_list(
  'mesh_shape', [], 'Override config.mesh.shape, e.g. 1,1,1.'
)
flags.mark_flags_as_required(['workdir'])


def main(argv):
  del argv
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  initialize_distributed()
  results = lm.evaluate_zero_shot(
    _WORKDIR.value,
    _DATASETS.value,
    mesh_shape=tuple(int(x) for x in _MESH.value) or None,
    data_dir=_DATA_DIR.value,
    tfds_data_dir=_TFDS_DATA_DIR.value,
    split=_SPLIT.value,
    batch_size=_BATCH.value,
    max_batches=_MAX_BATCHES.value,
    max_documents=_MAX_DOCS.value,
    time_samples=_TIME_SAMPLES.value,
    seed=_SEED.value,
  )
  print(zero_shot.format_table(results), flush=True)


if __name__ == '__main__':
  app.run(main)
