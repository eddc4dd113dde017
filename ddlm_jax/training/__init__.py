"""Training: state, optimizer, steps, checkpoints, metrics, loop."""
