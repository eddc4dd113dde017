"""The tasks trained through the one loop (`ddlm_jax.training.fit`).

Each module turns its kind of config into a `fit.Task` and the modes
around it: `language_model` (any diffusion or AR process on text),
`state_tracking` (the PD-SSM state-tracking benchmark) and `planner`
(the planner/executor pipelines, one task per stage). `training` holds the
generic machinery and never imports a task.
"""
