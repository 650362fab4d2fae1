//! How many script calls the batcher keeps on the wire at once, adapted to the
//! round-trip time instead of fixed.
//!
//! Redis runs scripts one at a time, so on a short path (loopback, one rack) under
//! load a second call only queues inside Redis, where it can no longer be merged with
//! what arrives meanwhile: one call in flight makes the biggest batches, and each
//! call's fixed cost (the call, TIME, one read and one write per counter) is shared by
//! the most requests (BENCHMARKS.md, "The batcher: one call in flight under load",
//! has one against two side by side). On a long path the wire itself holds calls: with a 120 ms round
//! trip and one or two in flight, a request waits for a free slot (up to one round
//! trip) and then for its own call. So the limit follows what the calls' times say,
//! the way TCP Vegas reads queueing from delay: a call that took about the fastest
//! time seen lately ([`Floor`]) did not wait behind another inside Redis, and one
//! more may go out (additive increase); a call that took over twice that did, and
//! the limit halves (multiplicative decrease), never below [`MIN`].

use std::time::{Duration, Instant};

/// The depth on a short path under load, and the least ever allowed.
pub const MIN: usize = 1;
/// The depth before any call has been timed: two, so a second request on an idle long
/// path does not wait a round trip for the first call.
const START: usize = 2;
/// Bound on calls in flight, whatever the path: each holds up to a full batch.
pub const MAX: usize = 64;
/// The fastest call is remembered for one to two of these, so a path that became
/// slower (Redis moved, a proxy added) is learnt again.
const FLOOR_WINDOW: Duration = Duration::from_secs(2);

/// The current limit on calls in flight.
#[derive(Debug)]
pub struct Depth {
    limit: usize,
    floor: Floor,
}

impl Default for Depth {
    fn default() -> Self {
        Self {
            limit: START,
            floor: Floor::default(),
        }
    }
}

impl Depth {
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes the round-trip time of one answered call, finished at `now`.
    pub fn observe(&mut self, now: Instant, rtt: Duration) {
        let floor = self.floor.update(now, rtt);
        if rtt <= floor + floor / 2 {
            self.limit = (self.limit + 1).min(MAX);
        } else if rtt > floor * 2 {
            self.limit = (self.limit / 2).max(MIN);
        }
    }
}

/// The least round-trip time of the current and the previous window.
#[derive(Debug, Default)]
struct Floor {
    started: Option<Instant>,
    current: Option<Duration>,
    previous: Option<Duration>,
}

impl Floor {
    fn update(&mut self, now: Instant, rtt: Duration) -> Duration {
        let started = *self.started.get_or_insert(now);
        if now.duration_since(started) >= FLOOR_WINDOW {
            self.previous = self.current.take();
            self.started = Some(now);
        }
        let current = self.current.map_or(rtt, |c| c.min(rtt));
        self.current = Some(current);
        self.previous.map_or(current, |p| p.min(current))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_long_steady_round_trip_opens_the_depth_up_to_the_bound() {
        let mut depth = Depth::default();
        let start = Instant::now();
        for i in 0..100 {
            depth.observe(start + MS * i, MS * 120);
        }
        assert_eq!(depth.limit(), MAX);
    }

    #[test]
    fn calls_queueing_inside_redis_bring_it_back_to_one() {
        let mut depth = Depth::default();
        let start = Instant::now();
        for i in 0..10 {
            depth.observe(start + MS * i, Duration::from_micros(100));
        }
        assert_eq!(depth.limit(), START + 10);
        // Calls now take several times the fastest: they wait behind each other.
        for i in 10..20 {
            depth.observe(start + MS * i, Duration::from_micros(450));
        }
        assert_eq!(depth.limit(), MIN);
    }

    #[test]
    fn a_slower_path_is_learnt_again_after_the_window() {
        let mut depth = Depth::default();
        let start = Instant::now();
        depth.observe(start, Duration::from_micros(100));
        // The path now takes 50 ms: queueing, by the old floor...
        depth.observe(start + MS, MS * 50);
        assert_eq!(depth.limit(), MIN);
        // ...until the old floor has left both windows.
        let mut now = start;
        for _ in 0..5 {
            now += FLOOR_WINDOW;
            depth.observe(now, MS * 50);
        }
        assert!(depth.limit() > MIN, "{depth:?}");
    }
}
