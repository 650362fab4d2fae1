//! Which strategy each multi-group request took ([`CrossSlotPaths`]), counted by the
//! dispatch and the strategies as they go, so that tests and benchmarks assert the
//! path a request took rather than its timing.

use std::sync::atomic::{AtomicU64, Ordering};

/// How the multi-group requests this store decided went; for tests and benchmarks.
/// A single group and a dry run are not counted: each has one way to go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrossSlotPaths {
    /// Raced (`Race`, `strategy/race.rs`) after fresh hints showed the margins (no
    /// check).
    pub hinted: u64,
    /// Raced without a check because some counter had no fresh reading
    /// (see `Reading::Cold` in `cluster/headroom.rs`).
    pub cold: u64,
    /// Raced after the check showed the margins.
    pub checked: u64,
    /// Raced, a group denied: refunded, then walked in order.
    pub fell_back: u64,
    /// Walked in order (`OrderedWalk`, `strategy/walk.rs`) because some counter was
    /// within its margin.
    pub ordered: u64,
    /// Denied by the check, nothing consumed.
    pub denied: u64,
    /// Denied soon after a lost race, and decided once more (`SecondLook`,
    /// `strategy/second_look.rs`).
    pub second_looks: u64,
    /// Requests (of one group or several) decided again by slot after a call to a
    /// master met a key that master does not serve (`store/redis/misroute.rs`).
    pub misrouted: u64,
}

/// One of the ways [`CrossSlotPaths`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Hinted,
    Cold,
    Checked,
    FellBack,
    Ordered,
    Denied,
    SecondLook,
    Misrouted,
}

/// The live counts behind [`CrossSlotPaths`].
#[derive(Default)]
pub struct PathCounters {
    hinted: AtomicU64,
    cold: AtomicU64,
    checked: AtomicU64,
    fell_back: AtomicU64,
    ordered: AtomicU64,
    denied: AtomicU64,
    second_looks: AtomicU64,
    misrouted: AtomicU64,
}

impl PathCounters {
    /// One more request went `path`.
    pub fn count(&self, path: Path) {
        let counter = match path {
            Path::Hinted => &self.hinted,
            Path::Cold => &self.cold,
            Path::Checked => &self.checked,
            Path::FellBack => &self.fell_back,
            Path::Ordered => &self.ordered,
            Path::Denied => &self.denied,
            Path::SecondLook => &self.second_looks,
            Path::Misrouted => &self.misrouted,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> CrossSlotPaths {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CrossSlotPaths {
            hinted: get(&self.hinted),
            cold: get(&self.cold),
            checked: get(&self.checked),
            fell_back: get(&self.fell_back),
            ordered: get(&self.ordered),
            denied: get(&self.denied),
            second_looks: get(&self.second_looks),
            misrouted: get(&self.misrouted),
        }
    }
}
