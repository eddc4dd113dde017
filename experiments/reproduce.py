"""Reproduce a registered paper claim: train its arms, compute its verdict.

  python -m experiments.reproduce --list
  python -m experiments.reproduce CLAIM [CLAIM ...] [--seeds=0,1,2]
                                  [--budget=cpu|paper]
  python -m experiments.reproduce --rerun [--dry_run]

For a claim with arms (``experiments/claims``), every (arm, seed) run is an
``experiments.run`` subprocess in RUNS_DIR/BUDGET/ARM_KEY/sSEED: a run whose
summary.json has its final numbers is reused, an interrupted one resumes
from its newest checkpoint (exit code 75 restarts it), so the command can be
stopped and started again at any point. Runs are keyed by config and
overrides, so claims that share an arm (the quickstart) share its runs. An
arm with ``init_from`` starts from its base arm's run of the same seed.
A claim whose metric is a validation number trains its arms without the
end-of-run samples (``sample.num_samples=0``): they are not part of the
metric, and their scorer run need not exist.
Claims checked by an exact test run that test with pytest.

A claim with a ``Claim.measurement`` runs that command, in fresh
processes one after another: a timing benchmark (code that trains
nothing) in three, each a replicate, or a training sweep once per seed,
or a benchmark on the claim's trained runs once per seed, after training
(or reusing) the arms it reads and their scorer. Each process's JSON
result is kept in RUNS_DIR/BUDGET/measure/KEY (pN.json or sN.json) and
reused like a finished run, so claims with the same command share its
processes; the claim's numbers are read from each.
Time benchmarks on an otherwise idle host.

Several claims run one after another, each writing its own record, whose
command names that claim alone; ``--rerun`` runs every claim ``--list``
marks for a rerun, the timings first (they need the host idle), and
``--dry_run`` prints the claims with their cost estimates instead. Bad
input for any claim stops the command before the first one runs.

A sample-quality claim (``Claim.samplings``) trains its arms the same way
(without end-of-run samples) and its scorer, the AR twin, once (seed 0);
then for each training seed S every sampling arm draws from the seed-S
run with sampling seed S over its temperature sweep, and its AR-twin
gen-ppl at the validation text's unigram entropy, the entropy reached
and the NFE are the record's arms (``benchmarks.matched_sampling``; each
sweep is saved under RUNS_DIR/BUDGET/samples and reused). The trained
arms' bounds go into the record's ``trained`` field.

A claim with a ``Claim.derived`` value trains its arms the same way, then
computes that value per seed from all the seed's runs together (e.g. the
steps one arm needs to reach another's bound, from their validation
curves); it is the record's arm, the arms' bounds its ``trained`` field.

Then the metric is read from each run's summary.json, the verdict computed
by the claim's rule, and a JSON record written to RECORDS_DIR (commit,
date, host: CPU model and flags, jax/flax versions; seeds; this command;
its wall time).
``--budget=smoke`` shrinks every arm to its ``smoke`` preset: a test of the
machinery whose verdict is always 'inconclusive at this budget'.
Claims measured otherwise (no arms, no measurement) print their command.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from ddlm_jax.errors import ConfigError
from ddlm_jax.training.metrics import read_metrics
from experiments import claims as registry
from experiments.claims import records, spec
from experiments.claims import verdict as verdict_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGETS = ('cpu', 'paper', 'smoke')
RETRIES = 5  # Restarts after exit code 75 (SIGTERM saved a checkpoint).


class UsageError(ValueError):
  pass


def parse_seeds(text: str | None, claim: spec.Claim) -> tuple[int, ...]:
  if not text:
    return claim.seeds
  try:
    seeds = tuple(int(s) for s in text.split(',') if s.strip())
  except ValueError:
    raise UsageError(
      f'--seeds={text!r}: give comma-separated integers, e.g. --seeds=0,1,2'
    ) from None
  if not seeds or any(s < 0 for s in seeds):
    raise UsageError(f'--seeds={text!r}: give seeds >= 0, e.g. 0,1,2')
  return seeds


def cost_text(minutes: float) -> str:
  if minutes < 90:
    return f'~{minutes:.0f} min'
  if minutes < 60 * 48:
    return f'~{minutes / 60:.1f} h'
  return f'~{minutes / 60 / 24:.0f} d'


def verdict_of(claim: spec.Claim, record: dict | None):
  return verdict_lib.judge(
    claim.rule, record, claim.budget_fraction, claim.budget_floor
  )


def statuses(records_dir: str):
  """(claim, its newest record or None, verdict, next step) of every
  registered claim, in registry order."""
  latest = records.latest(records_dir)
  for claim in registry.CLAIMS.values():
    rec = latest.get(claim.id)
    got = verdict_of(claim, rec)
    yield (
      claim,
      rec,
      got,
      verdict_lib.next_step(got.label, rec, claim.accelerator),
    )


def list_claims(records_dir: str) -> str:
  rows = []
  for claim, rec, got, todo in statuses(records_dir):
    where = 'accelerator' if claim.accelerator else 'cpu'
    seeds = ''
    if rec:
      seeds = ','.join(str(s) for s in rec.get('seeds', [])) or '-'
    rows.append(
      (claim.id, got.label, seeds, cost_text(claim.cost_minutes), where, todo)
    )
  width = max(len(r[0]) for r in rows)
  head = (
    f'{"claim":<{width}}  {"verdict":<28} {"seeds":<8} {"cost":<9} '
    f'{"where":<12} next'
  )
  lines = [head]
  for r in rows:
    lines.append(
      f'{r[0]:<{width}}  {r[1]:<28} {r[2]:<8} {r[3]:<9} {r[4]:<12} {r[5]}'
    )
  return '\n'.join(lines)


def arm_key(arm: spec.Arm, budget: str, claim: spec.Claim) -> str:
  """A readable, stable directory name for (config, overrides, base)."""
  config = arm.config_for(budget)
  stem = os.path.basename(config).replace('.py', '')
  stem = re.sub(r'[^A-Za-z0-9_.,-]+', '_', stem)
  base = ''
  if arm.init_from:
    parent = next(a for a in claim.arms if a.name == arm.init_from)
    base = arm_key(parent, budget, claim)
  blob = json.dumps([config, list(arm.overrides_for(budget)), base])
  digest = hashlib.sha1(blob.encode()).hexdigest()[:8]
  return f'{stem}-{digest}'


def _summary(workdir: str) -> dict | None:
  path = os.path.join(workdir, 'summary.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def read_metric(summary: dict, key: str) -> float | None:
  value = summary
  for part in key.split('.'):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return float(value)


def chosen_validation(workdir: str, summary: dict) -> dict:
  """The validation record of metrics.jsonl at the summary's best_step:
  the evaluation that chose the parameters the test scored ({} if none)."""
  step = summary.get('best_step')
  rows = [
    r
    for r in read_metrics(workdir)
    if r.get('split') == 'validation' and r.get('step') == step
  ]
  return rows[-1] if rows else {}  # The last: a resumed run may repeat it.


def _finished(summary: dict | None, claim: spec.Claim) -> bool:
  return bool(summary) and read_metric(summary, claim.metric_key) is not None


def workdir_of(
  claim: spec.Claim, arm: spec.Arm, seed: int, budget: str, runs_dir: str
) -> str:
  return os.path.join(runs_dir, budget, arm_key(arm, budget, claim), f's{seed}')


def run_arm(
  claim: spec.Claim,
  arm: spec.Arm,
  seed: int,
  budget: str,
  runs_dir: str,
  log=print,
) -> str:
  """Trains (or reuses, or resumes) one arm's run; returns its workdir."""
  workdir = workdir_of(claim, arm, seed, budget, runs_dir)
  if _finished(_summary(workdir), claim):
    log(f'  {arm.name} seed {seed}: finished, reused ({workdir})')
    return workdir
  cmd = [
    sys.executable,
    '-m',
    'experiments.run',
    f'--config={arm.config_for(budget)}',
    f'--workdir={workdir}',
    f'--config.seed={seed}',
  ]
  for key, value in arm.overrides_for(budget):
    cmd.append(f'--config.{key}={value}')
  if claim.metric_key.startswith('validation.') or claim.samplings:
    cmd.append('--config.sample.num_samples=0')
  if arm.init_from:
    parent = next(a for a in claim.arms if a.name == arm.init_from)
    base = workdir_of(claim, parent, seed, budget, runs_dir)
    cmd.append(f'--config.train.init_from={base}')
  state = 'resuming' if os.path.isdir(workdir) else 'training'
  log(f'  {arm.name} seed {seed}: {state}: {shlex.join(cmd[1:])}')
  for _ in range(RETRIES + 1):
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if rc != 75:
      break
    log(f'  {arm.name} seed {seed}: interrupted with a checkpoint, resuming')
  if rc != 0:
    raise RuntimeError(
      f'{arm.name} seed {seed} failed (exit {rc}); its log is above, its '
      f'workdir {workdir}; run the same command again to resume'
    )
  if not _finished(_summary(workdir), claim):
    raise RuntimeError(
      f'{workdir}/summary.json has no {claim.metric_key}: the run did not '
      'reach its final evaluation'
    )
  return workdir


def measure_arms(claim, seeds, budget, runs_dir, log=print) -> dict:
  """{arm: {seeds, values, stderr?, workdirs}} over the claim's arms."""
  out = {}
  for seed in seeds:
    for arm in claim.arms:  # Bases are listed before the arms they start.
      reused = _finished(
        _summary(workdir_of(claim, arm, seed, budget, runs_dir)), claim
      )
      workdir = run_arm(claim, arm, seed, budget, runs_dir, log)
      summary = _summary(workdir)
      value = read_metric(summary, claim.metric_key) * claim.metric_scale
      entry = out.setdefault(
        arm.name, {'seeds': [], 'values': [], 'workdirs': []}
      )
      entry['seeds'].append(seed)
      entry['values'].append(value)
      entry['workdirs'].append(os.path.relpath(workdir, ROOT))
      if reused:  # Trained by an earlier call, maybe at an earlier commit.
        entry.setdefault('reused_seeds', []).append(seed)
      if claim.details:
        chosen = chosen_validation(workdir, summary)
        details = entry.setdefault('details', {})
        for key in claim.details:
          details.setdefault(key, []).append(chosen.get(key))
      se = read_metric(summary, 'validation.bits_per_token_stderr')
      if se is not None and claim.metric_key.startswith('validation.'):
        entry.setdefault('stderr', []).append(se * claim.metric_scale)
  return out


def derive(claim: spec.Claim, trained: dict, seeds, log=print) -> dict:
  """The claim's derived arm: one value per seed from all its arms' runs."""
  out = {}
  for i, seed in enumerate(seeds):
    workdirs = {
      name: os.path.normpath(os.path.join(ROOT, arm['workdirs'][i]))
      for name, arm in trained.items()
    }
    try:
      got = claim.derived.fn(workdirs)
    except ValueError as e:
      raise RuntimeError(f'{claim.id} seed {seed}: {e}') from None
    if not isinstance(got, Mapping):
      got = {claim.derived.name: got}
    for name, value in got.items():
      log(f'  {name} seed {seed}: {value:.4g}')
      entry = out.setdefault(name, {'seeds': [], 'values': []})
      entry['seeds'].append(seed)
      entry['values'].append(float(value))
  return out


def measure_samplings(claim, seeds, budget, runs_dir, log=print) -> dict:
  """The claim's sampling arms at matched entropy, one value per seed.

  Its arms are trained (``measure_arms``) and the scorer is trained here
  (seed ``spec.SCORER_SEED``) before the first draw.
  """
  from experiments.benchmarks import matched_sampling

  scorer_dir = run_arm(
    claim, claim.scorer, spec.SCORER_SEED, budget, runs_dir, log
  )
  runs = {
    arm.name: {
      seed: (
        workdir_of(claim, arm, seed, budget, runs_dir),
        arm_key(arm, budget, claim),
      )
      for seed in seeds
    }
    for arm in claim.arms
  }
  return matched_sampling.measure_claim(
    claim,
    seeds,
    runs,
    (scorer_dir, os.path.relpath(scorer_dir, os.path.join(runs_dir, budget))),
    os.path.join(runs_dir, budget, 'samples'),
    budget=budget,
    log=log,
  )


def _read_arms(claim: spec.Claim) -> dict[str, spec.Arm]:
  """The arms a measurement reads as {run:ARM} ('scorer': the scorer)."""
  arms = {a.name: a for a in claim.arms}
  if claim.scorer is not None:
    arms['scorer'] = claim.scorer
  return {name: arms[name] for name in sorted(claim.measurement.runs)}


def measure_dir(
  m: spec.Measurement,
  budget: str,
  runs_dir: str,
  claim: spec.Claim | None = None,
) -> str:
  """RUNS_DIR/BUDGET/measure/KEY: the processes of one command.

  A command on trained runs is keyed by the runs it reads too, so a
  changed arm config measures again instead of reusing stale results.
  """
  command = m.command(budget)
  if m.runs:
    keys = {
      name: arm_key(arm, budget, claim)
      for name, arm in _read_arms(claim).items()
    }
    command += ' ' + json.dumps(keys, sort_keys=True)
  digest = hashlib.sha256(command.encode()).hexdigest()[:8]
  name = m.module.rsplit('.', 1)[-1]
  return os.path.join(runs_dir, budget, 'measure', f'{name}-{digest}')


def _values(m: spec.Measurement, result) -> dict[str, dict]:
  """{arm: {'value': float, other per-seed fields}} of one result."""
  got = m.value(result)
  if not isinstance(got, Mapping):
    got = {m.arm: got}
  return {
    arm: (
      {**x, 'value': float(x['value'])}
      if isinstance(x, Mapping)
      else {'value': float(x)}
    )
    for arm, x in got.items()
  }


def measured_arms(m: spec.Measurement, results) -> dict[str, dict]:
  """The record arms {arm: {'seeds', 'values', FIELD: [...]}} of a
  measurement's processes: ``results`` is [(seed, parsed JSON)] in order
  (a timing benchmark's seed is its process index). A result without the
  claim's value is a ValueError naming its process."""
  per_arm: dict[str, list] = {}
  for seed, result in results:
    try:
      got = _values(m, result)
    except ValueError as e:
      raise ValueError(f'{"seed " if m.per_seed else "p"}{seed}: {e}') from None
    for arm, fields in got.items():
      per_arm.setdefault(arm, []).append((seed, fields))
  return {
    arm: records.arm_of([s for s, _ in rows], [f for _, f in rows])
    for arm, rows in per_arm.items()
  }


def measured_runs(claim, seed, budget, runs_dir) -> dict[str, str]:
  """{arm or 'scorer': workdir} of the runs the measurement reads at seed
  (the scorer's is its one run, seed ``spec.SCORER_SEED``)."""
  return {
    name: workdir_of(
      claim,
      arm,
      spec.SCORER_SEED if name == 'scorer' else seed,
      budget,
      runs_dir,
    )
    for name, arm in _read_arms(claim).items()
  }


def measure_command(claim, seeds, budget, runs_dir, log=print) -> dict:
  """{'arms', 'notes', 'seeds'}: the claim's numbers from each process.

  A timing benchmark runs ``processes`` processes (p0, p1, ...), a
  training sweep or a benchmark on trained runs one per seed (s0, s1,
  ...). Each process's result is kept as UNIT.json beside its output; a
  unit whose UNIT.json exists is reused, as a finished run is, and an
  interrupted sweep resumes in UNIT/.
  """
  m = claim.measurement
  out_dir = measure_dir(m, budget, runs_dir, claim)
  os.makedirs(out_dir, exist_ok=True)
  units = (
    [(f's{s}', s) for s in seeds]
    if m.per_seed
    else [(f'p{i}', None) for i in range(m.processes)]
  )
  reused, loads, results = [], [], []
  for index, (unit, seed) in enumerate(units):
    final = os.path.join(out_dir, f'{unit}.json')
    label = unit if seed is None else f'seed {seed}'
    if os.path.exists(final):
      log(f'  {label}: finished, reused ({final})')
      reused.append(index if seed is None else seed)
    else:
      loads.append(round(os.getloadavg()[0], 2))
      # A sweep writes (and resumes) in its folder; a benchmark writes one
      # file, renamed once the process has finished.
      if m.result_file:
        target = os.path.join(out_dir, unit)
      else:
        target = f'{final}.partial'
      runs = measured_runs(claim, seed, budget, runs_dir) if m.runs else None
      cmd = [sys.executable, '-m', m.module, *m.args_for(budget, seed, runs)]
      cmd.append(f'{m.result_flag}={target}')
      log(f'  {label}: {shlex.join(cmd[1:])}')
      rc = subprocess.run(cmd, cwd=ROOT).returncode
      written = target
      if m.result_file:
        written = os.path.join(
          target, m.result_file.replace('{seed}', str(seed))
        )
      if rc != 0 or not os.path.exists(written):
        raise RuntimeError(
          f'{claim.id}: {label} of {m.module} failed (exit {rc}); its log '
          'is above; run the same command again to retry it'
        )
      if m.result_file:
        shutil.copyfile(written, f'{final}.partial')
      os.replace(f'{final}.partial', final)
    with open(final) as f:
      results.append((index if seed is None else seed, json.load(f)))
  try:
    arms = measured_arms(m, results)
  except ValueError as e:  # A result holds no value for this claim.
    raise RuntimeError(f'{claim.id}: {e}') from None
  for entry in arms.values():
    if reused:  # Measured by an earlier call, maybe at an earlier commit.
      entry['reused_seeds'] = list(reused)
  what = (
    'One process per training seed'
    if m.per_seed
    else f'{m.processes} fresh processes'
  )
  if m.runs:
    run_seed = {'scorer': str(spec.SCORER_SEED)}
    where = ', '.join(
      f'{spec.run_placeholder(n)} = {arm_key(arm, budget, claim)}/s'
      f'{run_seed.get(n, "SEED")}'
      for n, arm in _read_arms(claim).items()
    )
    what += f' (in {os.path.relpath(runs_dir, ROOT)}/{budget}: {where})'
  setting = f'{m.describe([r for _, r in results])} ' if m.describe else ''
  if loads:
    load = f'1-minute load average before each process run here: {loads}'
  else:
    load = 'every result was reused from an earlier call'
  notes = (
    f'{setting}{what} of `{m.command(budget)}`, one after another, each '
    'writing '
    f'{m.result_flag}=PATH under {os.path.relpath(out_dir, ROOT)}; {load}.'
  )
  first = next(iter(arms.values()))
  return {'arms': arms, 'notes': notes, 'seeds': first['seeds']}


def run_exact_test(claim: spec.Claim, log=print) -> dict:
  """Runs the claim's test file; it passes only if every test in it ran.

  pytest exits 0 when tests skip (a parity test without torch), so the
  counts come from its JUnit report: a skipped test is not a passed one.
  """
  test = claim.rule.test
  log(f'  pytest {test}')
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, 'report.xml')
    rc = subprocess.run(
      [
        sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
        f'--junitxml={report}', test,
      ],
      cwd=ROOT,
    ).returncode  # fmt: skip
    counts = {'tests': 0, 'skipped': 0, 'failures': 0, 'errors': 0}
    if os.path.exists(report):
      for suite in ET.parse(report).getroot().iter('testsuite'):
        for key in counts:
          counts[key] += int(suite.get(key, 0))
  ran = counts['tests'] - counts['skipped']
  passed = rc == 0 and ran > 0 and counts['skipped'] == 0
  return {'test': test, 'passed': passed, **counts}


def reproduce(
  claim: spec.Claim,
  seeds: tuple[int, ...],
  budget: str,
  runs_dir: str,
  records_dir: str,
  command: str,
  log=print,
) -> tuple[dict, verdict_lib.Verdict, str]:
  now = datetime.datetime.now(datetime.UTC)
  record = records.start(
    claim.id, command, budget=budget, seeds=seeds, repo=ROOT, now=now
  )
  start = time.perf_counter()
  if isinstance(claim.rule, verdict_lib.ExactTest):
    record['exact_test'] = run_exact_test(claim, log)
    record['seeds'] = []
  elif claim.measurement:
    if claim.arms:  # The runs its command reads, trained or reused first.
      record['trained'] = measure_arms(claim, seeds, budget, runs_dir, log)
      if 'scorer' in claim.measurement.runs:
        run_arm(claim, claim.scorer, spec.SCORER_SEED, budget, runs_dir, log)
    got = measure_command(claim, seeds, budget, runs_dir, log)
    record.update(got, seed_kind=claim.measurement.seed_kind)
  elif claim.samplings:
    from experiments.benchmarks import matched_sampling

    record['trained'] = measure_arms(claim, seeds, budget, runs_dir, log)
    got = measure_samplings(claim, seeds, budget, runs_dir, log)
    record['arms'] = got['arms']
    record['target_entropy_bits'] = got['target_entropy_bits']
    record['notes'] = matched_sampling.notes(claim, got, budget)
  elif claim.derived:
    record['trained'] = measure_arms(claim, seeds, budget, runs_dir, log)
    record['arms'] = derive(claim, record['trained'], seeds, log)
    record['notes'] = claim.derived.describe
  else:
    record['arms'] = measure_arms(claim, seeds, budget, runs_dir, log)
  # Wall time of this command (reused runs cost nothing): a cost, not a
  # benchmark, on a host that may be shared.
  record['wall_seconds'] = round(time.perf_counter() - start, 1)
  path = records.write(record, now.strftime('%Y%m%dT%H%M%SZ'), records_dir)
  return record, verdict_of(claim, record), path


def marked(records_dir: str, step: str = 'rerun') -> list[spec.Claim]:
  """The claims ``--list`` marks with ``step``, in registry order but the
  timings first: they need an otherwise idle host, so a queue starts with
  them before anything shares its cores."""
  out = [c for c, _, _, todo in statuses(records_dir) if todo == step]
  return sorted(out, key=lambda c: not is_timing(c))


def is_timing(claim: spec.Claim) -> bool:
  """Times code that trains nothing, in fresh processes (replicates)."""
  return bool(claim.measurement and not claim.measurement.per_seed)


def checked(claim_id: str, args) -> tuple[spec.Claim, tuple[int, ...]]:
  """The claim and its seeds, or a UsageError before anything runs."""
  try:
    claim = registry.get(claim_id)
  except KeyError as e:
    raise UsageError(e.args[0]) from None
  seeds = parse_seeds(args.seeds, claim)
  if is_timing(claim) and args.seeds:
    raise UsageError(
      f'{claim.id} times code that trains nothing in '
      f'{claim.measurement.processes} fresh processes; drop --seeds'
    )
  if claim.samplings:
    from experiments.benchmarks import matched_sampling

    matched_sampling.check(claim)
  return claim, seeds


def runnable(claim: spec.Claim) -> bool:
  """Trains arms, runs a measurement or an exact test (else it is measured
  by a command of its own, which ``reproduce`` prints)."""
  exact = isinstance(claim.rule, verdict_lib.ExactTest)
  return bool(claim.arms or exact or claim.measurement)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    prog='python -m experiments.reproduce',
    description=__doc__.split('\n\n')[0],
  )
  parser.add_argument(
    'claims', nargs='*', help='claim ids (see --list), run one after another'
  )
  parser.add_argument('--list', action='store_true', help='every claim')
  parser.add_argument(
    '--rerun',
    action='store_true',
    help='every claim --list marks for a rerun, the timings first',
  )
  parser.add_argument(
    '--dry_run',
    action='store_true',
    help='print the claims it would run and their cost; run nothing',
  )
  parser.add_argument('--seeds', help='comma-separated, e.g. 0,1,2')
  parser.add_argument('--budget', default='cpu', choices=BUDGETS)
  parser.add_argument('--runs_dir', default=os.path.join('runs', 'claims'))
  parser.add_argument('--records_dir', default=records.RECORDS_DIR)
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parser.parse_args(argv)
  if args.list:
    print(list_claims(args.records_dir))
    return 0
  try:
    if args.rerun and args.claims:
      raise UsageError('name claims or --rerun, not both')
    ids = args.claims
    if args.rerun:
      ids = [c.id for c in marked(args.records_dir)]
    if not ids:
      if args.rerun:
        print('no claim is marked for a rerun')
        return 0
      raise UsageError('name a claim, or --list to see them')
    plan = [checked(claim_id, args) for claim_id in ids]
    idle = [c.id for c, _ in plan if not runnable(c)]
    if idle and len(plan) > 1:
      raise UsageError(
        f'{", ".join(idle)} is measured by a command of its own, not by '
        'reproduce; name it alone to see that command'
      )
  except (UsageError, ConfigError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if args.dry_run:
    width = max(len(c.id) for c, _ in plan)
    for claim, _ in plan:
      print(f'{claim.id:<{width}}  {cost_text(claim.cost_minutes)}')
    total = sum(c.cost_minutes for c, _ in plan)
    print(f'{len(plan)} claims, {cost_text(total)} in all (less with reuse)')
    return 0
  if idle:
    print(
      f'{idle[0]} is measured by a sweep or a benchmark, not by training '
      f'arms; its command:\n  {plan[0][0].command}\nIts record in '
      f'{os.path.relpath(args.records_dir, ROOT)} holds the numbers.'
    )
    return 3
  # Each record names the command that reproduces it alone.
  options = [a for a in argv if a not in ids and a not in ('--rerun',)]
  failed = []
  for claim, seeds in plan:
    command = 'python -m experiments.reproduce ' + shlex.join(
      [claim.id, *options]
    )
    print(f'{claim.id}: {claim.statement}')
    try:
      record, got, path = reproduce(
        claim,
        seeds,
        args.budget,
        os.path.abspath(args.runs_dir),
        args.records_dir,
        command,
      )
    except RuntimeError as e:
      print(f'error: {claim.id}: {e}', file=sys.stderr)
      failed.append(claim.id)
      continue
    for name, arm in record['arms'].items():
      values = ', '.join(f'{x:.4f}' for x in arm['values'])
      print(f'  {name}: {values}')
    print(f'verdict: {got.label} ({got.reason})')
    print(f'record: {path}')
  if failed:
    if len(plan) > 1:
      print(f'failed: {", ".join(failed)}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
