//! How one limit divides between regions (`global: true`, `src/global/`): each
//! region decides in its own Redis on parameters made from its share of the limit,
//! so the division must be one whose shares add up to the whole. Each model states
//! its own [`Division`] (`Model::DIVISION`), and the config refuses `global: true`
//! with the model's reason where it has none.

use super::Params;

/// What a share of a limit means for one algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Division {
    /// A count per window: a region holding `s` of the window's L admits at most `s`
    /// in that window, so regions whose shares sum to at most L admit at most L
    /// together, exactly. A share can also shrink during its window: the region
    /// consumes what it gives up on its own counter first (`src/global/burn.rs`).
    Window,
    /// A rate: a region holding `s` of L refills at `s` per W, with the burst in
    /// proportion (at least 1). Shares apply per epoch of W; within an epoch a share
    /// only grows (a rate cannot be given back retroactively), so per epoch the
    /// regions admit at most L plus the sum of their bursts, which is B plus at most
    /// one per region for the rounding up (docs/global.md, "Buckets").
    Rate,
    /// No division keeps the bound; the config error gives this reason.
    Refused(&'static str),
}

impl Params {
    /// The parameters a region decides with while it holds `share` (at least 1) of
    /// `self.limit` under `division`. For [`Division::Refused`] the limit itself: the
    /// config never lets such a rule be global.
    ///
    /// A window's share is the region's grant, which may pass the limit: what a
    /// region released it consumed on its own counter, so the counter holds it, and a
    /// grant that grew again after a release is above the limit by what was released
    /// (the region still admits at most its grant less its releases).
    pub fn shared(&self, division: Division, share: u64) -> Params {
        match division {
            Division::Window => Params {
                limit: share,
                ..*self
            },
            Division::Rate => {
                let share = share.min(self.limit).max(1);
                // Rounded down, so the bursts of all regions sum to at most B plus
                // one per region that would otherwise have none.
                let burst = (u128::from(self.burst) * u128::from(share)
                    / u128::from(self.limit.max(1)))
                .max(1);
                Params {
                    limit: share,
                    burst: u64::try_from(burst).unwrap_or(self.burst),
                    ..*self
                }
            }
            Division::Refused(_) => *self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn params(limit: u64, burst: u64) -> Params {
        Params {
            algorithm: Algorithm::FixedWindow,
            limit,
            window_ms: 60_000,
            burst,
            max_delay_ms: None,
            calendar: None,
        }
    }

    #[test]
    fn a_window_share_is_the_limit_and_nothing_else() {
        let p = params(6000, 6000).shared(Division::Window, 4200);
        assert_eq!((p.limit, p.burst, p.window_ms), (4200, 6000, 60_000));
        // A grant above the limit (released share granted back): the counter holds
        // the releases, so the grant is the limit it decides with.
        assert_eq!(params(10, 10).shared(Division::Window, 99).limit, 99);
    }

    #[test]
    fn a_rate_share_takes_its_burst_in_proportion_rounded_down_at_least_one() {
        let p = params(600, 100).shared(Division::Rate, 420);
        assert_eq!((p.limit, p.burst), (420, 70));
        let tiny = params(600, 100).shared(Division::Rate, 1);
        assert_eq!((tiny.limit, tiny.burst), (1, 1));
        // Three regions' bursts never sum past B + 3.
        let shares = [301, 199, 100];
        let bursts: u64 = shares
            .iter()
            .map(|s| params(600, 7).shared(Division::Rate, *s).burst)
            .sum();
        assert!(bursts <= 7 + 3, "{bursts}");
    }
}
