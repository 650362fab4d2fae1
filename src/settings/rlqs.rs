//! The quota service's (RLQS) flags: its timing and bounds, resolved into
//! [`RlqsOptions`] (checked there) with the defaults Envoy 1.40's behaviour asks for.

use std::time::Duration;

use crate::error::Error;
use crate::rlqs::RlqsOptions;

/// `tollgate serve`'s RLQS flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RlqsFlags {
    /// RLQS: how often Envoy reports each bucket, in seconds (Envoy 1.40 reports every 5 s whatever its reporting_interval says) [default: 5]
    #[arg(long, value_name = "SECONDS")]
    pub rlqs_report_period_secs: Option<u64>,
    /// RLQS: how long an assignment holds in Envoy, in seconds; several report periods, so Envoys keep limiting through a restart [default: 30]
    #[arg(long, value_name = "SECONDS")]
    pub rlqs_assignment_ttl_secs: Option<u64>,
    /// RLQS: a stream that has not reported a bucket this long loses its share to the others [default: 15]
    #[arg(long, value_name = "SECONDS")]
    pub rlqs_stale_after_secs: Option<u64>,
    /// RLQS: a bucket without requests this long is abandoned (Envoy forgets it until its next request) [default: 300]
    #[arg(long, value_name = "SECONDS")]
    pub rlqs_abandon_after_secs: Option<u64>,
    /// RLQS: concurrent streams (one per Envoy and domain) [default: 10000]
    #[arg(long, value_name = "N")]
    pub rlqs_max_streams: Option<usize>,
    /// RLQS: buckets one stream may hold [default: 1000]
    #[arg(long, value_name = "N")]
    pub rlqs_max_buckets_per_stream: Option<usize>,
    /// RLQS: bytes of one BucketId, keys and values together [default: 1024]
    #[arg(long, value_name = "BYTES")]
    pub rlqs_max_bucket_id_bytes: Option<usize>,
    /// RLQS: bucket reports in one message [default: 1000]
    #[arg(long, value_name = "N")]
    pub rlqs_max_reports_per_message: Option<usize>,
    /// RLQS: streams on one client connection (one peer address and port) [default: 100]
    #[arg(long, value_name = "N")]
    pub rlqs_max_streams_per_peer: Option<usize>,
    /// RLQS: bytes all RLQS state of this process may take (streams, their buckets, the memory ledger); past it a new stream or bucket is refused with RESOURCE_EXHAUSTED [default: 268435456]
    #[arg(long, value_name = "BYTES")]
    pub rlqs_max_bytes: Option<u64>,
    /// RLQS: a stream that sends nothing for this many seconds is closed (Envoy reports every 5 s, even with no bucket) [default: 30]
    #[arg(long, value_name = "SECONDS")]
    pub rlqs_idle_stream_secs: Option<u64>,
}

/// The options from `flags`; `shadow_mode` is the server-wide one.
pub fn resolve(flags: &RlqsFlags, shadow_mode: bool) -> Result<RlqsOptions, Error> {
    let d = RlqsOptions::default();
    let secs = |flag: Option<u64>, default: Duration| flag.map_or(default, Duration::from_secs);
    let options = RlqsOptions {
        report_period: secs(flags.rlqs_report_period_secs, d.report_period),
        assignment_ttl: secs(flags.rlqs_assignment_ttl_secs, d.assignment_ttl),
        stale_after: secs(flags.rlqs_stale_after_secs, d.stale_after),
        abandon_after: secs(flags.rlqs_abandon_after_secs, d.abandon_after),
        max_streams: flags.rlqs_max_streams.unwrap_or(d.max_streams),
        max_buckets_per_stream: flags
            .rlqs_max_buckets_per_stream
            .unwrap_or(d.max_buckets_per_stream),
        max_bucket_id_bytes: flags
            .rlqs_max_bucket_id_bytes
            .unwrap_or(d.max_bucket_id_bytes),
        max_reports_per_message: flags
            .rlqs_max_reports_per_message
            .unwrap_or(d.max_reports_per_message),
        max_streams_per_peer: flags
            .rlqs_max_streams_per_peer
            .unwrap_or(d.max_streams_per_peer),
        max_bytes: flags.rlqs_max_bytes.unwrap_or(d.max_bytes),
        idle_after: secs(flags.rlqs_idle_stream_secs, d.idle_after),
        global_shadow_mode: shadow_mode,
    };
    options.check().map_err(Error::Settings)?;
    Ok(options)
}
