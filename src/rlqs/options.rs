//! The RLQS server's timing and bounds, resolved by `settings` (`--rlqs-*` flags).
//! The defaults follow what Envoy 1.40 does, not what the proto promises: it reports
//! every bucket every 5 s whatever `reporting_interval` says (and sends an empty
//! report every 5 s when it has no bucket), and it restarts an assignment's TTL at
//! every answer.

use std::time::Duration;

use super::budget::STREAM_BYTES;
use super::claims::Timing;

/// How long an answer may take to reach its Envoy, as the ledger counts it: an
/// assignment's tokens stay held this long past its TTL, and tokens given back are
/// reused only this long after (the answer lowering a share is still on its way).
pub const DELIVERY_MARGIN: Duration = Duration::from_secs(2);

/// Timing and bounds of the quota service.
#[derive(Debug, Clone, PartialEq)]
pub struct RlqsOptions {
    /// How often Envoy reports each bucket (Envoy 1.40: 5 s, fixed).
    pub report_period: Duration,
    /// How long an assignment holds in Envoy: several report periods, so Envoys keep
    /// limiting on their last shares through a tollgate restart or a lost stream.
    pub assignment_ttl: Duration,
    /// A stream's claim on a bucket is dropped when it has not reported it this long
    /// (its share goes to the others): a stream that died without closing.
    pub stale_after: Duration,
    /// A bucket with no requests for this long is abandoned: Envoy forgets it and a
    /// new request subscribes again.
    pub abandon_after: Duration,
    /// Concurrent RLQS streams (one per Envoy and domain).
    pub max_streams: usize,
    /// Buckets one stream may hold.
    pub max_buckets_per_stream: usize,
    /// Bytes of one `BucketId` (keys and values together).
    pub max_bucket_id_bytes: usize,
    /// Bucket reports in one message.
    pub max_reports_per_message: usize,
    /// Streams on one connection (one peer address and port).
    pub max_streams_per_peer: usize,
    /// Bytes all RLQS state in this process may take (`rlqs::budget`).
    pub max_bytes: u64,
    /// A stream that sends nothing this long is closed (Envoy sends a report every
    /// report period, even with no bucket).
    pub idle_after: Duration,
    /// Every rule in shadow mode (`--shadow-mode`, `SHADOW_MODE`): buckets are allowed.
    pub global_shadow_mode: bool,
}

impl Default for RlqsOptions {
    fn default() -> Self {
        Self {
            report_period: Duration::from_secs(5),
            assignment_ttl: Duration::from_secs(30),
            stale_after: Duration::from_secs(15),
            abandon_after: Duration::from_secs(300),
            max_streams: 10_000,
            max_buckets_per_stream: 1_000,
            max_bucket_id_bytes: 1_024,
            max_reports_per_message: 1_000,
            max_streams_per_peer: 100,
            max_bytes: 256 * 1024 * 1024,
            idle_after: Duration::from_secs(30),
            global_shadow_mode: false,
        }
    }
}

impl RlqsOptions {
    /// The ledger's clock (`claims::Timing`).
    pub fn timing(&self) -> Timing {
        let ms = |d: Duration| d.as_millis() as u64;
        Timing {
            stale_ms: ms(self.stale_after),
            hold_ms: ms(self.assignment_ttl + DELIVERY_MARGIN),
            grace_ms: ms(DELIVERY_MARGIN),
        }
    }

    /// Why these options cannot work together, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.report_period < Duration::from_secs(1) {
            return Err("--rlqs-report-period-secs: must be at least 1".into());
        }
        if self.assignment_ttl < self.report_period * 2 {
            return Err(
                "--rlqs-assignment-ttl-secs: must cover at least two report periods, or Envoys stop limiting between reports"
                    .into(),
            );
        }
        if self.stale_after < self.report_period * 2 {
            return Err("--rlqs-stale-after-secs: must cover at least two report periods".into());
        }
        if self.idle_after < self.report_period * 2 {
            return Err("--rlqs-idle-stream-secs: must cover at least two report periods".into());
        }
        if self.max_bytes < STREAM_BYTES {
            return Err(format!(
                "--rlqs-max-bytes: must be at least {STREAM_BYTES} (one stream)"
            ));
        }
        for (value, name) in [
            (self.max_streams, "--rlqs-max-streams"),
            (self.max_streams_per_peer, "--rlqs-max-streams-per-peer"),
            (self.max_buckets_per_stream, "--rlqs-max-buckets-per-stream"),
            (self.max_bucket_id_bytes, "--rlqs-max-bucket-id-bytes"),
            (
                self.max_reports_per_message,
                "--rlqs-max-reports-per-message",
            ),
        ] {
            if value == 0 {
                return Err(format!("{name}: must be at least 1"));
            }
        }
        Ok(())
    }
}
