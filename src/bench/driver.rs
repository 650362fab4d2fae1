//! Driving the load. Closed loop: C tasks, each with one call in flight, back to back.
//! Open loop: a dispatcher thread sends request n at its intended instant
//! `start + n / rate` (a thread sleeps more precisely than the async timer's 1 ms
//! tick), each call runs as its own task, and latency is measured from the intended
//! instant, so a slow server cannot slow the load down and hide its own queueing (no
//! coordinated omission). Both record only calls that complete inside the measured
//! window, `[start + warmup, start + warmup + duration)`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tonic::transport::{Channel, Endpoint};

use super::record::{Live, Outcome, Recorder};
use super::workload::Workload;
use crate::proto::RateLimitServiceClient;

type Client = RateLimitServiceClient<Channel>;

/// When measurements count, and how long one call may take.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Instant,
    pub measure_from: Instant,
    pub end: Instant,
    pub call_timeout: Duration,
}

impl Window {
    fn counts(&self, done: Instant) -> bool {
        done >= self.measure_from && done < self.end
    }
}

/// Opens `count` HTTP/2 connections (one tonic channel each) to `url`.
pub async fn connect(url: &str, count: usize, timeout: Duration) -> Result<Vec<Client>, String> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| format!("invalid address '{url}': {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(timeout);
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = tokio::time::timeout(timeout, endpoint.connect())
            .await
            .map_err(|_| format!("{url}: no connection within {timeout:?}"))?
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    Ok(clients)
}

async fn call(
    client: &mut Client,
    request: crate::proto::RateLimitRequest,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(timeout, client.should_rate_limit(request)).await {
        Ok(result) => Outcome::of(&result.map(tonic::Response::into_inner)),
        Err(_) => Outcome::Failed(tonic::Code::DeadlineExceeded),
    }
}

/// `concurrency` tasks over `clients` (task i uses connection i mod K), each sending
/// back to back until the window ends or `budget` calls were sent.
pub async fn closed_loop(
    clients: &[Client],
    concurrency: usize,
    workload: Arc<Workload>,
    window: Window,
    live: Arc<Live>,
    budget: Option<u64>,
) -> Recorder {
    let budget = Arc::new(Semaphore::new(budget.map_or(Semaphore::MAX_PERMITS, |b| {
        usize::try_from(b)
            .unwrap_or(Semaphore::MAX_PERMITS)
            .min(Semaphore::MAX_PERMITS)
    })));
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let (workload, live, budget) = (workload.clone(), live.clone(), budget.clone());
            tokio::spawn(async move {
                let mut rng = workload.rng(i as u64);
                let mut recorder = Recorder::default();
                while Instant::now() < window.end {
                    match budget.try_acquire() {
                        Ok(permit) => permit.forget(),
                        Err(_) => break,
                    }
                    let request = workload.request(&mut rng);
                    live.sent();
                    let sent = Instant::now();
                    let outcome = call(&mut client, request, window.call_timeout).await;
                    let done = Instant::now();
                    live.done(outcome);
                    if window.counts(done) {
                        recorder.record(outcome, done - sent);
                    }
                }
                recorder
            })
        })
        .collect();
    let mut total = Recorder::default();
    for task in tasks {
        if let Ok(recorder) = task.await {
            total.merge(&recorder);
        }
    }
    total
}

/// A fixed offered rate, at most `max_in_flight` calls outstanding. Returns the
/// recorder and how many intended sends never happened (in-flight bound reached
/// until the window ended).
pub async fn open_loop(
    clients: Vec<Client>,
    rate: f64,
    max_in_flight: usize,
    workload: Arc<Workload>,
    window: Window,
    live: Arc<Live>,
    budget: Option<u64>,
) -> (Recorder, u64) {
    let interval = Duration::from_secs_f64(1.0 / rate);
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let (tx, rx) = mpsc::unbounded_channel::<(Outcome, Duration, Instant)>();
    let handle = tokio::runtime::Handle::current();
    let stop = Arc::new(AtomicBool::new(false));
    let dispatcher = {
        let (stop, live) = (stop.clone(), live.clone());
        std::thread::Builder::new()
            .name("bench-dispatch".into())
            .spawn(move || {
                // Timers (the bounded wait for a slot) need the runtime's context.
                let _runtime = handle.enter();
                let mut rng = workload.rng(u64::MAX);
                let mut unsent = 0u64;
                let mut n: u64 = 0;
                loop {
                    if budget.is_some_and(|b| n >= b) || stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let intended = window.start + interval.mul_f64(n as f64);
                    if intended >= window.end {
                        break;
                    }
                    let now = Instant::now();
                    if intended > now {
                        std::thread::sleep(intended - now);
                    }
                    let permit = match slots.clone().try_acquire_owned() {
                        Ok(permit) => permit,
                        Err(_) => {
                            // Wait for a slot, but never past the end of the window.
                            let wait = slots.clone().acquire_owned();
                            let left = window.end.saturating_duration_since(Instant::now());
                            match handle.block_on(tokio::time::timeout(left, wait)) {
                                Ok(Ok(permit)) => permit,
                                _ => {
                                    unsent += 1;
                                    break;
                                }
                            }
                        }
                    };
                    let mut client = clients[(n % clients.len() as u64) as usize].clone();
                    let request = workload.request(&mut rng);
                    let (tx, live) = (tx.clone(), live.clone());
                    live.sent();
                    handle.spawn(async move {
                        let outcome = call(&mut client, request, window.call_timeout).await;
                        let done = Instant::now();
                        live.done(outcome);
                        drop(permit);
                        let _ = tx.send((outcome, done.saturating_duration_since(intended), done));
                    });
                    n += 1;
                }
                unsent + left_out(&window, rate, budget, n + unsent)
            })
            .expect("spawn the dispatcher thread")
    };
    let recorder = collect(rx, &window).await;
    stop.store(true, Ordering::Relaxed);
    let unsent = tokio::task::spawn_blocking(move || dispatcher.join().unwrap_or(0))
        .await
        .unwrap_or(0);
    (recorder, unsent)
}

/// The intended sends an open loop never made after `tried` were tried: the rest of
/// the window's (or the budget's) sends when the loop stopped early.
fn left_out(window: &Window, rate: f64, budget: Option<u64>, tried: u64) -> u64 {
    let elapsed = window.end.saturating_duration_since(window.start);
    let intended_total = (elapsed.as_secs_f64() * rate) as u64;
    let expected = budget.map_or(intended_total, |b| b.min(intended_total));
    expected.saturating_sub(tried)
}

/// Records the open loop's answers that end inside the window. The dispatcher (which
/// owns the first sender) and every call task hold a sender: this ends when all are
/// done, or at the deadline.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<(Outcome, Duration, Instant)>,
    window: &Window,
) -> Recorder {
    let mut recorder = Recorder::default();
    let deadline = window.end + window.call_timeout + Duration::from_secs(1);
    while let Ok(Some((outcome, latency, done))) =
        tokio::time::timeout_at(deadline.into(), rx.recv()).await
    {
        if window.counts(done) {
            recorder.record(outcome, latency);
        }
    }
    recorder
}
