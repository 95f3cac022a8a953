//! Stopping a run cleanly: the state a signal handler shares with the loop.
//!
//! The first SIGINT/SIGTERM/SIGHUP asks the loop to finish its current step
//! (or evaluation batch), write a checkpoint and return. A second one means
//! the user will not wait: the handler exits at once, saying which
//! checkpoint is the last one saved. Signals that arrive within
//! [`DUPLICATE_WINDOW`] of the first count as that first one: `timeout -s
//! INT` and process-group kills deliver one request twice, microseconds
//! apart, and must not cost the checkpoint.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Signals this soon after the first are the same request.
pub const DUPLICATE_WINDOW: Duration = Duration::from_millis(200);

/// What a signal handler should do with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// The first request: say that the run will stop after its step.
    Stop,
    /// A copy of the first request: do nothing.
    Duplicate,
    /// A second request: exit now, without saving.
    ExitNow,
}

/// The stop request shared by the loop and a signal handler.
#[derive(Debug, Default)]
pub struct Stop {
    requested: AtomicBool,
    first: Mutex<Option<Instant>>,
    last_checkpoint: Mutex<Option<PathBuf>>,
}

impl Stop {
    /// No stop requested.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the loop to stop after its current step.
    pub fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Records a signal received at `now` and says what to do about it.
    pub fn on_signal(&self, now: Instant) -> SignalAction {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        match *first {
            None => {
                *first = Some(now);
                self.request();
                SignalAction::Stop
            }
            Some(t) if now.saturating_duration_since(t) < DUPLICATE_WINDOW => {
                SignalAction::Duplicate
            }
            Some(_) => SignalAction::ExitNow,
        }
    }

    /// The newest checkpoint this process wrote.
    pub fn last_checkpoint(&self) -> Option<PathBuf> {
        self.last_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a checkpoint written (or the one a resume started from).
    pub(crate) fn checkpointed(&self, dir: &Path) {
        *self
            .last_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(dir.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_signal_exits_a_duplicate_does_not() {
        let stop = Stop::new();
        let t = Instant::now();
        assert!(!stop.is_requested());
        assert_eq!(stop.on_signal(t), SignalAction::Stop);
        assert!(stop.is_requested());
        assert_eq!(
            stop.on_signal(t + Duration::from_millis(1)),
            SignalAction::Duplicate
        );
        assert_eq!(stop.on_signal(t + DUPLICATE_WINDOW), SignalAction::ExitNow);
    }
}
