"""Uniform-state diffusion: Duo (arXiv 2506.10892), Psi samplers (arXiv
2602.21185), LOO parameterisation (arXiv 2605.22765) and the scaling study
of masked vs uniform diffusion (arXiv 2602.15014), on the quickstart corpus.

Every arm is the quickstart's 0.88M transformer recipe at 1000 steps, so
the bound comparisons are at equal steps and equal training FLOPs.
"""

from experiments.claims.derived import extra_steps_of
from experiments.claims.spec import (
  AR_SCORER,
  ENTROPY_TOL,
  EQUAL_FLOPS,
  EQUAL_STEPS,
  MATCHED_ENTROPY,
  Arm,
  Claim,
  Derived,
  Sampling,
  ancestral_sampling,
  recipe,
)
from experiments.claims.verdict import Compare, Threshold

_REPRO = 'python -m experiments.reproduce'
_SWEEP = 'python -m experiments.sweep_samplers'
# The masked and uniform quickstart arms; the sampler claims draw from the
# same runs (same arm, same directory).
MDLM = Arm('mdlm', 'experiments/configs/mdlm_quickstart.py')
UDLM = Arm('udlm', 'experiments/configs/duo_quickstart.py')
_DUO = Arm('duo', 'experiments/configs/duo_quickstart.py:curriculum')
# A learning rate that does not decay with the run's length: the FLOPs-
# efficiency claim reads steps-to-a-bound off curves of different lengths.
_CONSTANT_LR = (('optim.final_lr_fraction', 1.0), ('train.eval_every', 100))
_CONSTANT_LR_SMOKE = (('optim.final_lr_fraction', 1.0),)
_PSI = 'psi:kappa=max_capped_eta,eta=0.01,greedy_tail=True'
_PSI_PARAMS = (
  ('kappa', 'max_capped_eta'),
  ('eta', 0.01),
  ('greedy_tail', True),
)


# Sampling claims cost their arms' runs (~10 min each, shared with the
# bound claims) and the scorer's, then 2 arms x 5 temperatures x 3 seeds:
# ~5 min at T = 4, ~35 min at T = 256 with 32 samples (loo-conversion's
# exact arm is psi-beats-ancestral's ancestral one: one sweep for both).
# The uniform model's samples are sharper than the masked one's at
# temperature 1 (4.25 against 4.42 bits at T = 4, the validation text has
# 4.40), so its sweep reaches further up.
_UNIFORM_TEMPERATURES = (0.9, 1.0, 1.15, 1.3, 1.5)


def _uniform(name: str, steps: int, *extra, num_samples: int = 32):
  """Duo's uniform ancestral sampler (greedy tail) on the UDLM runs."""
  params = (('num_steps', steps), ('greedy_tail', True), *extra)
  return Sampling(
    name,
    'udlm',
    'uniform_ancestral',
    params,
    temperatures=_UNIFORM_TEMPERATURES,
    num_samples=num_samples,
  )


def _psi(name: str, steps: int):
  """The Psi sampler (max-capped eta, greedy tail) on the UDLM runs."""
  return Sampling(
    name,
    'udlm',
    'psi',
    (('num_steps', steps), *_PSI_PARAMS),
    temperatures=_UNIFORM_TEMPERATURES,
  )


CLAIMS = (
  Claim(
    id='masked-beats-uniform-bound',
    family='uniform',
    paper='Duo',
    arxiv='2506.10892',
    table='Table 1',
    statement='Masked diffusion (MDLM) has a lower bound than uniform-state '
    'diffusion (UDLM) at equal training FLOPs.',
    paper_value='LM1B: MDLM <= 31.78 vs UDLM <= 36.71',
    metric='validation bound, bits/char',
    protocol=EQUAL_FLOPS,
    rule=Compare('mdlm', 'udlm', 'lower'),
    arms=(MDLM, UDLM),
    command=f'{_REPRO} masked-beats-uniform-bound',
    bound='full',
    cost_minutes=60,
  ),
  Claim(
    id='duo-curriculum-beats-udlm',
    family='uniform',
    paper='Duo',
    arxiv='2506.10892',
    table='curriculum ablation',
    statement="Duo's Gaussian curriculum lowers the uniform model's bound "
    'at equal steps.',
    paper_value='curriculum "doubles training speed"',
    metric='validation bound, bits/char',
    protocol=EQUAL_STEPS,
    rule=Compare('duo', 'udlm', 'lower'),
    arms=(_DUO, UDLM),
    command=f'{_REPRO} duo-curriculum-beats-udlm',
    bound='full',
    cost_minutes=60,
  ),
  Claim(
    id='duo-curriculum-vs-masked',
    family='uniform',
    paper='Duo',
    arxiv='2506.10892',
    table='not claimed by the paper (an earlier one-seed reading here)',
    statement='With the curriculum the uniform model passes the masked one '
    'at equal steps.',
    paper_value='-',
    metric='validation bound, bits/char',
    protocol=EQUAL_STEPS,
    rule=Compare('duo', 'mdlm', 'lower'),
    arms=(_DUO, MDLM),
    command=f'{_REPRO} duo-curriculum-vs-masked',
    bound='full',
    cost_minutes=60,
  ),
  Claim(
    id='uniform-wins-few-steps',
    family='uniform',
    paper='Duo',
    arxiv='2506.10892',
    table='few-step generation',
    statement='At T = 4 the uniform model samples better (lower gen-ppl) '
    'than the masked one.',
    paper_value='uniform ahead at few steps',
    metric='AR-twin gen-ppl, T = 4',
    protocol=MATCHED_ENTROPY,
    rule=Compare('udlm', 'mdlm', 'lower', entropy_tol=ENTROPY_TOL),
    arms=(MDLM, UDLM),
    samplings=(
      _uniform('udlm', 4, num_samples=64),
      ancestral_sampling('mdlm', 'mdlm', 4),
    ),
    scorer=AR_SCORER,
    command=f'{_REPRO} uniform-wins-few-steps',
    cost_minutes=75,
  ),
  Claim(
    id='psi-keeps-improving',
    family='uniform',
    paper='Psi samplers',
    arxiv='2602.21185',
    table='gen-ppl against steps',
    statement='On the uniform model, Psi keeps improving from T = 256 to 1024.',
    paper_value='Psi improves where ancestral plateaus',
    metric='AR-twin gen-ppl',
    protocol=MATCHED_ENTROPY,
    rule=Compare('psi_1024', 'psi_256', 'lower', entropy_tol=ENTROPY_TOL),
    arms=(UDLM,),
    samplings=(_psi('psi_1024', 1024), _psi('psi_256', 256)),
    scorer=AR_SCORER,
    command=f'{_REPRO} psi-keeps-improving',
    cost_minutes=60,
  ),
  Claim(
    id='psi-beats-ancestral',
    family='uniform',
    paper='Psi samplers',
    arxiv='2602.21185',
    table='gen-ppl against steps',
    statement='On the uniform model, Psi beats ancestral sampling at equal '
    'T = 256.',
    paper_value='Psi ahead of ancestral at equal steps',
    metric='AR-twin gen-ppl, T = 256',
    protocol=MATCHED_ENTROPY,
    rule=Compare('psi', 'ancestral', 'lower', entropy_tol=ENTROPY_TOL),
    arms=(UDLM,),
    samplings=(
      _psi('psi', 256),
      _uniform('ancestral', 256),
    ),
    scorer=AR_SCORER,
    command=f'{_REPRO} psi-beats-ancestral',
    cost_minutes=80,
  ),
  Claim(
    id='loo-conversion',
    family='uniform',
    paper='LOO parameterisation',
    arxiv='2605.22765',
    table='main results',
    statement='The exact LOO -> denoiser conversion samples better than '
    'reading the LOO as the denoiser (plug-in tail), T = 256.',
    paper_value='LOO consistently improves UDM generation',
    metric='AR-twin gen-ppl, T = 256',
    protocol=MATCHED_ENTROPY,
    rule=Compare('exact', 'plugin', 'lower', entropy_tol=ENTROPY_TOL),
    arms=(UDLM,),
    samplings=(
      _uniform('exact', 256),
      _uniform('plugin', 256, ('tail', 'plugin')),
    ),
    scorer=AR_SCORER,
    command=f'{_REPRO} loo-conversion',
    cost_minutes=80,
  ),
  Claim(
    id='simple-ce-beats-nelbo',
    family='uniform',
    paper='Scaling beyond masked diffusion',
    arxiv='2602.15014',
    table='simple cross-entropy ablation',
    statement='Training MDLM on the unweighted cross-entropy gives a lower '
    'NELBO than NELBO-weighted training at equal steps.',
    paper_value='~12% more FLOPs-efficient (50M-1.7B)',
    metric='validation bound, bits/char',
    protocol=EQUAL_STEPS,
    rule=Compare('simple_ce', 'nelbo', 'lower'),
    arms=(
      Arm('simple_ce', 'experiments/configs/mdlm_ce.py'),
      Arm('nelbo', 'experiments/configs/mdlm_quickstart.py'),
    ),
    command=f'{_REPRO} simple-ce-beats-nelbo',
    bound='full',
    cost_minutes=60,
  ),
  Claim(
    id='simple-ce-flops-efficiency',
    family='uniform',
    paper='Scaling beyond masked diffusion',
    arxiv='2602.15014',
    table='simple cross-entropy ablation',
    statement='Simple CE is >= 12% more FLOPs-efficient than NELBO '
    'weighting: the NELBO run needs >= 12% more steps to reach the bound '
    'simple CE reaches in 1000.',
    paper_value='~12%',
    metric='% more steps NELBO weighting needs to reach the simple-CE '
    'bound at step 1000 (constant LR, validation every 100 steps)',
    protocol=EQUAL_FLOPS,
    rule=Threshold('extra_steps', 12.0, '>='),
    arms=(
      Arm(
        'simple_ce',
        'experiments/configs/mdlm_ce.py',
        _CONSTANT_LR,
        smoke_overrides=_CONSTANT_LR_SMOKE,
      ),
      Arm(
        'nelbo',
        'experiments/configs/mdlm_quickstart.py',
        (*_CONSTANT_LR, ('train.num_steps', 2000)),
        smoke_overrides=(*_CONSTANT_LR_SMOKE, ('train.num_steps', 30)),
      ),
    ),
    derived=Derived(
      'extra_steps',
      extra_steps_of('simple_ce', 'nelbo'),
      'Both arms train at a constant learning rate after warm-up (no '
      "cosine decay), so each curve's first 1000 steps are those of a "
      '1000-step run; the NELBO arm trains 2000 steps, and the step at '
      'which its validation bound first reaches the simple-CE bound at '
      'step 1000 is interpolated between evaluations 100 steps apart.',
    ),
    command=f'{_REPRO} simple-ce-flops-efficiency',
    bound='full',
    # Three 1000-step and three 2000-step runs with validation every 100
    # steps: 57 min from nothing on 2 cores (2026-12-06).
    cost_minutes=60,
  ),
  recipe(
    'udlm-lm1b',
    'Duo (UDLM baseline)',
    '2506.10892',
    'Table 1',
    'duo_lm1b.py:udlm',
    'LM1B perplexity <= 36.71',
    36.71,
    'test perplexity bound',
    bound='as published',
  ),
)
