"""Sample metrics: known values on hand-made sequences, the AR scorer, MAUVE,
FLOPs accounting, and sampling/scoring of saved runs (load_run)."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import Autoregressive
from ddlm_jax.evaluation import cost
from ddlm_jax.evaluation.likelihood import evaluate_likelihood
from ddlm_jax.evaluation.sample_metrics import (
  ARScorer,
  content_metrics,
  perplexity_summary,
  repetition_rate,
  unigram_entropy,
)
from ddlm_jax.models import Transformer, TransformerConfig


def test_unigram_entropy_known_values():
  assert unigram_entropy([5] * 40) == 0.0
  np.testing.assert_allclose(unigram_entropy([0, 1, 2, 3] * 5), math.log(4))
  np.testing.assert_allclose(
    unigram_entropy([0, 0, 0, 1]),
    -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)),
  )


def test_repetition_rate_known_values():
  assert repetition_rate([1, 2, 1, 2], 2) == pytest.approx(1 / 3)
  assert repetition_rate([1, 2, 3, 4, 5], 2) == 0.0
  assert repetition_rate([7] * 10, 3) == pytest.approx(1 - 1 / 8)
  assert repetition_rate([1, 2], 3) == 0.0
  out = content_metrics([[4] * 8, [0, 1, 2, 3, 4, 5, 6, 7]], ngrams=(2,))
  assert out['unigram_entropy_nats_per_sample'] == [0.0, math.log(8)]
  assert out['repetition_rate_2gram'] == pytest.approx((6 / 7) / 2)


def test_perplexity_summary_reports_both_aggregates():
  out = perplexity_summary([1.0, 4.0], [1, 2])
  assert out['gen_ppl_corpus'] == pytest.approx(math.exp(5 / 3))
  assert out['gen_ppl_sample_mean'] == pytest.approx((math.e + math.e**2) / 2)
  with pytest.raises(ValueError, match='at least one token'):
    perplexity_summary([1.0], [0])


def _tiny_ar(vocab=5, seed=0, scale=0.5):
  """A 1-layer causal Transformer; scale = 0 gives all-zero (uniform) params."""
  cfg = TransformerConfig(
    vocab_size=vocab, input_vocab_size=vocab + 1, width=16, depth=1,
    num_heads=2, causal=True,
  )  # fmt: skip
  # Shapes only, then one jitted draw: eager init compiles op by op (slow).
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract, nnx.Param)
  shapes = nnx.to_pure_dict(state)

  @jax.jit
  def draw(key):
    leaves, tree = jax.tree.flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(
      tree,
      [
        scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)
      ],  # fmt: skip
    )

  return graphdef, draw(jax.random.key(seed)), cfg


def test_scorer_gen_ppl_equals_the_models_eval_ppl():
  """A scorer on its own evaluation windows gives its eval perplexity."""
  vocab, length = 5, 12
  graphdef, params, _ = _tiny_ar(vocab)
  process = Autoregressive(vocab)
  rng = np.random.default_rng(0)
  text = rng.integers(0, vocab, size=6 * length).astype(np.int32)
  windows = text.reshape(6, length)
  ev = evaluate_likelihood(
    params, graphdef, process, [windows], key=jax.random.key(0)
  )
  scorer = ARScorer.from_params(
    graphdef, params, process, max_length=length, batch_size=6
  )
  # Scored as one long sample: cut into the same windows.
  long = scorer.gen_ppl([text])
  assert long['gen_ppl_num_tokens'] == text.size
  np.testing.assert_allclose(
    long['gen_ppl_corpus'], ev['perplexity_bound'], rtol=1e-5
  )
  per = scorer.gen_ppl(list(windows))
  np.testing.assert_allclose(
    per['gen_ppl_corpus'], ev['perplexity_bound'], rtol=1e-5
  )
  assert per['gen_ppl_sample_mean'] >= per['gen_ppl_corpus'] * (1 - 1e-6)
  feats = scorer.features(list(windows))
  assert feats.shape == (6, 16) and np.isfinite(feats).all()


def test_deterministic_bigram_scorer_has_closed_form_ppl():
  """Next token = previous + 1 (mod V): only the BOS step costs log V."""
  vocab, window = 6, 8

  def logits_fn(inp_BxL):
    nxt = jnp.where(inp_BxL == vocab, 0, (inp_BxL + 1) % vocab)
    # BOS predicts uniformly; other positions put all mass on `nxt`.
    onehot = jax.nn.one_hot(nxt, vocab) * 1e4
    return jnp.where((inp_BxL == vocab)[..., None], 0.0, onehot)

  scorer = ARScorer(logits_fn, bos_id=vocab, max_length=window, batch_size=3)
  sample = np.arange(20) % vocab  # 3 windows: 8 + 8 + 4 tokens
  out = scorer.gen_ppl([sample, sample[:5]])
  nll = math.log(vocab)
  np.testing.assert_allclose(out['gen_ppl_per_sample'][0],
                             math.exp(3 * nll / 20), rtol=1e-5)  # fmt: skip
  np.testing.assert_allclose(out['gen_ppl_per_sample'][1],
                             math.exp(nll / 5), rtol=1e-5)  # fmt: skip
  np.testing.assert_allclose(out['gen_ppl_corpus'],
                             math.exp(4 * nll / 25), rtol=1e-5)  # fmt: skip


def test_mean_pooled_features_of_a_one_hot_network():
  vocab = 4
  scorer = ARScorer(
    lambda x: None,
    hidden_fn=lambda inp: jax.nn.one_hot(inp, vocab + 1),
    bos_id=vocab,
    max_length=16,
  )
  feats = scorer.features([[0, 0, 1, 3], [2, 2]])
  np.testing.assert_allclose(feats[0], [0.5, 0.25, 0, 0.25, 0])
  np.testing.assert_allclose(feats[1], [0, 0, 1, 0, 0])


def test_mauve_separates_feature_clouds():
  pytest.importorskip('mauve')
  from ddlm_jax.evaluation.sample_metrics import mauve_score

  rng = np.random.default_rng(0)
  p = rng.normal(size=(60, 4))
  kw = dict(kmeans_num_redo=1, kmeans_max_iter=50)
  same = mauve_score(p, p, **kw)
  far = mauve_score(p, rng.normal(size=(60, 4)) + 6.0, **kw)
  assert same > 0.99 and far < 0.2


def test_transformer_flops_match_xla_cost_analysis():
  graphdef, params, cfg = _tiny_ar(vocab=11)
  model = nnx.merge(graphdef, params)
  batch, length = 2, 32
  ours = cost.transformer_flops(cfg, batch, length)
  xla = cost.xla_flops(lambda z, t: model(z, t), batch, length)
  assert 0.8 < ours / xla < 1.25, (ours, xla)
  assert cost.sampling_flops([3, 2], [10.0, 1.0]) == 32.0


@pytest.mark.slow
def test_load_run_samples_and_scores_with_an_ar_scorer(tmp_path, capsys):
  from ddlm_jax.evaluation.sample_run import sample_and_score
  from ddlm_jax.tasks.language_model import Run, load_run
  from ddlm_jax.training.checkpoint import Checkpointer
  from experiments.configs import quickstart

  text = tmp_path / 'text.txt'
  text.write_text('To be, or not to be, that is the question. ' * 40)
  c = quickstart.get_config('smoke')
  c.data.corpus = 'text_files'
  c.data.files.train = c.data.files.validation = str(text)
  c.data.seq_len, c.sample.num_samples = 16, 2
  c.model.depth, c.mesh.shape = 1, (1, 1, 1)
  workdir = str(tmp_path / 'mdlm')
  run = Run(c, workdir)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(c.to_dict(), f)
  writer = Checkpointer(os.path.join(workdir, 'checkpoints'))
  state = run.train_setup().state
  writer.save(1, state, {}, force=True)
  writer.close()
  with pytest.raises(ValueError, match='reader'):
    run.checkpointer.save(2, state, {}, force=True)
  with pytest.raises(FileNotFoundError, match='config.json'):
    load_run(str(tmp_path))
  run = load_run(workdir, {'sample.sampler': 'eb:gamma=0.5'})
  assert run.checkpointer.latest_step() == 1
  # An AR scorer with all-zero weights predicts uniformly: gen-ppl = V.
  vocab = run.process.vocab_size
  graphdef, params, _ = _tiny_ar(vocab, scale=0.0)
  scorer = ARScorer.from_params(
    graphdef, params, Autoregressive(vocab), max_length=16,
    tokenizer=run.data.tokenizer,
  )  # fmt: skip
  texts, stats = sample_and_score(run, scorer=scorer)
  assert len(texts) == 2 and stats['sampler'] == 'eb'
  assert 1 <= stats['nfe'] <= 16 and stats['flops_per_sample'] > 0
  np.testing.assert_allclose(stats['gen_ppl_corpus'], vocab, rtol=1e-4)
  np.testing.assert_allclose(stats['gen_ppl_sample_mean'], vocab, rtol=1e-4)
  assert 0 < stats['unigram_entropy_nats'] <= math.log(16)
  run.write_samples(texts, stats)
  saved = json.loads((tmp_path / 'mdlm' / 'sample_stats.json').read_text())
  assert saved['gen_ppl_corpus'] == stats['gen_ppl_corpus']
  # A request larger than sample.batch_size runs as several calls of one
  # compiled sampler, with a progress line per call.
  run.config.sample.num_samples, run.config.sample.batch_size = 5, 2
  texts, stats = sample_and_score(run, scorer=scorer)
  assert len(texts) == 5 and stats['num_samples'] == 5
  assert len(stats['nfe_calls']) == 3
  assert 'sampling: batch 3/3' in capsys.readouterr().out
