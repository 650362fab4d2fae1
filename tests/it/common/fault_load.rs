//! Traffic for fault tests: workers send ShouldRateLimit calls for their own keys
//! (one key is only ever sent by one worker, in order), and every answer is judged
//! against what a correct limiter must say: with `limit` per key, an OK after `limit`
//! OKs over-admits, and an OVER_LIMIT before `limit` calls could have been admitted
//! (OKs plus errors, since an errored call may or may not have counted) under-admits.
//! For the suites that break Redis on purpose (`cluster_faults`, `sentinel`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tonic::transport::Channel;

use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};

/// A rule for fault tests: `limit` per key per year (no window ends during a test).
pub fn yaml(domain: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\nfailure_mode: error\ndescriptors:\n  - key: k\n    rate_limit: {{unit: year, requests_per_unit: {limit}}}\n"
    )
}

/// What the answers were, and how many were wrong.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub requests: u64,
    pub ok: u64,
    pub over_limit: u64,
    /// UNAVAILABLE or no answer in time.
    pub errors: u64,
    /// OK although `limit` OKs had been given already.
    pub over_admitted: u64,
    /// OVER_LIMIT although fewer than `limit` calls could have counted.
    pub under_admitted: u64,
    /// Error messages seen, with counts.
    pub error_kinds: BTreeMap<String, u64>,
    pub elapsed: Duration,
}

impl Tally {
    pub fn wrong(&self) -> u64 {
        self.over_admitted + self.under_admitted
    }

    fn add(&mut self, other: Tally) {
        self.requests += other.requests;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.errors += other.errors;
        self.over_admitted += other.over_admitted;
        self.under_admitted += other.under_admitted;
        for (kind, n) in other.error_kinds {
            *self.error_kinds.entry(kind).or_default() += n;
        }
    }

    /// One line for logs and the README.
    pub fn summary(&self) -> String {
        format!(
            "{} requests in {:.1} s: {} OK, {} OVER_LIMIT, {} errors, {} wrong ({} over-admitted, {} under-admitted)",
            self.requests,
            self.elapsed.as_secs_f64(),
            self.ok,
            self.over_limit,
            self.errors,
            self.wrong(),
            self.over_admitted,
            self.under_admitted
        )
    }
}

/// Workers sending until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    /// Calls answered (or failed) so far, all workers together.
    answered: Arc<AtomicU64>,
    workers: Vec<JoinHandle<Tally>>,
    started: Instant,
}

/// Starts `workers` workers, each cycling through its share of `keys` (the values
/// of descriptor `k`) on domain `domain` until [`Load::stop`].
pub async fn start(
    addr: SocketAddr,
    domain: &str,
    keys: Vec<String>,
    limit: u32,
    workers: usize,
) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to tollgate");
    let mut handles = Vec::new();
    for w in 0..workers {
        let mine: Vec<String> = keys.iter().skip(w).step_by(workers).cloned().collect();
        let client = RateLimitServiceClient::new(channel.clone());
        let (stop, answered) = (stop.clone(), answered.clone());
        let domain = domain.to_owned();
        let work = worker(client, domain, mine, limit, stop, answered);
        handles.push(tokio::spawn(work));
    }
    Load {
        stop,
        answered,
        workers: handles,
        started: Instant::now(),
    }
}

impl Load {
    /// Stops the workers and adds up what they saw.
    pub async fn stop(self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        let mut total = Tally::default();
        for handle in self.workers {
            total.add(handle.await.expect("worker"));
        }
        total.elapsed = self.started.elapsed();
        total
    }
}

/// Calls a phase's tally must hold to say anything (the suites assert over 100): a
/// loaded machine can answer fewer than that in a phase's seconds, so a phase runs
/// on until it has them, for at most [`MAX_EXTRA`] more.
const ENOUGH: u64 = 200;
const MAX_EXTRA: Duration = Duration::from_secs(30);

/// Runs a load for `duration`, and on until it answered [`ENOUGH`] calls; its tally.
pub async fn run_for(
    addr: SocketAddr,
    domain: &str,
    keys: Vec<String>,
    limit: u32,
    workers: usize,
    duration: Duration,
) -> Tally {
    let load = start(addr, domain, keys, limit, workers).await;
    tokio::time::sleep(duration).await;
    let deadline = Instant::now() + MAX_EXTRA;
    while load.answered.load(Ordering::SeqCst) < ENOUGH && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    load.stop().await
}

/// `count` key values unique to `label`.
pub fn keys(label: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{label}-{i}")).collect()
}

#[derive(Default, Clone, Copy)]
struct KeyState {
    ok: u32,
    errors: u32,
}

async fn worker(
    mut client: RateLimitServiceClient<Channel>,
    domain: String,
    keys: Vec<String>,
    limit: u32,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
) -> Tally {
    let mut tally = Tally::default();
    let mut states = vec![KeyState::default(); keys.len()];
    'outer: loop {
        for (key, state) in keys.iter().zip(states.iter_mut()) {
            if stop.load(Ordering::SeqCst) {
                break 'outer;
            }
            let request = RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "k".into(),
                        value: key.clone(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            };
            tally.requests += 1;
            let answer =
                tokio::time::timeout(Duration::from_secs(2), client.should_rate_limit(request))
                    .await;
            let error = match answer {
                Ok(Ok(response)) => {
                    match Code::try_from(response.into_inner().overall_code) {
                        Ok(Code::Ok) => {
                            tally.ok += 1;
                            if state.ok >= limit {
                                tally.over_admitted += 1;
                            }
                            state.ok += 1;
                        }
                        Ok(Code::OverLimit) => {
                            tally.over_limit += 1;
                            if state.ok + state.errors < limit {
                                tally.under_admitted += 1;
                            }
                        }
                        other => panic!("unexpected overall code {other:?}"),
                    }
                    None
                }
                Ok(Err(status)) => {
                    Some(format!("{:?}: {}", status.code(), short(status.message())))
                }
                Err(_) => Some("no answer within 2 s".to_owned()),
            };
            if let Some(kind) = error {
                tally.errors += 1;
                state.errors += 1;
                *tally.error_kinds.entry(kind).or_default() += 1;
            }
            answered.fetch_add(1, Ordering::SeqCst);
        }
    }
    tally
}

/// An error message without the parts that vary (addresses, numbers).
fn short(message: &str) -> String {
    let cut: String = message.chars().take(80).collect();
    cut.chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}
