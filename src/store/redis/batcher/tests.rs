//! The queue's discipline alone, on a connection whose calls end only when the
//! test lets them (it stands for calls in flight, not for Redis: Redis itself is
//! in `tests/it`).

use super::*;
use std::sync::atomic::AtomicUsize;
use tokio::sync::Semaphore;

#[derive(Clone)]
struct Held {
    calls: Arc<AtomicUsize>,
    /// One permit lets one call end (with an error that is not a lost connection).
    release: Arc<Semaphore>,
}

impl ConnectionLike for Held {
    fn req_packed_command<'a>(
        &'a mut self,
        _: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let release = Arc::clone(&self.release);
        Box::pin(async move {
            let _ = release.acquire().await.map(|p| p.forget());
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "let go by the test",
            )))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(std::future::pending())
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn op() -> WireOp {
    let params = crate::algorithm::Params {
        algorithm: crate::algorithm::Algorithm::FixedWindow,
        limit: 10,
        window_ms: 60_000,
        burst: 10,
        max_delay_ms: None,
        calendar: None,
    };
    WireOp::new(&crate::store::CounterOp {
        key: crate::store::CounterKey {
            domain: Arc::from("d"),
            rule: Arc::from("r"),
            entries: Default::default(),
            algorithm: params.algorithm,
            window_secs: 60,
            time_zone: None,
            hash_tag: None,
        },
        params,
        cost: 1,
        vetoes: true,
        mode: crate::algorithm::Mode::Limit,
        lease: None,
    })
}

/// Calls in flight hold the queue (that is what batches requests), but when a call
/// ends with more than a full call's worth waiting, one call more goes out beside
/// the ones allowed: what waits could merge no further, and holding it would leave
/// Redis idle for a round trip between calls at saturation.
#[tokio::test]
async fn a_backlog_of_a_full_call_sends_one_call_more() {
    let connection = Held {
        calls: Arc::default(),
        release: Arc::new(Semaphore::new(0)),
    };
    let (calls, release) = (
        Arc::clone(&connection.calls),
        Arc::clone(&connection.release),
    );
    let sent = || calls.load(Ordering::SeqCst);
    let batcher = Arc::new(Batcher::start(
        connection,
        Duration::from_secs(30),
        Default::default(),
    ));
    let ask = |n: usize| -> Vec<tokio::task::JoinHandle<_>> {
        (0..n)
            .map(|i| {
                let batcher = Arc::clone(&batcher);
                tokio::spawn(async move {
                    batcher
                        .decide(vec![format!("k{i}")], vec![op()], false)
                        .await
                })
            })
            .collect()
    };
    let settle = || async {
        for _ in 0..1000 {
            tokio::task::yield_now().await;
        }
    };
    // Fill the calls allowed in flight, one request at a time, until one waits.
    let mut asked = Vec::new();
    let allowed = loop {
        let before = sent();
        asked.extend(ask(1));
        settle().await;
        if sent() == before {
            break before;
        }
        assert!(before < depth::MAX, "every request was sent at once");
    };
    assert!(allowed >= depth::MIN, "nothing was sent");
    // Two full calls' worth more: nothing goes while every slot is taken.
    asked.extend(ask(2 * MAX_OPS_PER_CALL));
    settle().await;
    assert_eq!(sent(), allowed, "sent without room");
    // One call ends: its slot takes a full call, and the backlog one more.
    release.add_permits(1);
    settle().await;
    assert_eq!(
        sent(),
        allowed + 2,
        "one call for the free slot, one for the backlog"
    );
    // What is left is less than a full call: it waits.
    settle().await;
    assert_eq!(
        sent(),
        allowed + 2,
        "less than a full call sent without room"
    );
}

/// A connection that is gone: its first `lost` PINGs and every script call fail as a
/// dead connection does (broken pipe); PINGs after those answer.
#[derive(Clone)]
struct Gone {
    pings: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    lost: usize,
}

impl Gone {
    fn new(lost: usize) -> Self {
        Self {
            pings: Arc::default(),
            calls: Arc::default(),
            lost,
        }
    }
}

impl ConnectionLike for Gone {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let ping = matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(b"PING")));
        let answered = if ping {
            self.pings.fetch_add(1, Ordering::SeqCst) >= self.lost
        } else {
            self.calls.fetch_add(1, Ordering::SeqCst);
            false
        };
        Box::pin(async move {
            if answered {
                Ok(redis::Value::SimpleString("PONG".into()))
            } else {
                Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe).into())
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(std::future::pending())
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A lost connection cannot say whether the call ran: only a call of dry runs (which
/// write nothing) is sent again; a consuming one fails after one attempt.
#[tokio::test]
async fn only_a_call_of_dry_runs_is_sent_again_after_a_lost_connection() {
    for (dry_run, sends) in [(true, 2), (false, 1)] {
        let connection = Gone::new(usize::MAX);
        let calls = Arc::clone(&connection.calls);
        let batcher = Batcher::start(connection, Duration::from_secs(30), Default::default());
        let answer = batcher.decide(vec!["k".into()], vec![op()], dry_run).await;
        assert!(answer.is_err(), "dry run {dry_run}: {answer:?}");
        assert_eq!(calls.load(Ordering::SeqCst), sends, "dry run {dry_run}");
        assert!(batcher.is_down(), "a lost connection marks the store down");
    }
}

/// Readiness asks the connection the calls take: one found dead (a Redis restarted
/// while nothing was sent) is asked once more on its replacement, and answers; one
/// that stays lost marks the store down, so requests fail fast until it is back.
#[tokio::test]
async fn readiness_asks_the_calls_connection_and_again_once_it_was_dead() {
    let dead_once = Gone::new(1);
    let pings = Arc::clone(&dead_once.pings);
    let batcher = Batcher::start(dead_once, Duration::from_secs(30), Default::default());
    assert!(batcher.check().await.is_ok());
    assert_eq!(
        pings.load(Ordering::SeqCst),
        2,
        "asked again after the loss"
    );
    assert!(!batcher.is_down());

    let gone = Gone::new(usize::MAX);
    let batcher = Batcher::start(gone, Duration::from_secs(30), Default::default());
    assert!(batcher.check().await.is_err());
    assert!(batcher.is_down(), "still lost: marked down");
    let refused = batcher.decide(vec!["k".into()], vec![op()], false).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(why)) if why == DOWN),
        "{refused:?}"
    );
}
