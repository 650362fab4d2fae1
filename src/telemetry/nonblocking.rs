//! Logs that can never stall a request: every log line goes into a bounded queue, and
//! one thread of its own writes the queue to stderr. When stderr does not take lines
//! (a pipe nobody drains: a stuck log shipper), the queue fills and further lines are
//! dropped and counted instead of blocking whoever logs: blocked, every task that logs
//! would wait in `write(2)`, and with an event per request every ShouldRateLimit call
//! would run into its deadline and `/healthcheck` hang (`tests/it/stuck_stderr.rs`
//! fills such a pipe). Once stderr
//! takes lines again, one line says how many were dropped
//! (`event=log_lines_dropped`), and `tollgate_log_lines_dropped_total` counts them all.
//!
//! Equal to tracing-appender's lossy `non_blocking` writer, written here because the
//! line that reports the drops must come from the writing thread, which sees the
//! sink drain, and because the process must flush the queue before it exits
//! ([`flush`]).

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// Lines the queue holds: a burst of this many lines while stderr is slow loses none
/// (stderr to a file or the kubelet's pipe takes thousands of lines a millisecond, so
/// only a stuck reader fills it). A line is a few hundred bytes: under 1 MiB queued.
pub const QUEUE_LINES: usize = 2048;

/// Lines dropped since start-up (the metric).
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Lines dropped and not yet reported by a log line.
static UNREPORTED: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped since start-up because stderr did not take them.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

enum Message {
    Line(Vec<u8>),
    /// Everything queued before it is written: say so.
    Flush(mpsc::Sender<()>),
}

/// The writer the log layer formats into: each event becomes one queued line.
#[derive(Clone)]
pub struct NonBlocking {
    queue: SyncSender<Message>,
}

/// The process's one queue and writing thread.
static STDERR: OnceLock<NonBlocking> = OnceLock::new();

/// [`STDERR`], started on first use.
pub fn stderr() -> &'static NonBlocking {
    STDERR.get_or_init(|| NonBlocking::start(QUEUE_LINES, std::io::stderr))
}

impl NonBlocking {
    /// A queue of `lines` written by a thread of its own to what `sink` opens.
    fn start<W: Write>(lines: usize, sink: impl FnOnce() -> W + Send + 'static) -> Self {
        let (queue, lines) = mpsc::sync_channel(lines);
        let spawned = std::thread::Builder::new()
            .name("tollgate-logs".into())
            .spawn(move || write_all(&lines, sink()));
        if let Err(error) = spawned {
            // No thread, no logs: the queue fills and every line is counted as dropped.
            let _ = writeln!(std::io::stderr(), "tollgate: no log writer thread: {error}");
        }
        Self { queue }
    }

    fn send(&self, line: Vec<u8>) {
        match self.queue.try_send(Message::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                UNREPORTED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits (at most `within`) until every line queued so far is written.
    fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (done, written) = mpsc::channel();
        let mut message = Message::Flush(done);
        loop {
            match self.queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    message = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return false,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        written.recv_timeout(left).is_ok()
    }
}

/// Waits at most `within` for the log lines queued so far to reach stderr: the last
/// lines of a process (why it stopped) must not die in the queue.
pub fn flush(within: Duration) -> bool {
    STDERR.get().is_none_or(|queue| queue.flush(within))
}

/// The writing thread: one line at a time, in order; after a line that got through,
/// the drops not yet reported, as one log line of their own (queued behind the lines
/// already waiting, so they keep their order).
fn write_all(lines: &Receiver<Message>, mut sink: impl Write) {
    while let Ok(message) = lines.recv() {
        match message {
            Message::Line(line) => {
                // A closed stderr loses the line; nothing else can be done with it.
                if sink.write_all(&line).is_err() {
                    continue;
                }
                let dropped = UNREPORTED.swap(0, Ordering::Relaxed);
                if dropped > 0 {
                    tracing::warn!(
                        event = "log_lines_dropped",
                        dropped,
                        "stderr did not take log lines for a while: {dropped} were dropped"
                    );
                }
            }
            Message::Flush(done) => {
                let _ = sink.flush();
                let _ = done.send(());
            }
        }
    }
}

/// One event's text, queued whole when the log layer is done with it.
pub struct Line<'a> {
    to: &'a NonBlocking,
    text: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if !self.text.is_empty() {
            self.to.send(std::mem::take(&mut self.text));
        }
    }
}

impl<'a> MakeWriter<'a> for NonBlocking {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            to: self,
            text: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink that blocks until the test opens it, then keeps what it is given.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        taken: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let (open, changed) = &*self.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = changed.wait(open).unwrap();
            }
            self.taken.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_sink_drops_and_counts_instead_of_blocking() {
        let gate = Gate::default();
        let sink = gate.clone();
        let writer = NonBlocking::start(4, move || sink);
        let before = dropped_lines();
        let began = Instant::now();
        for i in 0..100 {
            let mut line = writer.make_writer();
            writeln!(line, "line {i}").unwrap();
        }
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        // One line is held by the stuck write, four wait in the queue.
        assert!(
            dropped_lines() - before >= 95,
            "{}",
            dropped_lines() - before
        );
        {
            let (open, changed) = &*gate.open;
            *open.lock().unwrap() = true;
            changed.notify_all();
        }
        assert!(writer.flush(Duration::from_secs(10)));
        let taken = String::from_utf8(gate.taken.lock().unwrap().clone()).unwrap();
        assert!(taken.starts_with("line 0\nline 1\n"), "{taken}");
        assert!(!taken.contains("line 99"), "{taken}");
    }
}
