//! Fixed windows are aligned to the Unix epoch (tollgate reads Redis's clock, on this
//! same machine). A scenario that straddled a boundary would see its counters reset
//! half-way, so [`Window::with_room`] starts it only with enough of every relevant
//! window left, waiting for the next window otherwise, and [`Window::assert_same`]
//! checks afterwards that it did finish inside the window it started in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
}

/// The windows a scenario started in.
pub struct Window {
    windows: Vec<u64>,
    started: Vec<u64>,
}

impl Window {
    /// Waits (at most `needed`) until at least `needed` is left in each window of
    /// `windows` (lengths in seconds), and notes which windows those are.
    pub fn with_room(windows: &[u64], needed: Duration) -> Window {
        for &window in windows {
            let length = Duration::from_secs(window);
            let into = now().as_nanos() % length.as_nanos();
            let left = length - Duration::from_nanos(into as u64);
            if left < needed {
                // A little past the boundary, so the new window has begun in Redis too.
                std::thread::sleep(left + Duration::from_millis(200));
            }
        }
        let started = windows.iter().map(|w| now().as_secs() / w).collect();
        Window {
            windows: windows.to_vec(),
            started,
        }
    }

    /// Seconds left in the current `window`-second window (1..=window): what tollgate
    /// reports as `duration_until_reset`.
    pub fn seconds_left(window: u64) -> u64 {
        window - now().as_secs() % window
    }

    /// Panics if a boundary of any window has passed since [`Window::with_room`].
    pub fn assert_same(&self) {
        for (w, started) in self.windows.iter().zip(&self.started) {
            assert_eq!(
                now().as_secs() / w,
                *started,
                "the scenario crossed a {w}s window boundary: slower than its time budget"
            );
        }
    }
}
