//! How long to wait before the next attempt to reach the control plane.
//!
//! A stream that broke waits a jittered exponential delay (`XDS_CLIENT_BACKOFF_*`:
//! initial, doubling up to max, each spread by ±random factor when jitter is on), so a
//! fleet of replicas that lost the control plane together does not return in step.
//! upstream hands these settings to jpillora/backoff, whose `Factor` is the growth
//! factor; with its default of 0.5 that library never grows past the initial delay.
//! tollgate doubles, and reads the factor as the spread its name says. A control plane
//! that cannot be dialled at all is tried again every
//! `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, spread by half, as upstream's
//! linear retry does.

use std::time::Duration;

use crate::settings::xds::Backoff;

/// The delays of one run of failures; [`Retry::reset`] after a success.
#[derive(Debug)]
pub struct Retry {
    settings: Backoff,
    attempt: u32,
}

impl Retry {
    pub fn new(settings: Backoff) -> Self {
        Self {
            settings,
            attempt: 0,
        }
    }

    /// The next wait after a broken stream.
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .settings
            .initial
            .saturating_mul(1_u32 << self.attempt.min(20))
            .min(self.settings.max);
        self.attempt = self.attempt.saturating_add(1);
        if self.settings.jitter {
            spread(base, self.settings.random_factor).min(self.settings.max)
        } else {
            base
        }
    }

    /// A response arrived: the next failure starts from the initial delay again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// `delay` spread uniformly over ±`factor` of itself. Saturates instead of panicking
/// as `Duration::mul_f64` would past `Duration::MAX` (the settings cap the intervals,
/// but this runs inside the xDS task, where a panic would go unseen).
pub fn spread(delay: Duration, factor: f64) -> Duration {
    let factor = if factor.is_nan() {
        0.0
    } else {
        factor.clamp(0.0, 1.0)
    };
    let scale = 1.0 + factor * (2.0 * fastrand::f64() - 1.0);
    Duration::try_from_secs_f64(delay.as_secs_f64() * scale.max(0.0)).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(jitter: bool) -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            random_factor: 0.5,
            jitter,
        }
    }

    #[test]
    fn doubles_up_to_the_max_and_starts_over_after_a_reset() {
        let mut retry = Retry::new(backoff(false));
        let delays: Vec<u128> = (0..6).map(|_| retry.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        retry.reset();
        assert_eq!(retry.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn huge_delays_saturate_instead_of_panicking() {
        let mut retry = Retry::new(Backoff {
            initial: Duration::MAX,
            max: Duration::MAX,
            random_factor: 1.0,
            jitter: true,
        });
        for _ in 0..50 {
            retry.next_delay();
        }
        assert_eq!(spread(Duration::MAX, 0.0), Duration::MAX);
        assert_eq!(
            spread(Duration::from_secs(2), f64::NAN),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn jitter_stays_within_the_factor_and_varies() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let mut retry = Retry::new(backoff(true));
            let d = retry.next_delay();
            assert!(
                (Duration::from_millis(50)..=Duration::from_millis(150)).contains(&d),
                "{d:?}"
            );
            seen.insert(d);
        }
        assert!(seen.len() > 10, "jitter spreads the delays");
    }
}
