//! One limit across regions (docs/global.md). A rule marked `global: true` is decided
//! in each region's own Redis, as every rule is, against the region's share of the
//! limit; a ledger (a Redis every region reaches, `--global-ledger`) divides the
//! limit between regions by the demand each reports, every few seconds, and no
//! request waits for it.
//!
//! The parts, from a request outwards: [`table`] holds the region's grants, which
//! `limiter/plan.rs` turns into the operation's limit; [`sync`] is the ledger client
//! (each report period: [`burn`] reads the region's counters, [`exchange`] applies
//! the reports to the [`ledger`]'s records by compare-and-swap, with the division in
//! [`divide`] over the [`record`]s, and grants come back into the table); [`window`]
//! names windows and leases; [`id`] names counters in the ledger; [`status`] is the
//! link's state for health and `/global`; [`view`] what `/global` and `inspect` show.
//!
//! Exact: a region's requests decide with at most its grant, and a region gives share
//! back only by consuming it on its own counter first (`burn.rs`), so in any window
//! a region admits at most its effective share, and the ledger keeps the effective
//! shares of every window within the limit (`record.rs`). Every region names a
//! window by the same number (epoch-aligned), and near a boundary a request takes the
//! smaller of the two windows' grants, so clock skew up to `--global-clock-skew-ms`
//! between a host and its Redis cannot move a request into a window it has no share
//! of.

pub mod burn;
pub mod divide;
pub mod entry_sync;
pub mod exchange;
pub mod id;
pub mod ledger;
pub mod record;
pub mod status;
pub mod sync;
pub mod table;
pub mod view;
pub mod window;

use std::sync::Arc;
use std::time::Duration;

use self::ledger::Ledger;
use self::status::LinkStatus;
use self::sync::Client;
use self::table::Table;
use crate::background::Background;
use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;
use crate::store::Store;

/// How one replica takes part.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalOptions {
    /// `--region`: the name every replica of a region shares.
    pub region: String,
    /// This replica's own name (the region, the host, the process): its demand is
    /// kept apart from its region's other replicas'.
    pub replica: String,
    /// Prepended to every ledger key.
    pub prefix: String,
    /// How often each counter is reported.
    pub report_period: Duration,
    /// The clock skew allowed between a host and its Redis (and between regions'
    /// clocks, for the lease): near a boundary a request takes the smaller grant.
    pub skew: Duration,
    /// Global counters one replica keeps at most.
    pub max_counters: u64,
}

/// `--global-report-ms`'s default.
pub const DEFAULT_REPORT_PERIOD: Duration = Duration::from_secs(2);
/// `--global-clock-skew-ms`'s default.
pub const DEFAULT_SKEW: Duration = Duration::from_millis(250);
/// `--global-max-counters`'s default.
pub const DEFAULT_MAX_COUNTERS: u64 = 10_000;

impl GlobalOptions {
    /// A region's options with the defaults, and a replica name of this process.
    pub fn for_region(region: &str) -> Self {
        Self {
            region: region.to_owned(),
            replica: replica_name(region),
            prefix: String::new(),
            report_period: DEFAULT_REPORT_PERIOD,
            skew: DEFAULT_SKEW,
            max_counters: DEFAULT_MAX_COUNTERS,
        }
    }
}

/// `region/host/pid-random`: distinct per process, readable in `/global`.
fn replica_name(region: &str) -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    format!(
        "{region}/{host}/{}-{:04x}",
        std::process::id(),
        fastrand::u16(..)
    )
}

/// A replica's part in global rules: the table requests read, the link's status,
/// and what `/global` shows.
pub struct Global {
    pub table: Arc<Table>,
    pub status: Arc<LinkStatus>,
    pub options: GlobalOptions,
    /// Which ledger (`redis`, `memory`).
    pub ledger_kind: &'static str,
}

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Global")
            .field("region", &self.options.region)
            .field("ledger", &self.ledger_kind)
            .finish_non_exhaustive()
    }
}

impl Global {
    /// The table and its sync on `store` (the region's) and `ledger`; the sync runs
    /// until the returned task is dropped.
    pub fn start(
        options: GlobalOptions,
        store: Arc<dyn Store>,
        ledger: Arc<dyn Ledger>,
        metrics: Option<Arc<Metrics>>,
    ) -> (Arc<Global>, Background) {
        let (global, client) = Self::build(options, store, ledger, Arc::new(SystemClock));
        let client = match metrics {
            Some(m) => client.with_metrics(m),
            None => client,
        };
        (global, Background::spawn(client.run()))
    }

    /// The parts without a task: tests drive [`Client::sync_once`] on their clock.
    pub fn build(
        options: GlobalOptions,
        store: Arc<dyn Store>,
        ledger: Arc<dyn Ledger>,
        clock: Arc<dyn Clock>,
    ) -> (Arc<Global>, Client) {
        let period_ms = u64::try_from(options.report_period.as_millis()).unwrap_or(u64::MAX);
        let table = Arc::new(Table::new(
            options.max_counters,
            options.skew,
            clock.clone(),
        ));
        let status = Arc::new(LinkStatus::new(period_ms));
        let global = Arc::new(Global {
            table: table.clone(),
            status: status.clone(),
            ledger_kind: ledger.kind(),
            options: options.clone(),
        });
        let client = Client::new(table, store, ledger, options, status, clock);
        (global, client)
    }

    /// The line `/healthcheck` adds while the ledger is cut off.
    pub fn health_detail(&self) -> Option<String> {
        let now = self.table.now_ms();
        let held_until = self
            .table
            .entries()
            .iter()
            .filter_map(|e| {
                let last = e
                    .grants()
                    .iter()
                    .filter(|(_, g)| *g > 0)
                    .map(|(w, _)| *w)
                    .max()?;
                Some(window::end(last, e.base.window_ms))
            })
            .max();
        self.status.health_detail(now, held_until)
    }
}
