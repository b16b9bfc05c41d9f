//! Checkpoints (in progress).
