//! Cross-request batching for one standalone Redis (direct or through Sentinel):
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
//! queue); batches only form while [`IN_FLIGHT`] calls are already waiting on Redis.
//! A call is given up after the store's timeout (every request in it has given up by
//! then too), so a Redis that stops answering cannot hold the in-flight slots longer.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::connect::describe;
use super::scripts::{self, Reply, Segment, WireOp};
use crate::store::StoreError;

/// Script calls allowed on the wire at once. Redis runs scripts one at a time, so more
/// would only queue inside Redis instead of here, where they can still be merged; two
/// keep the connection busy while a finished call's replies are handed out.
const IN_FLIGHT: usize = 2;

/// Operations per call, at most, unless one request alone has more (it then goes
/// alone): keeps one script's run, and the time every other client of that Redis
/// waits for it, short.
const MAX_OPS_PER_CALL: usize = 256;

struct Job {
    keys: Vec<String>,
    ops: Vec<WireOp>,
    dry_run: bool,
    reply: oneshot::Sender<Result<Vec<Reply>, StoreError>>,
}

/// The queue in front of one standalone connection (direct or Sentinel; never a
/// cluster, whose keys must be split by slot first). Dropping it stops its task once
/// the calls in flight are answered.
pub struct Batcher {
    queue: mpsc::UnboundedSender<Job>,
}

impl Batcher {
    /// Starts the task that drains the queue (on the current tokio runtime). A call
    /// not answered within `timeout` is abandoned and its requests get
    /// [`StoreError::Timeout`].
    pub fn start<C>(connection: C, timeout: Duration) -> Self
    where
        C: ConnectionLike + Clone + Send + 'static,
    {
        let (queue, jobs) = mpsc::unbounded_channel();
        tokio::spawn(drain(jobs, connection, timeout));
        Self { queue }
    }

    /// Decides one request's operations (keys already encoded), all or nothing.
    pub async fn decide(
        &self,
        keys: Vec<String>,
        ops: Vec<WireOp>,
        dry_run: bool,
    ) -> Result<Vec<Reply>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            keys,
            ops,
            dry_run,
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

async fn drain<C>(mut jobs: mpsc::UnboundedReceiver<Job>, connection: C, timeout: Duration)
where
    C: ConnectionLike + Clone + Send + 'static,
{
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    // A job that did not fit in the previous call opens the next one.
    let mut held: Option<Job> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match jobs.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        // Waiting here for a slot is what lets the queue fill: whatever arrives while
        // IN_FLIGHT calls are out goes in the next one.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let mut batch: Vec<Job> = Vec::new();
        let mut ops = 0;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            // A caller that gave up (its timeout passed) must not be counted after
            // it was answered by its failure mode.
            if !job.reply.is_closed() {
                if !batch.is_empty() && ops + job.ops.len() > MAX_OPS_PER_CALL {
                    held = Some(job);
                    break;
                }
                ops += job.ops.len();
                batch.push(job);
            }
            next = jobs.try_recv().ok();
        }
        if batch.is_empty() {
            continue;
        }
        let mut connection = connection.clone();
        tokio::spawn(async move {
            let replies = tokio::time::timeout(timeout, call(&mut connection, &batch))
                .await
                .unwrap_or(Err(StoreError::Timeout(timeout)));
            drop(permit);
            answer(batch, replies);
        });
    }
}

/// One EVALSHA for every job of `batch`: all their replies, in order.
async fn call<C: ConnectionLike>(
    connection: &mut C,
    batch: &[Job],
) -> Result<Vec<Reply>, StoreError> {
    let segments: Vec<Segment<'_, String>> = batch
        .iter()
        .map(|job| Segment {
            keys: &job.keys,
            ops: &job.ops,
            dry_run: job.dry_run,
        })
        .collect();
    let cmd = scripts::batch_cmd(&segments, None);
    let total: usize = batch.iter().map(|job| job.ops.len()).sum();
    let values: Vec<i64> = scripts::evalsha(connection, &cmd, &scripts::BATCH)
        .await
        .map_err(|e| StoreError::Unavailable(describe(&e)))?;
    scripts::parse_batch_reply(&values, total).map_err(StoreError::Unavailable)
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
