//! Checkpoints (stub).
