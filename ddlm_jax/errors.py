"""The library's error types, importable from every layer.

Each is also importable from the module that raises it; they live here so
that a foundation module (a tokenizer, a model config) can raise them and
`training.faults` can map every one to its exit code without importing the
modules that raise them.
"""


class ConfigError(ValueError):
  """A config value outside its allowed range; names the key and the fix."""


class CorruptFileError(ValueError):
  """A file the run needs exists but cannot be parsed (named in the text)."""


class AllCheckpointsCorruptError(ValueError):
  """Checkpoints exist but none can be restored; no silent fresh start."""


class NoCheckpointError(FileNotFoundError):
  """A run directory without a checkpoint to restore."""


class CheckpointSaveError(RuntimeError):
  """Writing a checkpoint failed; the previous checkpoints are untouched."""


class WorkdirLockedError(RuntimeError):
  """Another live process holds the workdir's lock."""
