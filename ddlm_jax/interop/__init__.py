"""Converters between published checkpoint layouts and ddlm_jax parameters."""
