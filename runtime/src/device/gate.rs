//! Keeps context-wide work out of open stream captures, for processes in
//! which several threads each drive their own [`Gpu`](super::Gpu) (the
//! state-tracking reproduction trains many small runs at once).
//!
//! Opening a `Gpu` and tearing one down touch the whole device: teardown
//! destroys the cuBLAS handle, which synchronizes the device
//! (`cublasDestroy` calls `cudaDeviceSynchronize`), and unloads modules.
//! CUDA forbids synchronizing a device or context while any of its streams
//! captures, and a capture that sees it is invalidated. The capture mode
//! (`THREAD_LOCAL`, see `graph.rs`) only guards the capturing thread, so
//! one run ending while another captures its step would fail that capture.
//!
//! The gate is a readers-writer lock with no guard to carry: captures are
//! readers ([`capture_begins`] / [`capture_ends`]), opening and teardown are
//! writers ([`Exclusive`]). Writers wait for the open captures of *other*
//! threads (a thread tearing down a context inside its own capture would
//! otherwise wait for itself), and captures wait while a writer works.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

#[derive(Default)]
struct State {
    /// Captures open in the process.
    captures: usize,
    /// Openings and teardowns under way.
    writers: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    captures: 0,
    writers: 0,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// Captures open on this thread.
    static MINE: Cell<usize> = const { Cell::new(0) };
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait(guard: MutexGuard<'static, State>) -> MutexGuard<'static, State> {
    CHANGED.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// A capture is about to begin on this thread: waits while another thread
/// opens or tears down a context.
pub(super) fn capture_begins() {
    let mut s = state();
    while s.writers > 0 {
        s = wait(s);
    }
    s.captures += 1;
    MINE.with(|m| m.set(m.get() + 1));
}

/// The capture [`capture_begins`] counted has ended (also when it failed).
pub(super) fn capture_ends() {
    let mut s = state();
    s.captures = s.captures.saturating_sub(1);
    MINE.with(|m| m.set(m.get().saturating_sub(1)));
    drop(s);
    CHANGED.notify_all();
}

/// Context-wide work under way (opening or tearing down a `Gpu`): no other
/// thread's capture is open while it lives.
pub(super) struct Exclusive(());

impl Exclusive {
    /// Waits until no other thread captures, then holds captures off.
    pub(super) fn acquire() -> Self {
        let mine = MINE.with(Cell::get);
        let mut s = state();
        while s.captures > mine {
            s = wait(s);
        }
        s.writers += 1;
        Self(())
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        let mut s = state();
        s.writers = s.writers.saturating_sub(1);
        drop(s);
        CHANGED.notify_all();
    }
}

/// The first field of a `Gpu`: dropped first, it closes the gate for the
/// fields that follow.
pub(super) struct TeardownBegins;

/// The last field of a `Gpu`: dropped last, it opens the gate again.
pub(super) struct TeardownEnds;

thread_local! {
    /// The gate a teardown on this thread holds between its first and its
    /// last field.
    static HELD: Cell<Vec<Exclusive>> = const { Cell::new(Vec::new()) };
}

impl Drop for TeardownBegins {
    fn drop(&mut self) {
        let gate = Exclusive::acquire();
        HELD.with(|h| {
            let mut v = h.take();
            v.push(gate);
            h.set(v);
        });
    }
}

impl Drop for TeardownEnds {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut v = h.take();
            drop(v.pop());
            h.set(v);
        });
    }
}

impl std::fmt::Debug for TeardownBegins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TeardownBegins")
    }
}

impl std::fmt::Debug for TeardownEnds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TeardownEnds")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_writer_waits_for_other_threads_captures_but_not_its_own() {
        capture_begins();
        // Its own capture does not block this thread's teardown.
        drop(Exclusive::acquire());
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let other = s.spawn(|| {
                let _g = Exclusive::acquire();
                assert!(released.load(Ordering::SeqCst), "waited for the capture");
            });
            std::thread::sleep(Duration::from_millis(50));
            released.store(true, Ordering::SeqCst);
            capture_ends();
            other.join().unwrap();
        });
        // Teardown fields: the gate is held from the first to the last.
        let (begins, ends) = (TeardownBegins, TeardownEnds);
        drop(begins);
        assert_eq!(state().writers, 1);
        drop(ends);
        assert_eq!(state().writers, 0);
    }
}
