//! Concurrent requests made deterministic: Redis holds its writers (`CLIENT PAUSE ..
//! WRITE`, which holds every script call) while a burst of requests is started, each
//! its own task, and is released only once every request is waiting for its answer.
//! So the store's first calls sit in Redis and every other request of the burst
//! queues behind them, whatever the machine's load: what the batcher then sends is a
//! function of its rules alone, which a test can bound exactly.
//!
//! "Waiting for its answer" is read from the request's future: it has returned
//! `Pending` once. On the store's path nothing before the batcher's queue can be
//! pending (the limiter, the store's wrappers and the cluster's routing run straight
//! through to the queue's send), so a request that returned `Pending` is queued, or in
//! a call Redis holds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How long Redis may be held at most: the release comes as soon as the burst is
/// queued (milliseconds); this only frees Redis if the test dies before it.
const HOLD: Duration = Duration::from_secs(60);

/// How long the burst may take to queue before the test fails.
const QUEUE_WITHIN: Duration = Duration::from_secs(30);

/// Redis's writers held on the servers at `ports` until this is dropped.
struct Hold(Vec<u16>);

impl Hold {
    fn start(ports: &[u16]) -> Self {
        let ms = HOLD.as_millis().to_string();
        for &port in ports {
            super::redis::redis_cli(port, &["CLIENT", "PAUSE", &ms, "WRITE"]);
        }
        Hold(ports.to_vec())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for &port in &self.0 {
            let _ = super::redis::try_redis_cli(port, &["CLIENT", "UNPAUSE"]);
        }
    }
}

/// Runs `requests`, each as a task of its own, while the Redis servers at `ports`
/// hold every script call, and releases them once every request is waiting for its
/// answer; the requests' outputs, in order. The store's timeout must outlast the
/// queueing (seconds on a loaded machine), or the requests time out in the queue.
pub async fn queued_behind_redis<F>(ports: &[u16], requests: Vec<F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let hold = Hold::start(ports);
    let parked = Arc::new(Parked::default());
    let n = requests.len();
    let tasks: Vec<JoinHandle<F::Output>> = requests
        .into_iter()
        .map(|request| {
            tokio::spawn(FirstPending {
                inner: Box::pin(request),
                parked: Some(parked.clone()),
            })
        })
        .collect();
    tokio::time::timeout(QUEUE_WITHIN, parked.all(n))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "only {} of {n} requests were waiting within {QUEUE_WITHIN:?}",
                parked.count.load(Ordering::SeqCst)
            )
        });
    drop(hold);
    let mut outputs = Vec::with_capacity(n);
    for task in tasks {
        outputs.push(task.await.expect("request task"));
    }
    outputs
}

/// How many requests have been polled to `Pending` (or finished) at least once.
#[derive(Default)]
struct Parked {
    count: AtomicUsize,
    changed: Notify,
}

impl Parked {
    fn mark(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_one();
    }

    async fn all(&self, n: usize) {
        // notify_one keeps a permit when nobody waits, so no mark is missed between
        // the load and the wait.
        while self.count.load(Ordering::SeqCst) < n {
            self.changed.notified().await;
        }
    }
}

/// `inner`, marking [`Parked`] the first time it returns.
struct FirstPending<F: Future> {
    inner: Pin<Box<F>>,
    parked: Option<Arc<Parked>>,
}

impl<F: Future> Future for FirstPending<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let poll = self.inner.as_mut().poll(cx);
        if let Some(parked) = self.parked.take() {
            parked.mark();
        }
        poll
    }
}
