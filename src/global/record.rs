//! What the ledger keeps for one global counter: per window, each region's grant,
//! what it released and what it reported using; per region, each replica's demand.
//! Stored as one JSON value per counter, rewritten whole by a compare-and-swap
//! (`ledger/`), so a division ([`super::divide`]) always starts from one consistent
//! record.
//!
//! The invariant every stored record keeps, per window: the regions' effective
//! shares (granted minus released) sum to at most the window's limit ([`Record::holds`]).
//! A region's counter never admits more than its grant (every request of the region
//! decides with a limit no larger than the grant), and what it released it consumed
//! on its own counter first, so it admits at most its effective share: the regions
//! together admit at most the limit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One counter's division, as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// W, in milliseconds (the counter's, so equal in every region).
    pub window_ms: u64,
    /// `window` or `rate` (`algorithm::Division`), for `inspect`.
    pub division: String,
    /// When the first report made it (ms since the epoch).
    #[serde(default)]
    pub born_ms: u64,
    /// The windows with grants, by index (`window::index`).
    pub windows: BTreeMap<u64, Window>,
    /// Regions that reported, by name.
    pub regions: BTreeMap<String, Region>,
}

/// One window's division.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// L for this window: the limit of the replica that first reported it (a config
    /// changed in one region applies to the windows created after it).
    pub limit: u64,
    /// Each region's share of it.
    pub shares: BTreeMap<String, Share>,
}

/// One region's share of one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// Granted so far: only grows. The region's requests decide with at most this.
    pub granted: u64,
    /// Given back: consumed on the region's own counter, then counted here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub released: u64,
    /// Admitted in the window as last reported (the counter's count, less what was
    /// released): a region is never asked to give back below it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub used: u64,
    /// A release asked of one replica and not yet reported done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

/// A release one replica was asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// Names the request, so the replica's report of it counts once.
    pub id: String,
    /// Tokens to give back.
    pub amount: u64,
    /// Past this instant (ms) the request lapses: a release reported later is not
    /// counted (the region consumed it all the same, so it only admits less).
    pub until_ms: u64,
}

/// One region's reporters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// Each replica's demand, by replica id.
    pub replicas: BTreeMap<String, Demand>,
}

/// Requests per second one replica saw (admitted and denied), and when it said so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    pub rate: f64,
    pub at_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Share {
    /// What the region may still admit in all: granted less released.
    pub fn effective(&self) -> u64 {
        self.granted.saturating_sub(self.released)
    }
}

impl Window {
    /// The effective shares' sum.
    pub fn held(&self) -> u64 {
        self.shares.values().map(Share::effective).sum()
    }

    /// What no region holds.
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.held())
    }
}

impl Record {
    /// The invariant: in every window, no region released more than it was granted,
    /// and the effective shares sum to at most the limit.
    pub fn holds(&self) -> bool {
        self.windows
            .values()
            .all(|w| w.shares.values().all(|s| s.released <= s.granted) && w.held() <= w.limit)
    }

    /// `region`'s demand: the sum over its replicas heard since `fresh_since_ms`;
    /// `None` when none was.
    pub fn demand(&self, region: &str, fresh_since_ms: u64) -> Option<f64> {
        let replicas = &self.regions.get(region)?.replicas;
        let fresh: Vec<f64> = replicas
            .values()
            .filter(|d| d.at_ms >= fresh_since_ms)
            .map(|d| d.rate.max(0.0))
            .collect();
        (!fresh.is_empty()).then(|| fresh.iter().sum())
    }

    /// The record as stored.
    pub fn encode(&self) -> String {
        // A map of numbers and strings always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A stored record; an error names what was wrong.
    pub fn decode(text: &str) -> Result<Record, String> {
        serde_json::from_str(text).map_err(|e| format!("not a global ledger record: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(granted: u64, released: u64) -> Share {
        Share {
            granted,
            released,
            ..Share::default()
        }
    }

    #[test]
    fn the_invariant_counts_effective_shares() {
        let mut record = Record::default();
        let mut window = Window {
            limit: 100,
            ..Window::default()
        };
        window.shares.insert("a".into(), share(80, 30));
        window.shares.insert("b".into(), share(50, 0));
        record.windows.insert(7, window);
        assert!(record.holds());
        assert_eq!(record.windows[&7].free(), 0);
        record
            .windows
            .get_mut(&7)
            .unwrap()
            .shares
            .get_mut("a")
            .unwrap()
            .released = 29;
        assert!(!record.holds(), "101 held of 100");
    }

    #[test]
    fn records_round_trip_and_garbage_is_named() {
        let mut record = Record {
            window_ms: 60_000,
            division: "window".into(),
            ..Record::default()
        };
        record.windows.entry(3).or_default().limit = 10;
        record
            .regions
            .entry("eu".into())
            .or_default()
            .replicas
            .insert(
                "eu-1".into(),
                Demand {
                    rate: 1.5,
                    at_ms: 9,
                },
            );
        assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        assert!(Record::decode("{").unwrap_err().contains("ledger record"));
        assert_eq!(record.demand("eu", 9), Some(1.5));
        assert_eq!(record.demand("eu", 10), None);
    }
}
