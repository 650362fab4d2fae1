//! Global rules simulated end to end in one process, on clocks the test moves: three
//! regions, each a limiter on a memory store of its own (its "Redis", whose clock is
//! skewed from its host's by up to 200 ms of the 250 allowed) with its ledger client,
//! all on one memory ledger. Random demand, reports on time or early, ledger
//! partitions per region, a region killed: in every window, as each region's store
//! counts it, the regions together admit at most the limit; and with the ledger
//! reachable, nearly all of min(demand, limit). The live test with real Redis servers
//! and `tollgate serve` processes is `global_regions.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tollgate::clock::ManualClock;
use tollgate::global::ledger::memory::MemoryLedger;
use tollgate::global::ledger::{Ledger, LedgerError, LedgerFuture, Swap, Swapped};
use tollgate::global::sync::Client;
use tollgate::global::{Global, GlobalOptions};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::memory::MemoryStore;

use crate::common::server::{config, descriptor, request};

/// One region's view of the shared ledger, which the test can cut.
struct Link {
    ledger: Arc<MemoryLedger>,
    cut: AtomicBool,
}

impl Link {
    fn check(&self) -> Result<(), LedgerError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(LedgerError::Unavailable("partitioned (test)".into()));
        }
        Ok(())
    }
}

impl Ledger for Link {
    fn read<'a>(&'a self, keys: &'a [String]) -> LedgerFuture<'a, Vec<Option<String>>> {
        Box::pin(async move {
            self.check()?;
            self.ledger.read(keys).await
        })
    }

    fn swap<'a>(&'a self, swaps: &'a [Swap]) -> LedgerFuture<'a, Vec<Swapped>> {
        Box::pin(async move {
            self.check()?;
            // A partition may also fall between the swap and its answer.
            let done = self.ledger.swap(swaps).await?;
            self.check()?;
            Ok(done)
        })
    }

    fn kind(&self) -> &'static str {
        "test"
    }
}

struct Region {
    host: Arc<ManualClock>,
    redis: Arc<ManualClock>,
    /// This region's Redis clock minus its host's, in ms.
    skew: i64,
    limiter: Limiter,
    global: Arc<Global>,
    client: Client,
    link: Arc<Link>,
    alive: bool,
    /// Share of the demand it gets.
    weight: u64,
}

const PERIOD_MS: u64 = 2_000;
const TICK_MS: u64 = 100;

fn region(name: &str, ledger: &Arc<MemoryLedger>, skew: i64, weight: u64, yaml: &str) -> Region {
    let host = Arc::new(ManualClock::new(0));
    let redis = Arc::new(ManualClock::new(0));
    let store = Arc::new(MemoryStore::with_clock(redis.clone()));
    let link = Arc::new(Link {
        ledger: ledger.clone(),
        cut: AtomicBool::new(false),
    });
    let options = GlobalOptions {
        report_period: std::time::Duration::from_millis(PERIOD_MS),
        ..GlobalOptions::for_region(name)
    };
    let (global, client) = Global::build(options, store.clone(), link.clone(), host.clone());
    let limiter = Limiter::new(
        config(yaml),
        store,
        LimiterOptions {
            global: Some(global.table.clone()),
            ..LimiterOptions::default()
        },
    );
    Region {
        host,
        redis,
        skew,
        limiter,
        global,
        client,
        link,
        alive: true,
        weight,
    }
}

impl Region {
    fn set_time(&self, t: u64) {
        self.host.set_millis(t);
        self.redis.set_millis(t.saturating_add_signed(self.skew));
    }
}

const WINDOW_YAML: &str = "domain: api\ndescriptors:\n  - key: tenant\n    global: true\n    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1000}\n";

/// What one run saw per window (by the deciding store's clock): admitted and
/// offered, summed over regions.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    admitted: u64,
    offered: u64,
}

/// How a run disturbs the regions.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Plot {
    /// Steady demand, the ledger always reachable.
    Calm,
    /// Links cut at random, one region killed half way.
    Chaos,
    /// Demand moves: every 25 s the weights rotate (a's 7 goes to b, and so on).
    Shifting,
}

/// Runs `seconds` of simulated traffic: `rate` requests per second in all, split by
/// weight, disturbed as `plot` says.
async fn run(
    seed: u64,
    seconds: u64,
    rate: u64,
    window_ms: u64,
    yaml: &str,
    plot: Plot,
) -> BTreeMap<u64, Tally> {
    let chaos = plot == Plot::Chaos;
    let mut rng = fastrand::Rng::with_seed(seed);
    let ledger = Arc::new(MemoryLedger::default());
    let mut regions = vec![
        region("a", &ledger, rng.i64(-200..=200), 7, yaml),
        region("b", &ledger, rng.i64(-200..=200), 2, yaml),
        region("c", &ledger, rng.i64(-200..=200), 1, yaml),
    ];
    // Start at an arbitrary instant, windows included.
    let start = 1_700_000_000_000 + rng.u64(0..window_ms);
    let mut tallies: BTreeMap<u64, Tally> = BTreeMap::new();
    let mut next_sync: Vec<u64> = regions
        .iter()
        .map(|_| start + rng.u64(0..PERIOD_MS))
        .collect();
    let weights: u64 = regions.iter().map(|r| r.weight).sum();
    let shift_every = 25_000 / TICK_MS;
    let ticks = seconds * 1000 / TICK_MS;
    for tick in 0..ticks {
        let now = start + tick * TICK_MS;
        if plot == Plot::Shifting && tick > 0 && tick % shift_every == 0 {
            let last = regions[regions.len() - 1].weight;
            for i in (1..regions.len()).rev() {
                regions[i].weight = regions[i - 1].weight;
            }
            regions[0].weight = last;
        }
        if chaos {
            for r in &regions {
                // About one partition start every 40 s per region, lasting ~10 s.
                let cut = r.link.cut.load(Ordering::SeqCst);
                if (!cut && rng.u64(0..400) == 0) || (cut && rng.u64(0..100) == 0) {
                    r.link.cut.store(!cut, Ordering::SeqCst);
                }
            }
            if tick == ticks / 2 {
                let victim = rng.usize(0..regions.len());
                regions[victim].alive = false;
            }
        }
        for (i, r) in regions.iter().enumerate() {
            if !r.alive {
                continue;
            }
            r.set_time(now);
            // Requests this tick: the region's part of `rate`, rounded at random.
            let mean_milli = rate * r.weight * TICK_MS / weights;
            let n = mean_milli / 1000 + u64::from(rng.u64(0..1000) < mean_milli % 1000);
            for _ in 0..n {
                let w = (now.saturating_add_signed(r.skew)) / window_ms;
                let req = request("api", vec![descriptor(&[("tenant", "acme")])]);
                let answer = r.limiter.should_rate_limit(&req).await.expect("decided");
                let tally = tallies.entry(w).or_default();
                tally.offered += 1;
                if answer.overall_code == Code::Ok as i32 {
                    tally.admitted += 1;
                }
            }
            // On time, or early when a request was denied (at most once a tick here).
            if now >= next_sync[i] || rng.u64(0..10) == 0 {
                r.client.sync_once().await;
                if now >= next_sync[i] {
                    next_sync[i] = now + PERIOD_MS;
                }
            }
        }
    }
    if std::env::var("SIM_DEBUG").is_ok() {
        for r in &regions {
            eprintln!("{}", serde_json::to_string(&r.global.view()).unwrap());
        }
        eprintln!("{tallies:?}");
    }
    tallies
}

/// No window ever admits more than the limit, whatever the partitions and the kill;
/// checked over several seeds (each run is deterministic).
#[tokio::test]
async fn no_window_admits_more_than_the_limit_through_partitions_and_a_kill() {
    for seed in 1..=4 {
        let tallies = run(seed, 120, 150, 10_000, WINDOW_YAML, Plot::Chaos).await;
        assert!(tallies.len() >= 12, "seed {seed}: {tallies:?}");
        for (w, t) in &tallies {
            assert!(
                t.admitted <= 1000,
                "seed {seed}, window {w}: {} admitted of 1000",
                t.admitted
            );
        }
    }
}

/// With the ledger reachable and demand above the limit (150/s against 100/s, split
/// 70:20:10), every full window after the first two admits at least 95% of the
/// limit.
#[tokio::test]
async fn with_the_ledger_reachable_nearly_the_whole_limit_is_admitted() {
    let tallies = run(7, 80, 150, 10_000, WINDOW_YAML, Plot::Calm).await;
    let full: Vec<(&u64, &Tally)> = tallies.iter().skip(2).take(5).collect();
    assert_eq!(full.len(), 5, "{tallies:?}");
    for (w, t) in full {
        assert!(t.admitted <= 1000, "window {w}: {t:?}");
        assert!(t.admitted >= 950, "window {w}: {t:?}");
    }
}

/// Demand that moves between regions every 25 s (150/s against 100/s, 70:20:10
/// rotating): the shares follow through releases, and each window after the first
/// two still admits at least 90% of the limit (a shift costs the window it happens
/// in a little, the holder releasing at its next report).
#[tokio::test]
async fn shares_follow_demand_that_moves_between_regions() {
    let tallies = run(21, 110, 150, 10_000, WINDOW_YAML, Plot::Shifting).await;
    let full: Vec<(&u64, &Tally)> = tallies.iter().skip(2).take(8).collect();
    assert_eq!(full.len(), 8, "{tallies:?}");
    for (w, t) in full {
        assert!(t.admitted <= 1000, "window {w}: {t:?}");
        assert!(t.admitted >= 900, "window {w}: {t:?} in {tallies:?}");
    }
}

const BUCKET_YAML: &str = "domain: api\ndescriptors:\n  - key: tenant\n    global: true\n    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1000, algorithm: token_bucket, burst: 100}\n";

/// A token bucket divides its rate the same way: per epoch of W, the regions admit at
/// most L + B + R (the bound docs/global.md states), through partitions and a kill.
#[tokio::test]
async fn a_divided_bucket_admits_at_most_its_rate_plus_the_bursts_per_epoch() {
    for seed in 11..=13 {
        let tallies = run(seed, 120, 150, 10_000, BUCKET_YAML, Plot::Chaos).await;
        for (w, t) in &tallies {
            assert!(
                t.admitted <= 1000 + 100 + 3,
                "seed {seed}, epoch {w}: {t:?}"
            );
        }
    }
}
