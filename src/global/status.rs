//! The link to the ledger, as this replica sees it: when it last answered, since
//! when it has not, and why. Cut off, a region keeps deciding on the shares it holds
//! (exact still); past the last window it holds a share of, its global rules deny.
//! [`LinkStatus::health_detail`] says so on `/healthcheck` (still SERVING: the region
//! decides), `/global` shows it, and each failure is logged at most once a second
//! (`telemetry::ratelimited`).

use std::sync::Mutex;

use serde::Serialize;

use crate::telemetry::ratelimited;

/// The link's state, as `/global` shows it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LinkState {
    /// When an exchange last succeeded (ms since the epoch).
    pub last_ok_ms: Option<u64>,
    /// Since when every exchange has failed; `None` while it answers.
    pub failing_since_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Exchanges that succeeded and failed, since start.
    pub exchanges: u64,
    pub failures: u64,
}

/// Shared between the sync and the ports.
#[derive(Debug)]
pub struct LinkStatus {
    state: Mutex<LinkState>,
    /// The report period: cut off means a few of them without an answer.
    period_ms: u64,
}

impl LinkStatus {
    pub fn new(period_ms: u64) -> Self {
        Self {
            state: Mutex::new(LinkState::default()),
            period_ms: period_ms.max(1),
        }
    }

    pub fn state(&self) -> LinkState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// An exchange succeeded at `now_ms`.
    pub fn ok(&self, now_ms: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = s.failing_since_ms.take() {
            tracing::info!(
                event = "global_ledger_back",
                cut_off_ms = now_ms.saturating_sub(since),
                "the global ledger answers again"
            );
        }
        s.last_ok_ms = Some(now_ms);
        s.exchanges += 1;
    }

    /// An exchange failed at `now_ms`.
    pub fn failed(&self, now_ms: u64, error: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let since = *s.failing_since_ms.get_or_insert(now_ms);
        s.last_error = Some(error.to_owned());
        s.failures += 1;
        drop(s);
        if let Some(suppressed) = ratelimited::admit(&["global_ledger_unreachable"]) {
            tracing::warn!(
                event = "global_ledger_unreachable",
                error,
                cut_off_ms = now_ms.saturating_sub(since),
                suppressed,
                "the global ledger does not answer: global rules decide on the shares this region holds, and deny past the last window it holds one of"
            );
        }
    }

    /// How long the ledger has not answered, once that is a few report periods.
    pub fn cut_off_ms(&self, now_ms: u64) -> Option<u64> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let since = s.failing_since_ms?;
        let for_ms = now_ms.saturating_sub(since);
        (for_ms >= 2 * self.period_ms).then_some(for_ms)
    }

    /// The line `/healthcheck` adds while cut off; `held_until_ms`: when the last
    /// window this replica holds a share of ends.
    pub fn health_detail(&self, now_ms: u64, held_until_ms: Option<u64>) -> Option<String> {
        let for_ms = self.cut_off_ms(now_ms)?;
        let error = self.state().last_error.unwrap_or_default();
        let until = match held_until_ms {
            Some(end) if end > now_ms => format!(
                "deciding on the shares held, the last for {} s more; global rules deny after it",
                (end - now_ms) / 1000
            ),
            _ => "no share held: global rules deny".to_owned(),
        };
        Some(format!(
            "global ledger unreachable for {} s ({error}): {until}",
            for_ms / 1000
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_off_after_two_periods_and_back_on_the_first_answer() {
        let status = LinkStatus::new(2_000);
        status.ok(1_000);
        status.failed(3_000, "timed out");
        assert_eq!(status.cut_off_ms(6_000), None);
        assert_eq!(status.cut_off_ms(7_000), Some(4_000));
        let detail = status.health_detail(7_000, Some(67_000)).unwrap();
        assert!(
            detail.contains("unreachable for 4 s (timed out)"),
            "{detail}"
        );
        assert!(detail.contains("60 s more"), "{detail}");
        assert!(status.health_detail(7_000, None).unwrap().contains("deny"));
        status.ok(8_000);
        assert_eq!(status.cut_off_ms(9_000), None);
        assert_eq!(status.state().failures, 1);
    }
}
