"""Generates docs/RESULTS.md from the claims registry and their records.

  python -m experiments.results_doc          # rewrite docs/RESULTS.md
  python -m experiments.results_doc --check  # exit 1 if it is stale

Nothing in docs/RESULTS.md is written by hand: the table of every claim,
the list of what has not been run and the evidence sections all come from
``experiments/claims`` (the claims and their rules) and
``experiments/claims/records`` (what was measured), and every verdict is
computed by ``experiments.claims.verdict``. tests/test_claims.py checks
that the committed file equals this output.
"""

from __future__ import annotations

import argparse
import os
import sys

from experiments import claims as registry
from experiments.claims import records, spec
from experiments.claims import verdict as v

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, 'docs', 'RESULTS.md')

INTRO = """\
# Results

Every claim this suite checks, the paper's number beside ours, and a
verdict computed from the measured numbers by a stated rule. This file is
generated (`python -m experiments.results_doc`) from the claims registry
(`experiments/claims/`, one module per paper) and the records of what was
measured (`experiments/claims/records/`); do not edit it by hand. Any
claim is measured again, with a new record, by

```
python -m experiments.reproduce CLAIM [--seeds=0,1,2] [--budget=cpu|paper]
python -m experiments.reproduce --list     # every claim, its verdict, its cost
```

**Verdicts.** *reproduced*: the claim holds on at least 3 training seeds
(on every seed, and the mean by more than twice its standard error), or an
exact test of it passes. *partial*: the mean points the claim's way, but
too few training seeds, a seed against it, a difference inside the noise,
or an unmatched protocol keep it from settling; sampling seeds of one
model and repeated timing rounds never count as training seeds. A timing
claim on code that trains nothing (random weights, random data) counts
fresh processes instead: its benchmark runs in at least 3, one after
another on an otherwise idle host, and must meet the target in each. *miss*:
the measurement points against the claim. *not matched*: it points
against the claim, but the claimed winner's samples had more than 0.02
bits more unigram entropy than its baseline's (or either way for a
higher-is-better metric), which alone raises generative perplexity, so it
cannot settle the claim either way. *inconclusive at this budget*: it
points against the claim, but our training budget is below 1% of the
paper's, which cannot settle it either way. *not run*: no record.
Sample-quality comparisons are entropy-matched: an arm that wins with more
than 0.02 bits less unigram entropy than its baseline is at most partial,
because lower entropy alone lowers generative perplexity.

**Bound conventions.** Masked-diffusion runs report the full bound by
default (`process.bound='full'`): the prior term KL(q(z_1|x) || p(z_1)),
the reconstruction at t_min and the (1 - t_min) factor on the diffusion
term, which together make it a true upper bound on -log p(x) (an exact
test checks this by enumeration). `--config.process.bound=mdlm` gives the
convention of the published MDLM / MD4 numbers (no prior term,
reconstruction at alpha(0)); BD3 keeps it, as its paper does. On one
trained quickstart run the two differ by +0.0094 bits/char (3.383 full
against 3.373 mdlm). The table says which convention each number uses.

**Records transcribed from earlier notes.** Most records were transcribed
from the numbers this file reported before it was generated (source
`docs/RESULTS.md at commit 0816013, measured earlier, not rerun`), with
the seeds and hosts they were measured on; their verdicts are computed by
the same rules as new records. Where those notes gave only a mean and a
spread, the record holds only that. How the numbers were reached, in
order, is in `docs/HISTORY.md`.
"""


def _num(x: float) -> str:
  if x == 0:
    return '0'
  mag = abs(x)
  if mag >= 100:
    return f'{x:.1f}'
  if mag >= 10:
    return f'{x:.2f}'
  if mag >= 1:
    return f'{x:.4f}' if mag < 5 else f'{x:.3f}'
  return f'{x:.4g}'


def arm_text(name: str, arm: dict) -> str:
  st = v.stats(arm)
  sd = '' if st.sd is None else f' +- {st.sd:.2g}'
  return f'{name} {_num(st.mean)}{sd} (n={st.n})'


def _rule_arms(rule) -> list[str]:
  if isinstance(rule, v.AllOf):
    names = [name for part in rule.rules for name in _rule_arms(part)]
    return list(dict.fromkeys(names))
  if isinstance(rule, (v.Compare, v.Ratio)):
    return [rule.arm, rule.baseline]
  if isinstance(rule, (v.Threshold, v.Match)):
    return [rule.arm]
  if isinstance(rule, v.Ordering):
    return list(rule.arms)
  return []


def ours_text(claim: spec.Claim, rec: dict | None) -> str:
  if not rec:
    return '-'
  if isinstance(claim.rule, v.ExactTest):
    passed = rec.get('exact_test', {}).get('passed')
    return 'test passes' if passed else 'test fails'
  parts = []
  for name in _rule_arms(claim.rule):
    arm = rec['arms'].get(name)
    if arm:
      parts.append(arm_text(name, arm))
  if isinstance(claim.rule, v.Ratio):
    try:
      parts.append(arm_text(claim.rule.name, v.ratios(claim.rule, rec)))
    except KeyError:
      pass  # Its verdict says why there is no ratio.
  return '; '.join(parts) or '-'


def host_text(rec: dict | None) -> str:
  if not rec:
    return '-'
  host = rec.get('host')
  if isinstance(host, dict):
    cores = f', {host.get("cores")} cores' if host.get('cores') else ''
    return f'{host.get("cpu", "?")}{cores}, jax {host.get("jax")}'
  return str(host).split(';')[0]


def paper_text(claim: spec.Claim) -> str:
  arxiv = f' ({claim.arxiv})' if claim.arxiv else ''
  return f'{claim.paper}{arxiv}, {claim.table}'


def _esc(text: str) -> str:
  return text.replace('|', '\\|')


def verdict_for(claim: spec.Claim, rec: dict | None) -> v.Verdict:
  return v.judge(claim.rule, rec, claim.budget_fraction, claim.budget_floor)


def render(records_dir: str = records.RECORDS_DIR) -> str:
  latest = records.latest(records_dir)
  out = [INTRO]
  counts: dict[str, int] = {}
  rows = []
  for claim in registry.CLAIMS.values():
    rec = latest.get(claim.id)
    got = verdict_for(claim, rec)
    counts[got.label] = counts.get(got.label, 0) + 1
    when = f'{rec["commit"]}, {rec["date"]}' if rec else '-'
    rows.append(
      '| '
      + ' | '.join(
        _esc(x)
        for x in (
          f'[{claim.id}](#{claim.id})',
          paper_text(claim),
          claim.paper_value,
          ours_text(claim, rec),
          claim.metric,
          claim.bound or '-',
          claim.protocol,
          f'**{got.label}**',
          host_text(rec),
          when,
        )
      )
      + ' |'
    )
  summary = ', '.join(f'{counts[k]} {k}' for k in v.VERDICTS if k in counts)
  out.append('## Every claim\n')
  out.append(f'{len(registry.CLAIMS)} claims: {summary}.\n')
  out.append(
    "| claim | paper | paper's number | ours (mean +- sd over seeds) | "
    'metric | bound | protocol | verdict | host | commit, date |'
  )
  out.append('|---|---|---|---|---|---|---|---|---|---|')
  out.extend(rows)
  out.append('')
  out.append('## Not run\n')
  out.append(
    'Registered claims without a record (paper-scale recipes and '
    'accelerator paths; their configs and commands exist and are tested '
    'at smoke scale only):\n'
  )
  for claim in registry.CLAIMS.values():
    if claim.id not in latest:
      why = 'accelerator' if claim.accelerator else 'CPU'
      if claim.pending:
        why += f'; {claim.pending}'
      out.append(
        f'- `{claim.id}` ({why}, {claim.paper}): {claim.statement} '
        f'Paper: {claim.paper_value}. Command: `{claim.command}`.'
      )
  out.append('')
  out.append(
    'Marked for the accelerator run (a budget 2 CPU cores cannot reach, '
    'or a device path):\n'
  )
  for claim in registry.CLAIMS.values():
    rec = latest.get(claim.id)
    if rec is None:
      continue
    label = verdict_for(claim, rec).label
    if v.next_step(label, rec, claim.accelerator) == 'accelerator run':
      out.append(f'- `{claim.id}`: {claim.statement}')
  out.append('')
  out.append(
    'Marked for a rerun (a record another command made, transcribed from '
    'earlier notes or written by a benchmark before `reproduce` measured '
    'the claim, that is neither reproduced nor a miss on 3 training seeds '
    'under the rules; `python -m experiments.reproduce --rerun` runs them, '
    'the timings first, which need an otherwise idle host):\n'
  )
  rerun = [
    c.id
    for c in registry.CLAIMS.values()
    if c.id in latest
    and v.next_step(
      verdict_for(c, latest[c.id]).label, latest[c.id], c.accelerator
    )
    == 'rerun'
  ]
  out.append(rerun_text(rerun))
  out.append('')
  out.append('Not measured at all:\n')
  out.append(
    '- Pallas kernels compiled and timed on a TPU or GPU, the cuDNN and '
    'splash attention backends on a device, and multi-host training on '
    'real hardware: lowering is checked from the CPU by `jax.export` and '
    'numerics in interpret mode (`tests/test_kernels_*.py`, '
    '`tests/test_attention_backends.py`); none has run on an accelerator.'
  )
  out.append('')
  out.extend(_figures())
  out.append('## Evidence by family\n')
  for family in registry.FAMILIES:
    members = [c for c in registry.CLAIMS.values() if c.family == family]
    if not members:
      continue
    out.append(f'### {family[0].upper() + family[1:]}\n')
    for claim in members:
      out.extend(_evidence(claim, latest.get(claim.id)))
  return '\n'.join(out).rstrip() + '\n'


def rerun_text(claim_ids) -> str:
  """The claims marked for a rerun as one line; an empty list says why it
  is empty rather than leaving a bare full stop."""
  if not claim_ids:
    return (
      'None: apart from the accelerator runs above, every record is '
      'reproduced, made by `reproduce`, or a miss on 3 training seeds.'
    )
  return ', '.join(f'`{x}`' for x in claim_ids) + '.'


def _figures() -> list[str]:
  from experiments.claims.figures import FIGURES

  if not FIGURES:
    return []
  lines = ['## Figures\n']
  for fig in FIGURES:
    lines.append(f'### {fig.title}\n')
    lines.append(f'![{fig.title}]({os.path.relpath(fig.path, "docs")})\n')
    lines.append(f'{fig.caption} Drawn {fig.drawn} by:\n')
    lines += ['```', fig.command, '```', '']
    if fig.table:
      with open(os.path.join(ROOT, fig.table)) as f:
        lines += [f.read().rstrip(), '']
  return lines


def _evidence(claim: spec.Claim, rec: dict | None) -> list[str]:
  got = verdict_for(claim, rec)
  lines = [f'#### {claim.id}\n']
  lines.append(
    f'{claim.statement} Paper: {paper_text(claim)}: {claim.paper_value}. '
    f'Metric: {claim.metric}; protocol: {claim.protocol}.'
  )
  if claim.budget_fraction is not None:
    lines[-1] += (
      f" Training budget: {claim.budget_fraction:.2g} of the paper's."
    )
  lines.append('')
  lines.append(f'**{got.label}**: {got.reason}.')
  lines.append('')
  runnable = claim.arms or claim.measurement
  if runnable or isinstance(claim.rule, v.ExactTest):
    command = f'python -m experiments.reproduce {claim.id}'
    if claim.command.startswith(command):  # e.g. with --budget paper
      command = claim.command
    lines.append(f'Reproduce: `{command}`')
    lines.append('')
  if not rec:
    # A claim that runs by its id has its command just above.
    lines.append(
      'Not run.' if runnable else f'Not run. Command: `{claim.command}`.'
    )
    lines.append('')
    return lines
  lines.append(
    f'Record: {rec["source"]}; commit {rec["commit"]}, {rec["date"]}; '
    f'host: {host_text(rec)}; seeds: '
    f'{", ".join(map(str, rec.get("seeds", []))) or "-"} '
    f'({rec.get("seed_kind", "training")}).'
  )
  if rec.get('notes'):
    lines.append(rec['notes'])
  lines.append('')
  for figure in rec.get('figures', ()):
    # Paths are relative to the repository; RESULTS.md lives in docs/.
    lines.append(f'![{claim.id}]({os.path.relpath(figure, "docs")})')
    lines.append('')
  lines.append('```')
  lines.append(rec['command'])
  lines.append('```')
  lines.append('')
  if rec.get('arms'):
    lines.extend(_arms_table(rec['arms']))
    lines.extend(_details_text(rec['arms']))
  if rec.get('trained'):
    lines.append(
      'The trained runs the arms above were computed from (final '
      'validation bound, bits/token):'
    )
    lines.append('')
    lines.extend(_arms_table(rec['trained'], entropy=False))
    lines.extend(_details_text(rec['trained']))
  return lines


def _arms_table(arms: dict, entropy: bool = True) -> list[str]:
  """One row per arm: its per-seed values, mean +- sd (and entropy)."""
  head = '| arm | values | mean +- sd |'
  lines = [
    head + (' entropy bits |' if entropy else ''),
    '|---' * (3 + entropy) + '|',
  ]
  for name, arm in arms.items():
    st = v.stats(arm)
    if st.values is not None:
      seeds = arm.get('seeds')
      if seeds:
        vals = ', '.join(f's{s}: {_num(x)}' for s, x in zip(seeds, st.values))
      else:
        vals = ', '.join(_num(x) for x in st.values)
    else:
      vals = 'summary only'
    sd = '-' if st.sd is None else f'{st.sd:.2g}'
    row = f'| {name} | {vals} | {_num(st.mean)} +- {sd} |'
    if entropy:
      row += f' {_entropy_text(arm.get("entropy"))} |'
    lines.append(row)
  lines.append('')
  return lines


def _details_text(arms: dict) -> list[str]:
  """Per-seed facts of the runs beside the table: which had finished
  before the call that wrote the record, and the claim's ``details``
  (diagnostics), one line each."""
  lines = []
  for name, arm in arms.items():
    if arm.get('reused_seeds'):
      seeds = ', '.join(map(str, arm['reused_seeds']))
      lines.append(
        f'- {name}, seeds {seeds}: finished before this call, in the '
        'workdirs of the same config and overrides (reused here; each '
        'holds the config it ran)'
      )
    for key, values in arm.get('details', {}).items():
      per_seed = ', '.join(
        f's{s}: {"-" if x is None else _num(x)}'
        for s, x in zip(arm.get('seeds', ()), values)
      )
      lines.append(f'- {name}, {key} of the tested parameters: {per_seed}')
  if lines:
    lines.append('')
  return lines


def _entropy_text(entropy) -> str:
  """An arm's recorded entropy: one number, or one per seed (3 decimals)."""
  if entropy is None:
    return '-'
  if isinstance(entropy, (list, tuple)):
    return ', '.join(f'{float(h):.3f}' for h in entropy)
  return f'{float(entropy):.3f}'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m experiments.results_doc')
  parser.add_argument('--check', action='store_true')
  args = parser.parse_args(argv)
  text = render()
  if args.check:
    with open(PATH) as f:
      if f.read() != text:
        print('docs/RESULTS.md is stale: python -m experiments.results_doc')
        return 1
    return 0
  with open(PATH, 'w') as f:
    f.write(text)
  print(f'wrote {os.path.relpath(PATH, ROOT)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
