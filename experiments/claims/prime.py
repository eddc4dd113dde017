"""MDM-Prime, partial masking with sub-tokens (arXiv 2505.18495).

The bound comparisons train `experiments/configs/mdm_prime.py` against
the BPE quickstart's MDLM (`quickstart_bpe.py`): the same corpus,
vocabulary (2048), network and steps; only the process differs. The
paper's OpenWebText runs see ~1.6e5 times more tokens than these 1000
steps of 64 x 48, and its GPT-2 vocabulary is 25x larger.
"""

from experiments.claims.spec import EQUAL_STEPS, Arm, Claim, exact_claim
from experiments.claims.verdict import Compare

_PAPER = 'MDM-Prime'
_ARXIV = '2505.18495'
_REPRO = 'python -m experiments.reproduce'
_MDLM = Arm('mdlm', 'experiments/configs/quickstart_bpe.py')
_L2 = Arm('prime_l2', 'experiments/configs/mdm_prime.py:l2')
_BINARY = Arm('prime_binary', 'experiments/configs/mdm_prime.py:binary')
# Tokens seen: 1000 x 64 x 48 here over the paper's ~1M x 512 x 1024.
_BUDGET = 1000 * 64 * 48 / (1e6 * 512 * 1024)
_OWT = 'OWT perplexity <= 15.36 (MDM-Prime) vs MDLM <= 21.52'


def _beats_mdlm(id_, arm, what):
  return Claim(
    id=id_,
    family='word level',
    paper=_PAPER,
    arxiv=_ARXIV,
    table='Table 1 (OWT)',
    statement=f'MDM-Prime with {what} reaches a lower bound than MDLM at '
    'equal steps on the word-level (BPE) quickstart.',
    paper_value=_OWT,
    metric='validation bound, bits/token',
    protocol=EQUAL_STEPS,
    rule=Compare(arm.name, 'mdlm', 'lower'),
    arms=(_MDLM, arm),
    command=f'{_REPRO} {id_}',
    bound='full',
    budget_fraction=_BUDGET,
    cost_minutes=120,
  )


CLAIMS = (
  exact_claim(
    'prime-bound-exact',
    family='bounds',
    paper=_PAPER,
    arxiv=_ARXIV,
    table='the sub-token variational bound',
    statement='The sub-token bound equals -log p(x) for the exact '
    'posterior denoiser and stays above the entropy for other denoisers, '
    'for l = 1, 2 and ceil(log2 V) (enumerated on a 5-token, length-2 '
    'source).',
    paper_value='an upper bound on the NLL',
    test='tests/test_mdm_prime.py',
    cost_minutes=3,
  ),
  _beats_mdlm('prime-l2-beats-mdlm', _L2, 'l = 2 sub-tokens'),
  _beats_mdlm('prime-binary-beats-mdlm', _BINARY, 'binary sub-tokens'),
)
