//! The second look: a request denied within [`RACE_SHADOW`] after this process lost a
//! race is decided once more, by the check and the walk, after a [`SECOND_LOOK`]
//! pause. [`Shadow`] is what it remembers: when this process last lost a race.
//!
//! Why: the racers' hits are refunded within a round trip or two of their loss, and
//! a request that met them at a counter's limit was turned away by hits that are not
//! there any more. In a burst of identical requests on one limit, every one racing,
//! that made a round now and then admit one fewer than the limit. The second look is
//! one pause and one more check, for denials in a race's shadow only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::super::Cluster;
use super::tally::Path;
use super::{OrderedWalk, Request};
use crate::algorithm::Decision;
use crate::store::StoreError;

/// How long after a lost race a denial is not trusted at once: the racers' refunds
/// (one round trip each, sent as their replies arrive) land well within it.
pub const RACE_SHADOW: Duration = Duration::from_millis(100);
/// The pause before a denial in a race's shadow is decided once more.
pub const SECOND_LOOK: Duration = Duration::from_millis(5);

/// The second look: a denial in a lost race's shadow decided once more, by
/// [`OrderedWalk::after_check`], after a pause that still leaves the request within
/// its deadline (a request without the time answers with its first denial).
///
/// Invariant: never over-admits, and under-admission only narrows. The first answer
/// was a denial, and a denied request has given back what it took (the walk and the
/// race refund what their groups consumed), so deciding it again is deciding a fresh
/// request: the walk's guarantees hold for it, and a counter at its limit denies it
/// again. It admits only where the counters have room now, once the racers' refunds
/// have landed.
///
/// Measured: the burst of [`super::Race`] (300 identical 2-group requests at once over
/// 3 replicas on limit 100, two thirds of them losing the race) admitted 99 in about
/// one round in 50 without it (a walker met a racer's hit at the limit); with it, 100
/// in each of 75 rounds (15 runs), Redis holding exactly what was admitted. It narrows
/// the window, it does not close it: a denial can still meet a hit of another
/// replica's race that outlives the pause (without the second look, one run in about
/// four of the same burst admitted 97-99). The residual error is one of
/// under-admission, never over (`tests/it/cross_slot.rs`).
pub(super) struct SecondLook<'c>(pub(super) &'c Cluster);

impl SecondLook<'_> {
    /// `first`, the request's first answer, or the answer of a second look when it was
    /// a denial in a race's shadow.
    pub(super) async fn decide(
        self,
        req: Request<'_>,
        first: Vec<Decision>,
    ) -> Result<Vec<Decision>, StoreError> {
        let cluster = self.0;
        let denied = first
            .iter()
            .zip(req.ops)
            .any(|(d, op)| op.vetoes && !d.allowed);
        if !denied || !cluster.shadow.covers_now() {
            return Ok(first);
        }
        let pause = Instant::now() + SECOND_LOOK;
        if pause >= req.deadline {
            return Ok(first);
        }
        tokio::time::sleep_until(pause).await;
        cluster.paths.count(Path::SecondLook);
        OrderedWalk(cluster).after_check(req).await
    }
}

/// When this process last lost a race: the shadow a denial is looked at twice in.
pub struct Shadow {
    /// When, in ms since `epoch` (0: never).
    lost_race_ms: AtomicU64,
    epoch: std::time::Instant,
}

impl Default for Shadow {
    fn default() -> Self {
        Self {
            lost_race_ms: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }
}

impl Shadow {
    /// This process lost a race now.
    pub fn cast(&self) {
        // +1: 0 means never.
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.lost_race_ms.store(now, Ordering::Relaxed);
    }

    /// Whether a race was lost less than [`RACE_SHADOW`] ago.
    fn covers_now(&self) -> bool {
        let last = self.lost_race_ms.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        last != 0 && now.saturating_sub(last) < RACE_SHADOW.as_millis() as u64
    }
}
