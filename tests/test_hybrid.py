"""Hybrid attention / SSM denoiser backbone (ddlm_jax.models.hybrid)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ddlm_jax.models import hybrid, ssm
from ddlm_jax.models.transformer import Block, TransformerConfig


def _cfg(pattern, *, causal=False, time=False, kind='pdssm'):
  base = TransformerConfig(
    vocab_size=6, input_vocab_size=7, width=16, depth=len(pattern),
    num_heads=2, causal=causal, time_conditioning=time, cond_dim=8,
  )  # fmt: skip
  return hybrid.HybridConfig(base, pattern, kind, state_size=8, num_dict=3)


_CHEAP_XLA = {
  'xla_backend_optimization_level': 0,
  'xla_llvm_disable_expensive_passes': True,
}
_jit = lambda f: jax.jit(f, compiler_options=_CHEAP_XLA)
_apply = _jit(lambda m, x, t: m(x, t))


def test_layers_follow_pattern_and_shapes():
  model = hybrid.HybridTransformer(_cfg('ASSA'), rngs=nnx.Rngs(0))
  kinds = [type(b) for b in model.blocks]
  assert kinds == [Block, hybrid.SSMLayer, hybrid.SSMLayer, Block]
  assert isinstance(model.blocks[1].mixer, ssm.BidirectionalMixer)
  x = jnp.array([[1, 2, 3, 6, 0, 5, 4, 1]], jnp.int32)
  both = _jit(lambda m, x: (m(x), m.logits(m.backbone(m.embed(x)))))
  logits, split = both(model, x)
  assert logits.shape == (1, 8, 6) and logits.dtype == jnp.float32
  np.testing.assert_allclose(split, logits, atol=1e-5)


@pytest.mark.parametrize('causal', [False, True])
def test_ssm_layers_are_bidirectional_unless_causal(causal):
  cfg = _cfg('SS', causal=causal, kind='complex_diag')
  model = hybrid.HybridTransformer(cfg, rngs=nnx.Rngs(1))
  # Non-zero head so that the logits depend on the hidden states.
  model.head.kernel[...] = jax.random.normal(jax.random.key(0), (16, 6))
  x = jnp.array([[1, 2, 3, 4, 5, 6]], jnp.int32)
  y = x.at[0, -1].set(1)
  first = lambda z: _apply(model, z, None)[0, 0]
  moved = not np.allclose(first(x), first(y), atol=1e-6)
  assert moved == (not causal)


@pytest.mark.slow
def test_time_conditioning_and_a_training_step_lowers_the_loss():
  cfg = _cfg('AS', time=True, kind='complex_diag')
  model = hybrid.HybridTransformer(cfg, rngs=nnx.Rngs(2))
  graphdef, params = nnx.split(model)
  x = jnp.array([[1, 2, 3, 4, 5, 0, 1, 2]] * 2, jnp.int32)
  t = jnp.array([0.2, 0.7])
  tx = optax.adam(1e-2)

  def loss(p):
    logits = nnx.merge(graphdef, p)(x, t)
    return optax.softmax_cross_entropy_with_integer_labels(logits, x).mean()

  @_jit
  def step(p, s):
    value, g = jax.value_and_grad(loss)(p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, value

  opt_state = tx.init(params)
  losses = []
  for _ in range(8):
    params, opt_state, value = step(params, opt_state)
    losses.append(float(value))
  assert np.isfinite(losses).all() and losses[-1] < 0.8 * losses[0], losses
  with pytest.raises(ValueError, match='pass t_B'):
    model(x)


def test_config_helpers_and_errors():
  base, extra = hybrid.split_model_keys(
    {'width': 16, 'depth': 2, 'backbone': 'hybrid', 'pattern': 'SA'}
  )
  assert base == {'width': 16, 'depth': 2}
  assert extra['pattern'] == 'SA' and extra['ssm_kind'] == 'pdssm'
  tcfg = TransformerConfig(6, 7, width=16, depth=2, num_heads=2)
  hcfg = hybrid.hybrid_config(tcfg, {'backbone': 'hybrid', 'pattern': 'SA'})
  assert hcfg.pattern == 'SA' and hcfg.base is tcfg
  with pytest.raises(ValueError, match='backbone'):
    hybrid.split_model_keys({'backbone': 'rnn'})
  with pytest.raises(ValueError, match='depth'):
    hybrid.HybridConfig(tcfg, 'ASA')
  with pytest.raises(ValueError, match="'A'"):
    hybrid.HybridConfig(tcfg, 'AX')
  with pytest.raises(ValueError, match='ssm_kind'):
    hybrid.HybridConfig(tcfg, 'AS', 'lstm')


@pytest.mark.slow
def test_hybrid_backbone_trains_end_to_end_on_the_quickstart_corpus(tmp_path):
  """The LM trainer builds, trains, evaluates and samples a hybrid denoiser."""
  from ddlm_jax.tasks import language_model as lm
  from experiments.configs import quickstart
  from experiments.configs.common import override

  c = override(
    quickstart.get_config('smoke'),
    {
      'mesh.shape': (1, 1, 1),
      'model.backbone': 'hybrid',
      'model.pattern': 'SA',
      'model.depth': 2,  # One layer of each mixer.
      'model.state_size': 8,
      'model.num_dict': 2,
      # The sequential scan compiles in about half the time of the
      # associative one; the two agree (tests/test_kernels_scan.py), and
      # this test is about the trainer, not the scan.
      'model.scan_impl': 'reference',
      'sample.num_samples': 1,
      # One evaluation and one checkpoint (at the last step) are enough for
      # what is checked; the smoke preset's 6 steps would make two.
      'train.num_steps': 3,
    },
  )
  summary = lm.train_and_evaluate(c, str(tmp_path))
  assert summary['steps'] == c.train.num_steps
  assert np.isfinite(summary['validation']['bits_per_token'])
  text = (tmp_path / 'samples.txt').read_text()
  assert text.strip(), 'no sample written'
  # The checkpoint really holds SSM mixers: its tree metadata names the
  # PD-SSM dictionary parameters (read as text: no model is rebuilt).
  meta = list(tmp_path.glob('checkpoints/*/state/_METADATA'))
  assert meta and 'dictionary' in meta[-1].read_text()
