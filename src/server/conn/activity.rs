//! What one connection is doing, as its watchdog (`connection.rs`) needs to know it:
//! whether the client has spoken yet, how many calls are in progress, how many of them
//! the server is working on (their request in, their answer not yet made), and
//! whether one has been held far past the request timeout. Kept with a few relaxed
//! atomics per call, so the request path pays no lock and no timer of its own beyond
//! the request timeout.
//!
//! [`Watched`] is the connection's I/O, marking the client as having spoken once it
//! sent [`SPOKE_AFTER`] bytes; a [`CallGuard`] is one call's place, from its arrival
//! until its answer's body is dropped (`call.rs` moves it along).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Bytes a client sends before it counts as having spoken: the HTTP/2 connection
/// preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`), or as much of an HTTP/1 request.
pub const SPOKE_AFTER: usize = 24;

/// Slots of the ring of calls by the quarter of the request timeout they began in:
/// the slots from [`STALLED_AFTER`] back to the oldest are the held calls', so a
/// watchdog whose looks come up to `RING - STALLED_AFTER - 1` quarters late (a loaded
/// machine) still finds one in its next look.
const RING: usize = 16;
/// A call that began this many quarters before the current one is held past the
/// request timeout by more than a quarter of it: its answer was made (or the timeout
/// answered for it) and the client has not taken it.
const STALLED_AFTER: u64 = 6;

/// One connection's activity, shared by its watchdog, its I/O and its calls.
pub struct Activity {
    /// The calls in progress on every connection of the port (bounded ones only).
    port_calls: Arc<AtomicUsize>,
    born: Instant,
    spoke: AtomicBool,
    in_flight: AtomicUsize,
    /// Calls whose request is in and whose answer is not made yet: what a shutdown
    /// waits for (the rest wait on their client).
    working: AtomicUsize,
    /// Calls begun so far: the watchdog compares it between looks to tell an idle
    /// connection from a busy one whose calls are quick.
    begun: AtomicU64,
    /// A quarter of the request timeout, in ms (at least 1).
    quarter_ms: u64,
    /// Calls in progress by the quarter they began in, modulo [`RING`]; only calls
    /// the request timeout bounds (not the streams that stay open by design).
    ring: [AtomicUsize; RING],
}

impl Activity {
    /// The activity of a new connection of the port whose calls in progress
    /// `port_calls` counts.
    pub fn new(request_timeout: Duration, port_calls: Arc<AtomicUsize>) -> Self {
        Self {
            port_calls,
            born: Instant::now(),
            spoke: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            working: AtomicUsize::new(0),
            begun: AtomicU64::new(0),
            quarter_ms: (request_timeout.as_millis() as u64 / 4).max(1),
            ring: Default::default(),
        }
    }

    /// How often the watchdog must look for a held call to be found: each quarter.
    pub fn quarter(&self) -> Duration {
        Duration::from_millis(self.quarter_ms)
    }

    pub fn spoke(&self) -> bool {
        self.spoke.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn begun(&self) -> u64 {
        self.begun.load(Ordering::Relaxed)
    }

    pub fn working(&self) -> usize {
        self.working.load(Ordering::Relaxed)
    }

    fn quarter_of(&self, at: Instant) -> u64 {
        at.duration_since(self.born).as_millis() as u64 / self.quarter_ms
    }

    /// A call begins; it ends when the guard is dropped. `bounded`: the request
    /// timeout and the port's bound on calls in progress apply to it; `None` when
    /// the port already has `max_calls` of those in progress.
    pub(super) fn begin(self: &Arc<Self>, bounded: bool, max_calls: usize) -> Option<CallGuard> {
        // A request counts as speaking (an HTTP/1.0 request may be shorter than a
        // preface).
        self.spoke.store(true, Ordering::Relaxed);
        if bounded && self.port_calls.fetch_add(1, Ordering::Relaxed) >= max_calls {
            self.port_calls.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.begun.fetch_add(1, Ordering::Relaxed);
        let quarter = bounded.then(|| {
            let quarter = self.quarter_of(Instant::now());
            self.ring[slot(quarter)].fetch_add(1, Ordering::Relaxed);
            quarter
        });
        Some(CallGuard {
            call: Arc::new(Call {
                activity: Arc::clone(self),
                state: AtomicU8::new(RECEIVING),
            }),
            quarter,
        })
    }

    /// Whether a bounded call began [`STALLED_AFTER`] quarters or more before `now`'s
    /// and is still in progress. Looked at every quarter, a held call is found in
    /// the first look once it is that old (the slots that old hold no newer calls:
    /// their newer quarters have not begun). A call held through a whole turn of the
    /// ring is found in the next turn's window.
    pub fn stalled(&self, now: Instant) -> bool {
        let current = self.quarter_of(now);
        (STALLED_AFTER..RING as u64)
            .filter(|&back| back <= current)
            .any(|back| self.ring[slot(current - back)].load(Ordering::Relaxed) > 0)
    }
}

fn slot(quarter: u64) -> usize {
    (quarter % RING as u64) as usize
}

/// Where one call is: its request coming in, the server working on it, answered.
const RECEIVING: u8 = 0;
const WORKING: u8 = 1;
const ANSWERED: u8 = 2;

/// One call, shared by its guard and its request's body.
pub struct Call {
    activity: Arc<Activity>,
    state: AtomicU8,
}

impl Call {
    /// Its request is in whole: the server works on it from now.
    pub fn received(&self) {
        let moved =
            self.state
                .compare_exchange(RECEIVING, WORKING, Ordering::Relaxed, Ordering::Relaxed);
        if moved.is_ok() {
            self.activity.working.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Its answer is made (or it was given up): nothing more to work on.
    pub fn answered(&self) {
        if self.state.swap(ANSWERED, Ordering::Relaxed) == WORKING {
            self.activity.working.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One call in progress, until dropped.
pub struct CallGuard {
    call: Arc<Call>,
    quarter: Option<u64>,
}

impl CallGuard {
    /// The call, for its request's body to say when it is in whole.
    pub fn call(&self) -> Arc<Call> {
        Arc::clone(&self.call)
    }

    /// Its answer is made.
    pub fn answered(&self) {
        self.call.answered();
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.call.answered();
        let activity = &self.call.activity;
        if let Some(quarter) = self.quarter {
            activity.ring[slot(quarter)].fetch_sub(1, Ordering::Relaxed);
            activity.port_calls.fetch_sub(1, Ordering::Relaxed);
        }
        activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's I/O: marks the client as having spoken once it sent
/// [`SPOKE_AFTER`] bytes.
pub struct Watched<IO> {
    io: IO,
    read: usize,
    activity: Arc<Activity>,
}

impl<IO> Watched<IO> {
    pub fn new(io: IO, activity: Arc<Activity>) -> Self {
        Self {
            io,
            read: 0,
            activity,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.read < SPOKE_AFTER {
            self.read += buf.filled().len() - before;
            if self.read >= SPOKE_AFTER {
                self.activity.spoke.store(true, Ordering::Relaxed);
            }
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_held_past_the_request_timeout_is_found_and_only_then() {
        let port_calls = Arc::new(AtomicUsize::new(0));
        let activity = Arc::new(Activity::new(Duration::from_secs(4), port_calls.clone()));
        let quick = activity.begin(true, 10).expect("room");
        let streaming = activity.begin(false, 10).expect("room");
        let held = activity.begin(true, 2).expect("room");
        held.call().received();
        assert_eq!(activity.working(), 1, "its request is in: worked on");
        assert!(
            activity.begin(true, 2).is_none(),
            "two bounded calls: the bound"
        );
        assert!(
            activity.begin(false, 2).is_some(),
            "streams are not counted"
        );
        assert_eq!(port_calls.load(Ordering::Relaxed), 2);
        drop(quick);
        assert_eq!(activity.in_flight(), 2);
        let at = |seconds: u64| activity.born + Duration::from_secs(seconds);
        for second in 1..=15 {
            // Begun in quarter 0 (a second each): found from quarter 6 on.
            assert_eq!(
                activity.stalled(at(second)),
                second >= 6,
                "after {second} s"
            );
        }
        held.answered();
        assert_eq!(activity.working(), 0, "answered: no longer worked on");
        drop(held);
        assert!(!activity.stalled(at(10)), "answered: nothing held");
        assert!(
            !activity.stalled(at(70)),
            "a stream that stays open by design is never held"
        );
        drop(streaming);
        assert_eq!(activity.in_flight(), 0);
        assert_eq!(port_calls.load(Ordering::Relaxed), 0);
        assert_eq!(activity.begun(), 4);
    }
}
