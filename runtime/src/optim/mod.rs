//! Optimisers.
