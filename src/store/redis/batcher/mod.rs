//! Cross-request batching for one standalone Redis (direct or through Sentinel), and
//! on a cluster for one hash slot (one batcher per active slot, `slot_batch.rs`):
//! requests that arrive while earlier script calls are in flight wait in a queue and
//! then travel together, as the segments of one EVALSHA of `lua/batch.lua`.
//!
//! Why: every EVALSHA costs Redis a fixed amount (parse the command, find the script,
//! enter Lua, read TIME) on top of the counters' own work, and that fixed part is most
//! of a one-descriptor request. Under load, S requests now pay it once. Each segment is
//! still decided all or nothing on its own, and segments run in queue order inside one
//! atomic script, so a call carrying S requests answers exactly as S calls would.
//!
//! Latency: an idle store sends a request at once (a free in-flight slot, an empty
//! queue); batches only form while the calls allowed in flight ([`depth`]: one on a
//! short path under load, more on a long one) are already out, and a full call's
//! worth of waiting requests may always go out as one more call. Each request carries its
//! deadline (now + the store's timeout) and the batcher keeps it: a call is given up
//! at the earliest deadline among its requests, and a request whose deadline passed
//! in the queue is answered [`StoreError::Timeout`] without being sent. So a Redis
//! that stops answering cannot hold the in-flight slots longer, and no request needs
//! a timer of its own (one per call instead).
//!
//! Failing fast: a call that fails because the connection is gone (refused, reset,
//! closed) marks the store down, and until a PING gets through again ([`recover`])
//! every request fails at once with [`StoreError::Unavailable`] instead of waiting
//! out the timeout behind redis-rs' reconnection, so each domain's `failure_mode`
//! answers within microseconds. Readiness asks the same connection
//! ([`Batcher::check`]), so a dead one is found before traffic meets it.
//!
//! A call that met a lost connection is sent again only when it wrote nothing: every
//! job in it a dry run ([`resend_safe`] says why the others are not).
//!
//! The calls in flight are driven by the queue's own task (no task per call), so a
//! request crosses two tasks: its own, this one (and redis-rs' connection task).

mod depth;
mod recover;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::ConnectionLike;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use self::depth::Depth;
use self::recover::Pinger;
use super::connect::describe;
use super::misroute;
use super::scripts::{self, Engine, Layout, Reply, Segment, WireOp};
use crate::store::StoreError;

/// Operations per call, at most, unless one request alone has more (it then goes
/// alone): keeps one script's run, and the time every other client of that Redis
/// waits for it, short.
const MAX_OPS_PER_CALL: usize = 256;

/// What a request gets while the connection is known to be gone.
pub(super) const DOWN: &str = "the connection to Redis is lost (reconnecting)";

struct Job {
    keys: Vec<String>,
    ops: Vec<WireOp>,
    dry_run: bool,
    deadline: Instant,
    reply: oneshot::Sender<Result<Vec<Reply>, StoreError>>,
}

/// Whether the connection is known to be gone; shared by the handle, the queue's
/// task and the recovery task.
#[derive(Default)]
struct Health {
    down: AtomicBool,
}

impl Health {
    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }
}

/// The queue in front of one standalone connection (direct or Sentinel), or of one
/// hash slot of a cluster (its keys split by slot first). Dropping it stops its task once
/// the calls in flight are answered.
pub struct Batcher {
    queue: mpsc::UnboundedSender<Job>,
    health: Arc<Health>,
    /// Each request's budget: its deadline is its arrival plus this.
    timeout: Duration,
    /// A PING on the connection the calls take, for readiness and recovery.
    ping: Pinger,
}

impl Batcher {
    /// Starts the task that drains the queue (on the current tokio runtime). A request
    /// not answered by its deadline gets [`StoreError::Timeout`] naming `timeout`.
    /// Calls go by FCALL while `functions` says the library is loaded.
    pub fn start<C>(connection: C, timeout: Duration, functions: Engine) -> Self
    where
        C: ConnectionLike + Clone + Send + 'static,
    {
        Self::start_in(Layout::Declared, connection, timeout, functions)
    }

    /// [`Batcher::start`], its calls' keys where `layout` puts them.
    pub fn start_in<C>(layout: Layout, connection: C, timeout: Duration, functions: Engine) -> Self
    where
        C: ConnectionLike + Clone + Send + 'static,
    {
        let (queue, jobs) = mpsc::unbounded_channel();
        let health = Arc::new(Health::default());
        let ping = recover::pinger(&connection);
        let line = Line {
            connection,
            layout,
            timeout,
            functions,
            ping: Arc::clone(&ping),
        };
        tokio::spawn(drain(jobs, line, Arc::clone(&health)));
        Self {
            queue,
            health,
            timeout,
            ping,
        }
    }

    /// Whether the connection is known lost (requests fail at once until it is back).
    pub fn is_down(&self) -> bool {
        self.health.is_down()
    }

    /// For readiness: whether the connection the calls take answers a PING now (a
    /// dead one is replaced and asked again; one still lost marks the store down).
    pub async fn check(&self) -> Result<(), StoreError> {
        recover::check(&self.health, &self.ping).await
    }

    /// Decides one request's operations (keys already encoded), all or nothing; the
    /// answer comes within the store's timeout (a [`StoreError::Timeout`] then).
    pub async fn decide(
        &self,
        keys: Vec<String>,
        ops: Vec<WireOp>,
        dry_run: bool,
    ) -> Result<Vec<Reply>, StoreError> {
        let deadline = Instant::now() + self.timeout;
        if self.health.is_down() {
            return Err(StoreError::Unavailable(DOWN.to_owned()));
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            keys,
            ops,
            dry_run,
            deadline,
            reply,
        };
        self.queue
            .send(job)
            .map_err(|_| StoreError::Unavailable("the Redis batcher has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the Redis batcher dropped a request".into()))?
    }
}

/// A call's outcome: its jobs, when it was sent, and the replies or why not.
struct Finished {
    batch: Vec<Job>,
    sent: std::time::Instant,
    replies: Result<Vec<Reply>, CallError>,
}

struct CallError {
    error: StoreError,
    /// The connection is gone (refused, reset, closed), not merely slow or refusing
    /// this one call.
    lost: bool,
}

/// Where a queue's calls go, and how.
#[derive(Clone)]
struct Line<C> {
    connection: C,
    layout: Layout,
    /// Each request's budget.
    timeout: Duration,
    functions: Engine,
    ping: Pinger,
}

async fn drain<C>(mut jobs: mpsc::UnboundedReceiver<Job>, line: Line<C>, health: Arc<Health>)
where
    C: ConnectionLike + Clone + Send + 'static,
{
    let timeout = line.timeout;
    let mut depth = Depth::default();
    let mut calls = FuturesUnordered::new();
    // A job that did not fit in the previous call opens the next one.
    let mut held: Option<Job> = None;
    let mut open = true;
    loop {
        // Waiting for a free slot (not taking jobs meanwhile) is what lets the queue
        // fill: whatever arrives while the calls allowed are out goes in the next one.
        // A full call's worth already waiting cannot merge any further, so one more
        // call may go: at saturation Redis is not left idle for a round trip between
        // calls (each job has at least one operation).
        let backlog = jobs.len() + usize::from(held.is_some()) >= MAX_OPS_PER_CALL;
        let room = calls.len() < depth.limit() + usize::from(backlog);
        tokio::select! {
            biased;
            Some(finished) = calls.next(), if !calls.is_empty() => {
                let Finished { batch, sent, replies } = finished;
                match &replies {
                    Ok(_) => depth.observe(std::time::Instant::now(), sent.elapsed()),
                    Err(e) if e.lost => recover::mark_down(&health, &line.ping, &e.error),
                    Err(_) => {}
                }
                answer(batch, replies.map_err(|e| e.error));
            }
            first = next_job(&mut held, &mut jobs), if room && open => {
                let Some(first) = first else {
                    open = false;
                    continue;
                };
                let batch = gather(first, &mut held, &mut jobs, timeout);
                if batch.is_empty() {
                    continue;
                }
                if health.is_down() {
                    // Queued before the loss was known: fail now, not after a
                    // reconnection attempt.
                    answer(batch, Err(StoreError::Unavailable(DOWN.to_owned())));
                    continue;
                }
                calls.push(send(line.clone(), batch));
            }
            else => return,
        }
    }
}

async fn next_job(held: &mut Option<Job>, jobs: &mut mpsc::UnboundedReceiver<Job>) -> Option<Job> {
    match held.take() {
        Some(job) => Some(job),
        None => jobs.recv().await,
    }
}

/// `first` and whatever else is queued, up to [`MAX_OPS_PER_CALL`] operations; the
/// job that would pass the bound is held for the next call. A job whose deadline
/// passed while it waited for a slot is answered now and not sent.
fn gather(
    first: Job,
    held: &mut Option<Job>,
    jobs: &mut mpsc::UnboundedReceiver<Job>,
    timeout: Duration,
) -> Vec<Job> {
    let mut batch: Vec<Job> = Vec::new();
    let mut ops = 0;
    let mut next = Some(first);
    let now = Instant::now();
    while let Some(job) = next.take() {
        if job.deadline <= now {
            let _ = job.reply.send(Err(StoreError::Timeout(timeout)));
        } else if !job.reply.is_closed() {
            // (A caller that gave up must not be counted after it was answered by its
            // failure mode.)
            if !batch.is_empty() && ops + job.ops.len() > MAX_OPS_PER_CALL {
                *held = Some(job);
                break;
            }
            ops += job.ops.len();
            batch.push(job);
        }
        next = jobs.try_recv().ok();
    }
    batch
}

/// One call, given up at the earliest deadline of its jobs (the first: the queue is
/// in arrival order and every request has the same timeout).
async fn send<C: ConnectionLike>(mut line: Line<C>, batch: Vec<Job>) -> Finished {
    let (sent, timeout) = (std::time::Instant::now(), line.timeout);
    let deadline = batch.iter().map(|job| job.deadline).min();
    let deadline = deadline.unwrap_or_else(|| Instant::now() + timeout);
    let attempts = async {
        match call(&mut line, &batch).await {
            Err(e) if e.lost && resend_safe(&batch) => call(&mut line, &batch).await,
            other => other,
        }
    };
    let replies = tokio::time::timeout_at(deadline, attempts)
        .await
        .unwrap_or(Err(CallError {
            error: StoreError::Timeout(timeout),
            lost: false,
        }));
    Finished {
        batch,
        sent,
        replies,
    }
}

/// Whether a call that met a lost connection may be sent again (once, on the
/// connection redis-rs opens in its place). A lost connection does not say whether
/// the call reached Redis: it may have run and only its reply been lost (the
/// connection reset after the write), or never left (the connection was dead before
/// it: Redis restarted while nothing was sent). Sent again after running, a
/// consuming call would count its requests twice, and a release or a charge would
/// be applied twice. So only calls that write nothing go again: every job a dry run,
/// whose second run answers as the first would have. The rest fail, and their
/// domains' failure modes answer; readiness's PING on this connection
/// ([`Batcher::check`]) is what keeps a dead connection from meeting them.
fn resend_safe(batch: &[Job]) -> bool {
    batch.iter().all(|job| job.dry_run)
}

/// One script call (FCALL or EVALSHA) for every job of `batch`: all their replies, in
/// order.
async fn call<C: ConnectionLike>(
    line: &mut Line<C>,
    batch: &[Job],
) -> Result<Vec<Reply>, CallError> {
    let segments: Vec<Segment<'_, String>> = batch
        .iter()
        .map(|job| Segment {
            keys: &job.keys,
            ops: &job.ops,
            dry_run: job.dry_run,
        })
        .collect();
    let total: usize = batch.iter().map(|job| job.ops.len()).sum();
    let sent = scripts::send_batch(
        &mut line.connection,
        line.layout,
        &segments,
        &line.functions,
    )
    .await;
    let reply: Vec<u8> = sent.map_err(|e| match line.layout {
        // Nothing was written: the caller decides the request again by slot.
        Layout::AnySlot if misroute::misrouted(&e) => CallError {
            error: misroute::error(&e),
            lost: false,
        },
        _ => CallError {
            error: StoreError::Unavailable(describe(&e)),
            lost: recover::connection_lost(&e),
        },
    })?;
    scripts::parse_batch_reply(&reply, total).map_err(|e| CallError {
        error: StoreError::Unavailable(e),
        lost: false,
    })
}

/// Each job gets its own replies, or the call's error.
fn answer(batch: Vec<Job>, replies: Result<Vec<Reply>, StoreError>) {
    match replies {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            for job in batch {
                let mine: Vec<Reply> = replies.by_ref().take(job.ops.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
