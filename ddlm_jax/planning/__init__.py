"""DDLM planner -> ARM executor collaboration (arXiv 2510.15244).

``layout`` fixes the planner's and executor's token fields, ``models`` the
backbone configs, the projector and soft-token injection, ``conditional``
the question-conditioned MDLM loss and plan sampling, ``pipelines`` the four
pipelines (direct, cot, text, latent) with their cost accounting, and
``trainer`` the resumable trainers and ``run_planner_executor``, which
``experiments.run`` calls for experiments/configs/planner_executor.py.
"""

from ddlm_jax.planning.pipelines import PIPELINES, PipelineSpec, make_runner
from ddlm_jax.planning.trainer import run_planner_executor

__all__ = ['PIPELINES', 'PipelineSpec', 'make_runner', 'run_planner_executor']
