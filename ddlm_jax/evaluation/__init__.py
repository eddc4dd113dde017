"""Evaluation: likelihood bounds and sample metrics."""

from ddlm_jax.evaluation.likelihood import evaluate_likelihood, summarize_nll

__all__ = ['evaluate_likelihood', 'summarize_nll']
