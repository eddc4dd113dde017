"""DDLM planner -> ARM executor collaboration (arXiv 2510.15244).

``layout`` fixes the planner's and executor's token fields, ``models`` the
backbone configs, the projector and soft-token injection, ``conditional``
the question-conditioned MDLM loss and plan sampling, and ``pipelines`` the four
pipelines (direct, cot, text, latent) with their cost accounting. Their
training and evaluation is the planner task (``ddlm_jax.tasks.planner``).
"""

from ddlm_jax.planning.pipelines import PIPELINES, PipelineSpec, make_runner

__all__ = ['PIPELINES', 'PipelineSpec', 'make_runner']
