"""Duo / UDLM on OpenWebText: uniform-state diffusion, GPT-2 tokens, L = 1024.

Paper: Sahoo et al. 2025, "The Diffusion Duality" (Duo, arXiv 2506.10892),
OWT validation perplexity bounds after 1M steps: Duo <= 25.20 and UDLM
<= 27.43, against MDLM <= 23.21 and AR 17.54 (as reported; not reproduced
here). Recipe (s-sahoo/duo `scripts/train_owt_duo.sh`): MDLM's OWT data and
12 x 768 model (the suite's `mdlm_owt.py`), uniform-state process, log-linear
schedule, continuous-time NELBO, time conditioning; curriculum for the first
500,000 of 1,000,000 steps with tau = 1e-3 and gamma in [-3.55, -1.85].
Sampling in Duo ch. II (Psi-samplers): 256 steps, eta 0.01, nucleus 0.9,
`--config.sample.sampler='psi:kappa=max_capped_eta,eta=0.01,top_p=0.9'`.

Sized for: mdlm_owt.py's v5p-64 slice (32 chips, 16 sequences per chip);
169M parameters (adaLN time conditioning), ~4.5e14 FLOPs per step by the
closed form (the compiled count, 6.9e14, adds the curriculum's work over
the vocabulary and counts both branches of its lax.cond, of which one
runs); the CPU plan puts 62 GiB
on each chip (docs/LAUNCH.md section 7). ``model.remat=True`` does not
trace for Duo yet (the curriculum calls the network under lax.cond).

Launch:
  python -m experiments.run --config=experiments/configs/duo_owt.py \
    --workdir=$HOME/runs/duo_owt

Variants: `duo_owt.py:udlm` (no curriculum); `duo_owt.py:smoke`,
`duo_owt.py:udlm,smoke` (seconds on CPU on the OWT fixture).
"""

from experiments.configs import common, duo_lm1b, mdlm_owt

SMOKE_ARG = 'smoke'


def get_config(arg: str = ''):
  udlm, preset = common.parse_arg(arg, *duo_lm1b.ARGS)
  curriculum = not udlm
  c = mdlm_owt.get_config(preset)
  steps = c.train.num_steps
  common.uniform(c, curriculum_steps=steps // 2 if curriculum else 0)
  if curriculum:
    c.process.gamma_min = -3.55
    c.process.gamma_max = -1.85
  return c
