"""The lm-evaluation-harness backend on smoke runs trained here.

The end-to-end tests train the quickstart smoke run and its AR twin with
`python -m experiments.run` in temporary directories and evaluate them
through lm-eval's own evaluator on the local tasks of
tests/fixtures/lm_eval (JSONL read from disk, nothing downloaded).
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip('lm_eval', reason='lm-eval is the optional eval extra')

from ddlm_jax.evaluation import estimators as est  # noqa: E402
from ddlm_jax.interop import lm_eval_backend as be  # noqa: E402
from ddlm_jax.training.config import ConfigError  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = ROOT / 'tests' / 'fixtures' / 'lm_eval'


class Req:
  """The part of lm-eval's Instance the backend reads."""

  def __init__(self, *args):
    self.args = args


def test_registered_in_lm_evals_registry():
  from lm_eval.api.registry import get_model, model_registry

  assert get_model('ddlm_jax') is be.DdlmJaxLM
  assert 'hf' in model_registry  # The built-ins stay registered.


def test_cut_at_stops():
  assert be.cut_at_stops('abc\ndef', ['\n']) == 'abc'
  assert be.cut_at_stops('abc.def', ['x', '.', 'c']) == 'ab'
  assert be.cut_at_stops('abc', None) == 'abc'
  assert be.cut_at_stops('abc', 'b') == 'a'


def test_cache_round_trip(tmp_path):
  cache = be.ResultCache(str(tmp_path / 'c.sqlite'))
  key = be.ResultCache.key('m', {'seed': 0}, ['a', 'b'])
  assert cache.get(key) is None
  cache.put_many({key: [1.5, True]})
  again = be.ResultCache(str(tmp_path / 'c.sqlite'))
  assert again.get(key) == [1.5, True] and again.hits == 1
  assert key != be.ResultCache.key('m', {'seed': 1}, ['a', 'b'])


def test_model_args_win_over_command_line_defaults():
  class Probe(be.DdlmJaxLM):
    def __init__(self, **kwargs):
      self.kwargs = kwargs

  lm = Probe.create_from_arg_string(
    'workdir=run,batch_size=3', {'batch_size': 1, 'device': None}
  )
  assert lm.kwargs == {'workdir': 'run', 'batch_size': 3}
  lm = Probe.create_from_arg_string('workdir=run', {'batch_size': 2})
  assert lm.kwargs == {'workdir': 'run', 'batch_size': 2}
  lm = Probe.create_from_arg_obj(
    {'workdir': 'r', 'batch_size': 5}, {'batch_size': 1}
  )
  assert lm.kwargs == {'workdir': 'r', 'batch_size': 5}


def test_missing_workdir_refused():
  with pytest.raises(ConfigError, match='workdir='):
    be.DdlmJaxLM()


def _train(config: str, workdir: pathlib.Path) -> str:
  subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.run',
      f'--config=experiments/configs/{config}:smoke',
      f'--workdir={workdir}',
      '--config.sample.num_samples=0',
    ],
    cwd=ROOT,
    check=True,
    capture_output=True,
  )
  return str(workdir)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  base = tmp_path_factory.mktemp('lm_eval_runs')
  return {
    'mdlm': _train('quickstart.py', base / 'mdlm'),
    'ar': _train('ar_quickstart.py', base / 'ar'),
  }


def _exact_ar_loglikelihood(lm, context, continuation):
  """sum_j log p(c_j | context, c_<j), one network call per token, the row
  after the token filled with junk (a causal network must ignore it)."""
  from flax import nnx

  x_L, _, loss_L = lm._pair_row(context, continuation)
  apply = nnx.merge(lm.model.graphdef, lm.model.params)
  junk = np.random.default_rng(0).integers(0, lm.process.vocab_size, x_L.size)
  total = 0.0
  for pos in np.flatnonzero(loss_L):
    row = np.where(np.arange(x_L.size) <= pos, x_L, junk)[None]
    inputs = lm.process.shift_right(jnp.asarray(row, jnp.int32))
    logits = apply(inputs, jnp.zeros((1,), jnp.float32))[0, pos]
    total += float(jax.nn.log_softmax(logits.astype(jnp.float32))[x_L[pos]])
  return total


PAIRS = [
  ('To be, or not to be, that is the', ' question'),
  ('Good night, sweet', ' prince'),
  ('', 'KING: What say you?'),
]


@pytest.mark.slow
def test_ar_loglikelihood_is_the_exact_sum(runs):
  lm = be.DdlmJaxLM(workdir=runs['ar'], cache=False, batch_size=2)
  got = lm.loglikelihood([Req(*p) for p in PAIRS], disable_tqdm=True)
  for (ll, _), pair in zip(got, PAIRS):
    assert ll == pytest.approx(_exact_ar_loglikelihood(lm, *pair), abs=1e-5)
  assert lm.last_stderrs == [0.0] * len(PAIRS)


@pytest.mark.slow
def test_masked_conditional_estimate_matches_a_4096_sample_reference(runs):
  lm = be.DdlmJaxLM(workdir=runs['mdlm'], samples=16, cache=False)
  assert lm.estimator == 'counts'
  got = lm.loglikelihood_with_stderr(PAIRS[:2], disable_tqdm=True)
  for (ll, stderr, _), pair in zip(got, PAIRS[:2]):
    x_L, keep_L, loss_L = lm._pair_row(*pair)
    ref_S = est.bound_draws(
      lm.model.params,
      jax.random.key(123),
      x_L[None],
      loss_L[None],
      keep_L[None],
      graphdef=lm.model.graphdef,
      process=lm.process,
      samples=4096,
      estimator='iid',
    )
    ref, ref_err = est.mean_and_stderr(np.asarray(ref_S)[:, 0], 'iid')
    assert stderr > 0
    assert abs(-ll - ref) < 3 * math.hypot(stderr, ref_err), (ll, ref)


def _row_filling_text(lm, rows: int) -> str:
  """A text whose tokens fill whole rows exactly (no padding)."""
  bos, eos, _ = lm.model._framing()
  width = lm.seq_len - (bos is not None) - (eos is not None)
  base = 'KING: What say you, lords? Shall we go in to supper? ' * 8
  return base[: width * rows]


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['ar', 'mdlm'])
def test_rolling_equals_the_suites_bound(runs, kind):
  import ddlm_jax

  lm = be.DdlmJaxLM(workdir=runs[kind], samples=32, cache=False)
  text = _row_filling_text(lm, 3)
  rows, masks = lm.model._rows(np.asarray(lm._encode(text)))
  assert len(rows) == 3 and masks.all()  # Whole rows: no padding.
  ((ll, stderr),) = lm.loglikelihood_rolling_with_stderr([text], True)
  score = ddlm_jax.load(runs[kind]).score([text], samples=256)[0]
  suite = -score.nats_per_token * score.num_tokens
  if kind == 'ar':
    assert ll == pytest.approx(suite, abs=1e-5 * abs(suite))
  else:
    suite_err = score.nats_per_token_stderr * score.num_tokens
    assert abs(ll - suite) < 3 * math.hypot(stderr, suite_err), (ll, suite)
    assert stderr < suite_err  # 32 'counts' draws beat 256 i.i.d. ones.


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['ar', 'mdlm'])
def test_generate_until_keeps_prompts_and_stops(runs, kind):
  lm = be.DdlmJaxLM(workdir=runs[kind], cache=False, steps=8)
  prompts = ['To be, or', 'Good night, sweet prince, and']
  rows = np.full((2, lm.seq_len), -1, np.int32)
  ids = [lm._encode(p) for p in prompts]
  for i, p in enumerate(ids):
    rows[i, : len(p)] = p
  filled = lm._fill_rows(rows, 0)
  for i, p in enumerate(ids):
    assert list(filled[i, : len(p)]) == p  # Each row keeps its own prompt.
  assert (filled >= 0).all()
  reqs = [
    Req(prompts[0], {'until': ['e', 'a'], 'max_gen_toks': 12}),
    Req(prompts[1], {'until': ['\n'], 'max_gen_toks': 3}),
  ]
  out = lm.generate_until(reqs, disable_tqdm=True)
  assert 'e' not in out[0] and 'a' not in out[0]
  assert len(lm._encode(out[1])) <= 3


@pytest.mark.slow
def test_lm_eval_runs_the_local_tasks_end_to_end(runs, tmp_path, monkeypatch):
  import lm_eval
  from lm_eval.tasks import TaskManager

  monkeypatch.chdir(ROOT)  # The task files name their JSONL from the root.
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path / 'hf'))
  from experiments import claims as registry
  from experiments.benchmarks import lm_eval_runs

  tasks = ['ddlm_local_mc', 'ddlm_local_ppl', 'ddlm_local_gen']
  scores, tables = {}, {}
  for kind in ('mdlm', 'ar'):
    args = dict(workdir=runs[kind], samples=8, batch_size=4, steps=8)
    args['cache_path'] = str(tmp_path / f'{kind}.sqlite')
    for attempt in range(2):  # The second is answered from the cache.
      out = lm_eval.simple_evaluate(
        model='ddlm_jax',
        model_args=args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(TASKS)),
        log_samples=True,
      )
      res = out['results']
      mc, ppl = res['ddlm_local_mc'], res['ddlm_local_ppl']
      assert 0.0 <= mc['acc,none'] <= 1.0
      assert math.isfinite(ppl['word_perplexity,none'])
      assert ppl['word_perplexity,none'] > 1.0
      gens = [s['resps'][0][0] for s in out['samples']['ddlm_local_gen']]
      assert len(gens) == 6 and not any('\n' in g or '.' in g for g in gens)
      if attempt:
        assert scores[kind] == (mc['acc,none'], ppl['bits_per_byte,none'])
      scores[kind] = (mc['acc,none'], ppl['bits_per_byte,none'])
      tables[kind] = lm_eval_runs.numbers(res)
    # Every request of the second pass came from the cache.
    lm = be.DdlmJaxLM(**args)
    samples = out['samples']['ddlm_local_ppl']
    texts = [s['doc']['text'] for s in samples]
    lm.loglikelihood_rolling_with_stderr(texts, True)
    assert lm.cache.hits == len(texts)
    total_ll = sum(s['resps'][0][0] for s in samples)
    nbytes = sum(len(t.encode()) for t in texts)
    assert ppl['bits_per_byte,none'] == pytest.approx(
      -total_ll / nbytes / math.log(2), rel=1e-6
    )
  json.dumps(scores)  # Plain numbers (what the docs record).
  # What lm-eval-ar-below-mdlm reads from lm_eval_runs' JSON of both runs.
  got = registry.get('lm-eval-ar-below-mdlm').measurement.value(tables)
  assert got == {kind: scores[kind][1] for kind in ('mdlm', 'ar')}
  assert os.path.isdir(TASKS)


def test_lm_eval_runs_refuses_bad_arguments_before_loading(tmp_path, capsys):
  from experiments.benchmarks import lm_eval_runs

  for argv, text in (
    ([], 'at least one --run'),
    (['--run=ar'], 'NAME=WORKDIR'),
    (['--run=a=x', '--run=a=y'], 'named twice'),
    ([f'--run=ar={tmp_path}', '--samples=0'], '--samples=0'),
    ([f'--run=ar={tmp_path / "none"}'], 'not a run directory'),
  ):
    with pytest.raises(SystemExit) as err:
      lm_eval_runs.main(argv)
    assert err.value.code == 2
    out = capsys.readouterr().err
    assert text in out and out.count('\n') == 1, out


@pytest.mark.slow
def test_lm_eval_runs_writes_the_scores_the_claim_reads(
  runs, tmp_path, monkeypatch
):
  from experiments import claims as registry
  from experiments.benchmarks import lm_eval_runs

  monkeypatch.chdir(ROOT)
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path / 'hf'))
  path = tmp_path / 'scores.json'
  # The AR run alone (exact, one pass); the claim reads every named run.
  scores = lm_eval_runs.main([
    f'--run=ar={runs["ar"]}', '--tasks=ddlm_local_ppl', f'--json={path}',
  ])  # fmt: skip
  assert json.loads(path.read_text()) == scores
  claim = registry.get('lm-eval-ar-below-mdlm')
  got = claim.measurement.value(scores)
  assert got == {'ar': scores['ar']['ddlm_local_ppl']['bits_per_byte,none']}
  assert math.isfinite(got['ar']) and got['ar'] > 0
