"""MDLM (arXiv 2406.07524) and MD4 (arXiv 2406.04329): bounds, caching, AR gap.

The paper-scale recipes (text8, LM1B, OpenWebText) are registered with the
papers' numbers and no record: they have not been run here.
"""

from experiments.claims.derived import ar_gaps_of
from experiments.claims.spec import (
  EQUAL_STEPS,
  Arm,
  Claim,
  Derived,
  exact_claim,
  recipe,
)
from experiments.claims.verdict import Compare

_MDLM = 'MDLM'
_MD4 = 'MD4'
_REPRO = 'python -m experiments.reproduce'


def _exact(id_, paper, arxiv, table, statement, paper_value, test):
  return exact_claim(
    id_,
    family='bounds',
    paper=paper,
    arxiv=arxiv,
    table=table,
    statement=statement,
    paper_value=paper_value,
    test=test,
  )


CLAIMS = (
  _exact(
    'full-bound-is-an-upper-bound',
    _MD4,
    '2406.04329',
    'the ELBO',
    'The full bound (prior and reconstruction terms, t_min) is an upper '
    'bound on -log p(x), checked by exact enumeration.',
    'NELBO >= -log p(x)',
    'tests/test_full_bound.py::'
    'test_full_bound_equals_its_closed_form_and_bounds_the_model_nll',
  ),
  _exact(
    'mdlm-bound-convention',
    _MDLM,
    '2406.07524',
    'Table 1 convention',
    "process.bound='mdlm' gives the published convention (no prior term, "
    'reconstruction at alpha(0)).',
    'published MDLM / MD4 numbers',
    'tests/test_full_bound.py::'
    'test_mdlm_option_reproduces_the_previous_numbers',
  ),
  _exact(
    'caching-keeps-samples',
    _MDLM,
    '2406.07524',
    'efficient sampling (caching)',
    'Per-row caching of a time-free denoiser changes no sampled token and '
    'bounds the calls by min(T, L).',
    'NFE <= L with identical samples',
    'tests/test_sampling.py::test_cache_does_not_change_samples',
  ),
  Claim(
    id='ar-below-mdlm',
    family='quickstart',
    paper=_MDLM,
    arxiv='2406.07524',
    table='Table 2 (OWT)',
    statement=(
      "The AR twin's exact NLL is below the masked-diffusion bound at "
      'equal width, depth and steps.'
    ),
    paper_value='OWT: AR ~17.5 ppl vs MDLM <= 23.21',
    metric='validation bits/char (AR exact, MDLM bound)',
    protocol=EQUAL_STEPS,
    rule=Compare('ar', 'mdlm', 'lower'),
    arms=(
      Arm('ar', 'experiments/configs/ar_quickstart.py'),
      Arm('mdlm', 'experiments/configs/quickstart.py'),
    ),
    command=f'{_REPRO} ar-below-mdlm',
    bound='full / exact NLL',
    cost_minutes=50,
  ),
  recipe(
    'md4-text8',
    _MD4,
    '2406.04329',
    'text8 results',
    'md4_text8.py',
    'text8 <= 1.37 BPC',
    1.37,
    'test bits/char',
  ),
  recipe(
    'md4-owt',
    _MD4,
    '2406.04329',
    'OWT results',
    'md4_owt.py',
    'OWT perplexity <= 22.13',
    22.13,
    'validation perplexity bound',
  ),
  recipe(
    'mdlm-lm1b',
    _MDLM,
    '2406.07524',
    'Table 1',
    'mdlm_lm1b.py',
    'LM1B perplexity <= 27.04',
    27.04,
    'test perplexity bound',
  ),
  recipe(
    'mdlm-owt',
    _MDLM,
    '2406.07524',
    'Table 2',
    'mdlm_owt.py',
    'OWT perplexity <= 23.21',
    23.21,
    'test perplexity bound',
  ),
  Claim(
    id='bpe-narrows-ar-gap',
    family='word level',
    paper='project observation (MDLM as the masked model)',
    arxiv='2406.07524',
    table='not in the paper',
    statement='With a 2048-token BPE vocabulary the gap between the MDLM '
    'bound and the AR twin, in bits per character, is smaller than at '
    'character level (same width, depth and text per step).',
    paper_value='-',
    metric='MDLM bound - AR NLL, bits/char',
    protocol=EQUAL_STEPS,
    rule=Compare('bpe', 'char', 'lower'),
    arms=(
      Arm('mdlm', 'experiments/configs/mdlm_quickstart.py'),
      Arm('ar', 'experiments/configs/ar_quickstart.py'),
      Arm('mdlm_bpe', 'experiments/configs/quickstart_bpe.py'),
      Arm('ar_bpe', 'experiments/configs/ar_quickstart_bpe.py'),
    ),
    derived=Derived(
      'bpe',
      ar_gaps_of({'bpe': ('mdlm_bpe', 'ar_bpe'), 'char': ('mdlm', 'ar')}),
      'Each gap is one seed: the MDLM bound (full convention) minus the AR '
      "twin's NLL of the same seed, both on the validation plays and "
      'divided by the characters per token of that tokenizer.',
    ),
    command=f'{_REPRO} bpe-narrows-ar-gap',
    bound='full',
    cost_minutes=80,
  ),
)
