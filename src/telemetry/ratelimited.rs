//! Rate-limited log events: an event that can happen on every request (a shadow-mode
//! limit exceeded, a fallback answer, a tarpit hold, the breaker opening) is logged at
//! most once a [`PERIOD_MS`] per cause (the event and its domain or rule), and each
//! line says how many of the same cause were suppressed since the previous one.
//!
//! The one mechanism for all of them: a fixed table of slots, each owning one cause
//! (by a 64-bit hash of its parts) with the instant of its last line and a suppressed
//! count. A suppressed event costs a hash of a few short strings, an atomic load and
//! an atomic add: no lock, no allocation. Causes come from the config (domains, rule
//! paths) and the store's own names, so they are few; should the table ever fill,
//! the rest share one overflow slot, still at most one line a period.

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::{Clock, SystemClock};

/// At most one line per cause in this many milliseconds.
pub const PERIOD_MS: u64 = 1000;

/// Slots of the process-wide table (a power of two).
const SLOTS: usize = 256;

/// How far a cause looks past its home slot for its own or a free one.
const PROBES: usize = 8;

/// One cause: which (0 is free), its last line and the events suppressed since.
struct Slot {
    cause: AtomicU64,
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Slot {
    // Only ever copied into the tables below as their initial value, never shared.
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: Slot = Slot {
        cause: AtomicU64::new(0),
        last_ms: AtomicU64::new(0),
        suppressed: AtomicU64::new(0),
    };

    /// `Some(suppressed since the last line)` when this event is to be logged.
    fn admit(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        // `last == 0`: never logged, whatever the clock says (tests start at 0).
        let due = last == 0 || now_ms.saturating_sub(last) >= PERIOD_MS;
        // Of several racing callers, the one that moves `last_ms` logs.
        if due
            && self
                .last_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// A table of causes, each logged at most once a period. Tests make their own with an
/// injected clock; the request path uses [`admit`] on the process-wide one.
pub struct LogGate {
    slots: [Slot; SLOTS],
    /// Shared by the causes that found no slot of their own.
    overflow: Slot,
}

impl Default for LogGate {
    fn default() -> Self {
        Self::new()
    }
}

impl LogGate {
    pub const fn new() -> Self {
        Self {
            slots: [Slot::FREE; SLOTS],
            overflow: Slot::FREE,
        }
    }

    /// Whether the event of `cause` (its parts, e.g. `["shadow_exceeded", domain,
    /// rule]`) is logged at `now_ms`: `Some(n)` with the `n` events of that cause
    /// suppressed since its last line, or `None` (the event is counted instead).
    pub fn admit_at(&self, cause: &[&str], now_ms: u64) -> Option<u64> {
        self.slot(hash(cause)).admit(now_ms)
    }

    fn slot(&self, cause: u64) -> &Slot {
        let home = cause as usize;
        for probe in 0..PROBES {
            let slot = &self.slots[(home + probe) % SLOTS];
            let owner = slot.cause.load(Ordering::Relaxed);
            if owner == cause {
                return slot;
            }
            if owner == 0 {
                match slot
                    .cause
                    .compare_exchange(0, cause, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return slot,
                    // Another thread claimed it just now, maybe for this very cause.
                    Err(winner) if winner == cause => return slot,
                    Err(_) => continue,
                }
            }
        }
        &self.overflow
    }
}

/// The process-wide gate the request path logs through.
static GATE: LogGate = LogGate::new();

/// [`LogGate::admit_at`] on the process-wide gate, now.
pub fn admit(cause: &[&str]) -> Option<u64> {
    GATE.admit_at(cause, SystemClock.now_millis())
}

/// FNV-1a over the parts, each followed by a separator byte (so `["ab", "c"]` and
/// `["a", "bc"]` differ); never 0, which marks a free slot.
fn hash(parts: &[&str]) -> u64 {
    let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
    for part in parts {
        hasher.write(part.as_bytes());
        hasher.write(&[0xff]);
    }
    hasher.finish().max(1)
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_cause_per_period_carrying_the_suppressed_count() {
        let gate = LogGate::new();
        let cause = ["shadow_exceeded", "api", "api.user"];
        assert_eq!(gate.admit_at(&cause, 5_000), Some(0));
        for ms in 5_001..5_300 {
            assert_eq!(gate.admit_at(&cause, ms), None);
        }
        // Another cause in the same millisecond has its own line.
        assert_eq!(
            gate.admit_at(&["shadow_exceeded", "api", "api.ip"], 5_300),
            Some(0)
        );
        assert_eq!(gate.admit_at(&cause, 5_999), None);
        assert_eq!(gate.admit_at(&cause, 6_000), Some(300));
        assert_eq!(gate.admit_at(&cause, 6_001), None);
        assert_eq!(gate.admit_at(&cause, 9_000), Some(1));
    }

    #[test]
    fn the_first_event_is_logged_even_at_time_zero() {
        let gate = LogGate::new();
        assert_eq!(gate.admit_at(&["a"], 0), Some(0));
        assert_eq!(gate.admit_at(&["a"], 1), None);
        assert_eq!(gate.admit_at(&["a"], 1_001), Some(1));
    }

    #[test]
    fn parts_are_separated_in_the_cause() {
        assert_ne!(hash(&["ab", "c"]), hash(&["a", "bc"]));
    }

    #[test]
    fn a_full_table_still_limits_the_lines() {
        let gate = LogGate::new();
        let names: Vec<String> = (0..SLOTS * 2).map(|i| format!("rule{i}")).collect();
        let logged = (0..3)
            .flat_map(|_| names.iter())
            .filter(|name| gate.admit_at(&["e", name], 10_000).is_some())
            .count();
        // Every cause that has a slot logs once; all the others share the overflow's one.
        assert!(logged <= SLOTS + 1, "{logged} lines");
        assert!(logged >= SLOTS / 2, "{logged} lines");
    }

    #[test]
    fn racing_threads_log_once() {
        let gate = std::sync::Arc::new(LogGate::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|_| gate.admit_at(&["race"], 50_000).is_some())
                        .count()
                })
            })
            .collect();
        let logged: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(logged, 1);
        assert_eq!(gate.admit_at(&["race"], 51_000), Some(3999));
    }
}
