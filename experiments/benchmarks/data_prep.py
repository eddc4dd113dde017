"""Data preparation at scale: the OWT and LM1B token caches, measured.

  python -m experiments.benchmarks.data_prep --out=/tmp/data_prep \\
    --num_proc=1,8 --record=experiments/benchmarks/records

Generates a synthetic corpus with the shape of the real ones and runs the
suite's own preparation code on it, then extrapolates to the real corpora:

* OpenWebText-like: ``--owt_docs`` (default 200,000) documents whose
  lengths are lognormal in words (mean ``--owt_mean_chars`` 5,000
  characters, sigma 0.9: OWT's 8,013,769 documents hold about 38 GB of
  text, a mean near 4.7k characters with a long tail), words drawn from a
  Zipf-distributed lexicon of pseudo-words, written as Parquet shards in
  the Hub's layout (``plain_text/train/0000.parquet`` ...). Prepared by
  ``openwebtext_source(...).prepare()``: Parquet read through ``datasets``,
  byte-level BPE (GPT-2-style, trained here on the synthetic text), the
  MDLM split, the uint16 token caches.
* LM1B-like: ``--lm1b_sentences`` (default 1,000,000) sentences of
  lognormal length (mean 27 words, sigma 0.5: LM1B has 30.3M sentences
  and 0.8B words), tokenized-style (``word , word .``) in the statmt
  archive's layout. Prepared in two phases, each through the suite's code:
  ``build_lm1b`` (the TFDS builder writing ArrayRecord) and
  ``lm1b_source(...).prepare()`` with ``packing='packed'`` and
  ``detokenize=True`` (MDLM's detokenizer, then a WordPiece tokenizer
  trained here, BERT-style). The padded variant (the paper setting)
  tokenizes on the fly and has no preparation.

Each phase runs in a fresh process that reports its own wall time and
peak resident set (``ru_maxrss`` of itself and of its worker processes),
once per ``--num_proc`` value (``data.prep_processes``: worker processes
tokenizing blocks of documents; the Rust tokenizer also uses threads in
each). The record (JSON and a markdown table) holds documents/s, tokens/s,
characters/s, peak memory, the process and core counts, and the hours the
real corpora would take at the measured rate (documents scale linearly:
the preparation streams block by block, so its memory does not grow with
the corpus, apart from the page cache of the memory-mapped Arrow files).

Timings mean something only on an idle machine: run it alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

OWT_REAL_DOCS = 8_013_769
LM1B_REAL_SENTENCES = 30_301_028 + 306_688  # train + test.
OWT_VALIDATION_FRACTION = 100_000 / OWT_REAL_DOCS  # MDLM's held-out share.
LM1B_TEST_FRACTION = 306_688 / LM1B_REAL_SENTENCES
ARCHIVE_TOP = '1-billion-word-language-modeling-benchmark-r13output'
PHASES = ('owt', 'lm1b_build', 'lm1b')
CACHE_PREFIX = {'owt': 'openwebtext-', 'lm1b': 'lm1b-'}
DOCS_PER_SHARD = 50_000
SENTENCES_PER_FILE = 300_000
# Synthetic text: a lexicon of pseudo-words built from syllables, ranked by
# a Zipf law (s = 1.05), with punctuation as frequent tokens.
LEXICON_SIZE = 60_000
_SYLLABLES = (
  'ba be bi bo bu ca ce co da de di do fa fe fi ga go ha he hi ho ja ke ki '
  'la le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po ra re ri ro ru '
  'sa se si so su ta te ti to tu va ve vi wa we wi ya yo za ze an en in on '
  'un ar er ir or st th sh ch tr pr gr str ing ed es ly al ic ous ment tion'
).split()
_PUNCT = ('.', ',', "'s", '"', '(', ')', ':', ';', '?', '!', '-')


# ---------------------------------------------------------------- corpus --


def lexicon(seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(words, probabilities): pseudo-words and punctuation, Zipf-ranked."""
  rng = np.random.default_rng([seed, 1])
  sizes = np.clip(rng.poisson(1.6, LEXICON_SIZE) + 1, 1, 6)
  syl = np.asarray(_SYLLABLES, dtype=object)
  words = {
    ''.join(syl[rng.integers(0, len(syl), n)])
    for n in np.sort(sizes)  # Short words first: they get the top ranks.
  }
  ranked = sorted(words, key=len)
  # Punctuation among the most frequent tokens, as in English text.
  ranked = ranked[:3] + list(_PUNCT) + ranked[3:]
  ranks = np.arange(1, len(ranked) + 1, dtype=np.float64)
  p = ranks**-1.05
  return np.asarray(ranked, dtype=object), p / p.sum()


def lognormal_lengths(rng, n: int, mean: float, sigma: float, low: int = 1):
  """n integer lengths, lognormal with the given mean (not median)."""
  mu = np.log(mean) - sigma**2 / 2
  return np.maximum(low, np.rint(rng.lognormal(mu, sigma, n))).astype(int)


def texts(rng, words, p, lengths) -> list[str]:
  """One text per length: that many words drawn from the lexicon."""
  idx = rng.choice(len(words), size=int(lengths.sum()), p=p)
  drawn = words[idx]
  out, start = [], 0
  for n in lengths:
    out.append(' '.join(drawn[start : start + n]))
    start += n
  return out


def mean_word_chars(words, p) -> float:
  """Expected characters per word, the separating space included."""
  return float(np.sum(p * np.asarray([len(w) for w in words]))) + 1.0


def write_owt(folder: str, num_docs: int, mean_chars: float, seed: int):
  """OWT-like Parquet shards; returns (documents, characters)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  rng = np.random.default_rng([seed, 2])
  words, p = lexicon(seed)
  mean_words = mean_chars / mean_word_chars(words, p)
  lengths = lognormal_lengths(rng, num_docs, mean_words, 0.9, low=5)
  target = os.path.join(folder, 'plain_text', 'train')
  os.makedirs(target, exist_ok=True)
  chars = 0
  for shard, start in enumerate(range(0, num_docs, DOCS_PER_SHARD)):
    docs = texts(rng, words, p, lengths[start : start + DOCS_PER_SHARD])
    chars += sum(len(d) for d in docs)
    table = pa.table({'text': docs})
    pq.write_table(table, os.path.join(target, f'{shard:04d}.parquet'))
  return num_docs, chars


def write_lm1b(folder: str, num_sentences: int, seed: int):
  """LM1B-like statmt tree (train and held-out); returns (sentences, chars)."""
  rng = np.random.default_rng([seed, 3])
  words, p = lexicon(seed)
  lengths = lognormal_lengths(rng, num_sentences, 27.0, 0.5, low=3)
  n_test = max(1, int(round(LM1B_TEST_FRACTION * num_sentences)))
  top = os.path.join(folder, ARCHIVE_TOP)
  parts = {
    'train': (
      os.path.join(top, 'training-monolingual.tokenized.shuffled'),
      'news.en-{:05d}-of-00100',
      lengths[n_test:],
    ),
    'test': (
      os.path.join(top, 'heldout-monolingual.tokenized.shuffled'),
      'news.en.heldout-{:05d}-of-00050',
      lengths[:n_test],
    ),
  }
  chars = 0
  for where, pattern, lens in parts.values():
    os.makedirs(where, exist_ok=True)
    for i, start in enumerate(range(0, len(lens), SENTENCES_PER_FILE)):
      lines = texts(rng, words, p, lens[start : start + SENTENCES_PER_FILE])
      chars += sum(len(s) for s in lines)
      path = os.path.join(where, pattern.format(i + 1))
      with open(path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')
  return num_sentences, chars


def generate(out: str, owt_docs: int, lm1b_sentences: int, mean_chars, seed):
  """Writes both corpora under out/; returns their sizes."""
  t0 = time.perf_counter()
  owt = write_owt(os.path.join(out, 'owt'), owt_docs, mean_chars, seed)
  lm = write_lm1b(os.path.join(out, 'lm1b_raw'), lm1b_sentences, seed)
  return {
    'owt': {'documents': owt[0], 'characters': owt[1]},
    'lm1b': {'documents': lm[0], 'characters': lm[1]},
    'seconds': time.perf_counter() - t0,
  }


# ------------------------------------------------------------ tokenizers --


def build_tokenizers(out: str, vocab: int, seed: int, sample_docs: int):
  """GPT-2-like byte BPE (OWT) and BERT-like WordPiece (LM1B), trained on
  samples of the synthetic corpora and saved under out/tokenizers/."""
  from ddlm_jax.data import parquet
  from ddlm_jax.data.pretrained import build_test_tokenizer

  owt = parquet.records_from_folder(os.path.join(out, 'owt'))
  sample = owt[: min(len(owt), sample_docs)]['text']
  bpe = build_test_tokenizer('test:bytebpe', sample, vocab)
  rng = np.random.default_rng([seed, 4])
  words, p = lexicon(seed)
  lengths = lognormal_lengths(rng, 20 * sample_docs, 27.0, 0.5, low=3)
  wordpiece = build_test_tokenizer(
    'test:wordpiece', texts(rng, words, p, lengths), min(vocab, 30_522)
  )
  paths = {}
  for name, tok in (('owt', bpe), ('lm1b', wordpiece)):
    paths[name] = str(tok.save(os.path.join(out, 'tokenizers', name)))
  return paths


# ---------------------------------------------------------------- phases --


def _data_config(corpus: str, **values):
  from ddlm_jax.data.settings import DataConfig
  from experiments.configs import mdlm_lm1b, mdlm_owt

  module = mdlm_owt if corpus == 'openwebtext' else mdlm_lm1b
  cfg = module.get_config().data
  for key, value in values.items():
    cfg[key] = value
  return DataConfig.from_dict(cfg)


def _status_kib(pid: int | str, field: str) -> int:
  """A /proc/PID/status field in KiB (0 if the process is gone)."""
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1])
  except (OSError, ValueError):
    pass
  return 0


def _tree(root: int) -> list[int]:
  """root and its descendants, from /proc/*/stat."""
  parents = {}
  for name in os.listdir('/proc'):
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/stat') as f:
        stat = f.read()
    except OSError:
      continue
    parents[int(name)] = int(stat.rsplit(')', 1)[1].split()[1])
  found, frontier = [root], [root]
  while frontier:
    frontier = [p for p, pp in parents.items() if pp in frontier]
    found += frontier
  return found


class TreeMemory:
  """Peak summed resident set of a process and its descendants, sampled.

  ``ru_maxrss`` cannot serve here: Linux carries a parent's high-water
  mark into a forked and exec'd child, so every phase would report at
  least the generator's memory. The sum of VmRSS over the tree counts
  pages shared between workers once per worker (an upper bound).
  """

  def __init__(self, pid: int, every_s: float = 0.2):
    import threading

    self.pid, self.every_s = pid, every_s
    self.peak_kib, self.peak_processes = 0, 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.is_set():
      pids = _tree(self.pid)
      total = sum(_status_kib(p, 'VmRSS') for p in pids)
      self.peak_kib = max(self.peak_kib, total)
      self.peak_processes = max(self.peak_processes, len(pids))
      self._stop.wait(self.every_s)

  def stop(self) -> dict:
    self._stop.set()
    self._thread.join()
    return {
      'tree_peak_mib': self.peak_kib / 1024,
      'tree_peak_processes': self.peak_processes,
    }


def run_phase(phase: str, out: str, num_proc: int) -> dict:
  """One preparation phase through the suite's code; its measurements."""
  from ddlm_jax.data import lm1b, openwebtext
  from ddlm_jax.data.tokenizers import load_tokenizer

  cache = os.path.join(out, f'cache_p{num_proc}')
  tfds_dir = os.path.join(out, 'tfds')
  t0 = time.perf_counter()
  if phase == 'owt':
    folder = os.path.join(out, 'owt')
    n_docs = json.load(open(os.path.join(out, 'corpus.json')))['owt'][
      'documents'
    ]
    cfg = _data_config(
      'openwebtext',
      data_dir=folder,
      cache_dir=cache,
      prep_processes=num_proc,
      owt_validation_docs=max(1, round(OWT_VALIDATION_FRACTION * n_docs)),
    )
    tok = load_tokenizer(os.path.join(out, 'tokenizers', 'owt'))
    source = openwebtext.openwebtext_source(cfg, tok)
    source.prepare()
    documents = n_docs
    tokens = sum(
      int(source.split(s).tokens.shape[0]) for s in source.split_names
    )
  elif phase == 'lm1b_build':
    lm1b.build_lm1b(tfds_dir, os.path.join(out, 'lm1b_raw'))
    documents = sum(
      len(lm1b.lm1b_documents(s, tfds_dir)) for s in ('train', 'test')
    )
    tokens = 0
  elif phase == 'lm1b':
    cfg = _data_config(
      'lm1b',
      data_dir=tfds_dir,
      cache_dir=cache,
      packing='packed',
      detokenize=True,
      prep_processes=num_proc,
    )
    tok = load_tokenizer(os.path.join(out, 'tokenizers', 'lm1b'))
    source = lm1b.lm1b_source(cfg, tok)
    train, test = source.split('train'), source.split('test')
    documents = sum(
      len(lm1b.lm1b_documents(s, tfds_dir)) for s in ('train', 'test')
    )
    tokens = int(train.tokens.shape[0]) + int(test.tokens.shape[0])
  else:
    raise ValueError(f'phase {phase!r}; choose one of {PHASES}.')
  seconds = time.perf_counter() - t0
  return {
    'phase': phase,
    'num_proc': num_proc,
    'seconds': seconds,
    'documents': documents,
    'tokens': tokens,
    'documents_per_s': documents / seconds,
    'tokens_per_s': tokens / seconds,
    # The phase process's own high-water mark (VmHWM starts afresh at
    # exec, unlike ru_maxrss).
    'peak_rss': {'main_mib': _status_kib('self', 'VmHWM') / 1024},
    'cache_files': _cache_files(cache, CACHE_PREFIX.get(phase)),
  }


def _cache_files(cache: str, prefix: str | None) -> dict[str, int]:
  """A phase's token cache files and their sizes (the same for every
  num_proc)."""
  if prefix is None or not os.path.isdir(cache):
    return {}
  return {
    name: os.path.getsize(os.path.join(cache, name))
    for name in sorted(os.listdir(cache))
    if name.startswith(prefix) and name.endswith('.bin')
  }


def phase_in_subprocess(phase: str, out: str, num_proc: int) -> dict:
  """run_phase in a fresh interpreter, so its peak memory is its own."""
  env = dict(os.environ)
  env.setdefault('HF_DATASETS_CACHE', os.path.join(out, 'hf_datasets'))
  env['HF_HUB_OFFLINE'] = env['HF_DATASETS_OFFLINE'] = '1'
  cmd = [
    sys.executable,
    '-m',
    'experiments.benchmarks.data_prep',
    f'--out={out}',
    f'--phase={phase}',
    f'--num_proc={num_proc}',
  ]
  child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
  memory = TreeMemory(child.pid)
  stdout, _ = child.communicate()
  tree = memory.stop()
  if child.returncode:
    raise RuntimeError(f'phase {phase} (num_proc={num_proc}) failed.')
  row = json.loads(stdout.strip().splitlines()[-1])
  row['peak_rss'].update(tree)
  return row


# ---------------------------------------------------------------- record --


def extrapolate(row: dict, real_docs: int) -> dict:
  """The real corpus's time at the measured documents/s (linear)."""
  hours = real_docs / row['documents_per_s'] / 3600
  tokens = row['tokens'] / max(row['documents'], 1) * real_docs
  return {'real_documents': real_docs, 'hours': hours, 'tokens': tokens}


def markdown(record: dict) -> str:
  m = record['machine']
  lines = [
    f'# Data preparation, {record["date"]} (commit {record["commit"]})',
    '',
    f'Machine: {m["cpu_count"]} cores, {m["platform"]}, Python '
    f'{m["python"]}; synthetic corpus of {record["corpus"]["owt"]["documents"]}'
    f' OWT-like documents and {record["corpus"]["lm1b"]["documents"]} '
    'LM1B-like sentences (experiments/benchmarks/data_prep.py).',
    '',
    '| phase | processes | docs/s | tokens/s | peak RSS MiB (main; all '
    'processes) | real corpus | extrapolated hours |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in record['phases']:
    ex = row['extrapolated']
    rss = row['peak_rss']
    lines.append(
      f'| {row["phase"]} | {row["num_proc"]} | '
      f'{row["documents_per_s"]:,.0f} | {row["tokens_per_s"]:,.0f} | '
      f'{rss["main_mib"]:,.0f}; {rss.get("tree_peak_mib", 0):,.0f} | '
      f'{ex["real_documents"]:,} | {ex["hours"]:.2f} |'
    )
  return '\n'.join(lines) + '\n'


def _commit() -> str:
  """The checkout's commit (short hash), '' outside a git checkout."""
  try:
    return subprocess.run(
      ['git', 'rev-parse', '--short', 'HEAD'],
      cwd=os.path.dirname(os.path.abspath(__file__)),
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return ''


def parse_num_proc(text: str) -> list[int]:
  try:
    values = [int(v) for v in str(text).split(',') if v.strip()]
  except ValueError:
    values = []
  if not values or min(values) < 1:
    raise SystemExit(
      f'--num_proc={text!r}: give process counts >= 1, comma-separated '
      '(e.g. --num_proc=1,8).'
    )
  return values


def main(argv=None) -> dict | None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='', help='Work folder (default tmp).')
  parser.add_argument('--owt_docs', type=int, default=200_000)
  parser.add_argument('--owt_mean_chars', type=float, default=5_000.0)
  parser.add_argument('--lm1b_sentences', type=int, default=1_000_000)
  parser.add_argument('--num_proc', default='1', help='e.g. 1,8')
  parser.add_argument('--tokenizer_vocab', type=int, default=32_768)
  parser.add_argument('--tokenizer_docs', type=int, default=5_000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--record', default='', help='Folder for the record.')
  parser.add_argument('--in_process', action='store_true', help='(tests)')
  parser.add_argument('--phase', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  procs = parse_num_proc(args.num_proc)
  for name in ('owt_docs', 'lm1b_sentences', 'tokenizer_vocab'):
    if getattr(args, name) < 100:
      raise SystemExit(f'--{name}={getattr(args, name)}: use at least 100.')
  if args.phase:  # A child of phase_in_subprocess.
    print(json.dumps(run_phase(args.phase, args.out, procs[0])), flush=True)
    return None
  out = args.out or tempfile.mkdtemp(prefix='data_prep_')
  if os.path.exists(os.path.join(out, 'corpus.json')):
    raise SystemExit(f'--out={out} holds an earlier run; give a new folder.')
  os.makedirs(out, exist_ok=True)
  os.environ.setdefault('HF_DATASETS_CACHE', os.path.join(out, 'hf_datasets'))
  print(f'Generating the synthetic corpora in {out} ...', flush=True)
  corpus = generate(
    out, args.owt_docs, args.lm1b_sentences, args.owt_mean_chars, args.seed
  )
  with open(os.path.join(out, 'corpus.json'), 'w') as f:
    json.dump(corpus, f)
  print('Training the tokenizers ...', flush=True)
  tokenizers = build_tokenizers(
    out, args.tokenizer_vocab, args.seed, args.tokenizer_docs
  )
  rows = []
  for phase in PHASES:
    for n in [1] if phase == 'lm1b_build' else procs:
      print(f'Phase {phase}, {n} process(es) ...', flush=True)
      run = run_phase if args.in_process else phase_in_subprocess
      row = run(phase, out, n)
      real = OWT_REAL_DOCS if phase == 'owt' else LM1B_REAL_SENTENCES
      row['extrapolated'] = extrapolate(row, real)
      row['characters_per_s'] = (
        corpus['owt' if phase == 'owt' else 'lm1b']['characters']
        / row['seconds']
      )
      rows.append(row)
      print(
        f'  {row["documents_per_s"]:,.0f} docs/s, '
        f'{row["tokens_per_s"]:,.0f} tokens/s, peak '
        f'{row["peak_rss"]["main_mib"]:,.0f} MiB; the real corpus: '
        f'{row["extrapolated"]["hours"]:.2f} h',
        flush=True,
      )
  record = {
    'date': datetime.date.today().isoformat(),
    'commit': _commit(),
    'machine': {
      'cpu_count': os.cpu_count(),
      'platform': platform.platform(),
      'processor': platform.processor(),
      'python': platform.python_version(),
    },
    'args': vars(args),
    'corpus': corpus,
    'tokenizers': tokenizers,
    'phases': rows,
  }
  if args.record:
    os.makedirs(args.record, exist_ok=True)
    stem = os.path.join(args.record, f'data_prep_{record["date"]}')
    with open(stem + '.json', 'w') as f:
      json.dump(record, f, indent=1)
    with open(stem + '.md', 'w') as f:
      f.write(markdown(record))
    print(f'Record: {stem}.json, {stem}.md')
  return record


if __name__ == '__main__':
  main()
