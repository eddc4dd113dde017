"""Claim records from a device check's JSON (the accelerator claims).

  python -m experiments.claims.device_records DEVICE_CHECK.json --commit=C

`experiments/benchmarks/device_check.py` writes one JSON per run; this
turns its numbers into records of the `gpu-*` claims, so their verdicts are
computed by the same rules as every other claim's:

  gpu-train-step-mfu          arm 'step': the train step's MFU in percent
  gpu-block-sparse-attention  arm 'kernel': xla / pallas time, block-causal
                              masks at L >= 4096
  gpu-auto-never-slower       arm 'auto': xla / auto time, every timed case

Each is one run of timed repeats on one device, so `seed_kind` is 'rounds'.
"""

from __future__ import annotations

import argparse
import json
import os

from experiments.claims.records import RECORDS_DIR, validate


def _speedup(rows, impl: str, mask: str | None, min_len: int = 0):
  return [
    float(r['speedup_vs_xla'])
    for r in rows
    if r.get('impl') == impl
    and 'speedup_vs_xla' in r
    and (mask is None or r.get('mask') == mask)
    and int(r.get('L', 0)) >= min_len
  ]


def records_from_device_check(
  check: dict, *, commit: str, date: str, command: str
):
  """{claim id: record} from a device_check.json dict."""
  host = (
    f'{check["device"]} ({check["backend"]}), Python {check["python"]}, '
    f'jax {check["jax"]}'
  )
  common = dict(
    source='device check JSON (experiments/benchmarks/device_check.py)',
    commit=commit,
    date=date,
    host=host,
    command=command,
    budget='as published',
    seed_kind='rounds',
  )
  step = check['train_step']
  attention = check['attention']
  out = {
    'gpu-train-step-mfu': dict(
      common,
      claim='gpu-train-step-mfu',
      arms={'step': {'values': [100.0 * float(step['mfu'])]}},
      notes=(
        f'{step["width"]}x{step["depth"]}, L {step["seq_len"]}, batch '
        f'{step["batch"]}, {step["dtype"]}, attention {step["attention_impl"]}'
        f': {step["step_ms"]:.1f} ms per step over {step["steps_timed"]} '
        'timed steps, against the bf16 matmul peak measured in the same run '
        f'({check["matmul_peak_tflops"]["bfloat16"]:.0f} TFLOP/s).'
      ),
    ),
    'gpu-block-sparse-attention': dict(
      common,
      claim='gpu-block-sparse-attention',
      arms={
        'kernel': {
          'values': _speedup(attention, 'pallas', 'block_causal', 4096)
        }
      },
      notes=(
        "The suite's Pallas kernel against 'xla', block-causal masks, "
        'forward + backward, bf16, head dims 64 and 128, L = 4096 and 16384.'
      ),
    ),
    'gpu-auto-never-slower': dict(
      common,
      claim='gpu-auto-never-slower',
      arms={'auto': {'values': [min(_speedup(attention, 'auto', None))]}},
      notes=(
        "Worst case over every timed mask and length. A case where 'auto' "
        "resolved to 'xla' reuses xla's row (ratio 1 by construction); the "
        'attention table was changed after this run so that block-causal '
        "masks resolve to 'pallas' on GPU."
      ),
    ),
  }
  for record in out.values():
    validate(record)
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('check_json')
  p.add_argument('--commit', required=True, help='commit that was measured')
  p.add_argument('--date', required=True, help='date measured, YYYY-MM-DD')
  p.add_argument(
    '--command',
    default='python -m experiments.benchmarks.device_check --out=DIR',
  )
  p.add_argument('--tag', default=None, help='record tag (default: date)')
  args = p.parse_args(argv)
  with open(args.check_json) as f:
    check = json.load(f)
  records = records_from_device_check(
    check, commit=args.commit, date=args.date, command=args.command
  )
  tag = args.tag or args.date.replace('-', '')
  for claim, record in records.items():
    path = os.path.join(RECORDS_DIR, f'{claim}.{tag}.json')
    with open(path, 'w') as f:
      json.dump(record, f, indent=1, sort_keys=True)
      f.write('\n')
    print(path)


if __name__ == '__main__':
  main()
