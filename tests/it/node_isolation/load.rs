//! The load of the node isolation suite: workers sending requests of one kind each
//! (which masters their slot groups live on), alternating between the servers, and
//! what each answer was and how long it took.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;
use tonic::transport::Channel;

use super::{DOMAIN, WORKERS};
use crate::common::server::{descriptor, request};

/// What a request touches: which masters its slot groups live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One descriptor on a healthy master.
    Healthy,
    /// Two descriptors on two different healthy masters (a cross-slot walk).
    HealthyPair,
    /// One descriptor on the stopped master.
    Stopped,
    /// One descriptor on a healthy master and one on the stopped one.
    Mixed,
}

pub const KINDS: [Kind; 4] = [Kind::Healthy, Kind::HealthyPair, Kind::Stopped, Kind::Mixed];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    OverLimit,
    Error,
}

pub struct Sample {
    pub kind: Kind,
    pub sent: Instant,
    pub latency: Duration,
    pub answer: Answer,
}

/// The descriptors of a request of `kind`, the `n`th of its worker.
fn descriptors<'a>(
    kind: Kind,
    n: usize,
    healthy: &'a [Vec<String>],
    stopped: &'a [String],
) -> Vec<&'a str> {
    fn pick(values: &[String], n: usize) -> &str {
        values[n % values.len()].as_str()
    }
    match kind {
        Kind::Healthy => vec![pick(&healthy[n % 2], n / 2)],
        Kind::HealthyPair => vec![pick(&healthy[0], n), pick(&healthy[1], n + 1)],
        Kind::Stopped => vec![pick(stopped, n)],
        Kind::Mixed => vec![pick(&healthy[n % 2], n), pick(stopped, n + 1)],
    }
}

/// Sends until `stop`; worker `id` sends kind `id % 4`.
pub async fn worker(
    mut clients: Vec<RateLimitServiceClient<Channel>>,
    id: usize,
    healthy: Arc<Vec<Vec<String>>>,
    stopped: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut n = id;
    while !stop.load(Ordering::SeqCst) {
        let kind = KINDS[n % KINDS.len()];
        let values = descriptors(kind, n / KINDS.len(), &healthy, &stopped);
        let entries: Vec<_> = values.iter().map(|v| descriptor(&[("k", v)])).collect();
        // Alternate servers round by round: each server sees every kind.
        let client = &mut clients[(n / WORKERS) % 2];
        let sent = Instant::now();
        let call = client.should_rate_limit(request(DOMAIN, entries));
        let answer = match tokio::time::timeout(Duration::from_secs(3), call).await {
            Ok(Ok(r)) => match Code::try_from(r.into_inner().overall_code) {
                Ok(Code::Ok) => Answer::Ok,
                Ok(Code::OverLimit) => Answer::OverLimit,
                _ => Answer::Error,
            },
            _ => Answer::Error,
        };
        samples.push(Sample {
            kind,
            sent,
            latency: sent.elapsed(),
            answer,
        });
        n += WORKERS;
    }
    samples
}

/// The `p` quantile (0 to 1) of `latencies`, sorting them.
pub fn percentile(latencies: &mut [Duration], p: f64) -> Duration {
    latencies.sort();
    let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
    latencies.get(i).copied().unwrap_or_default()
}
