//! Logs that can never stall a request: tracing-appender's lossy `non_blocking`
//! writer puts every log line into a bounded queue, and its thread writes the queue
//! to stderr. When stderr does not take lines (a pipe nobody drains: a stuck log
//! shipper), the queue fills and further lines are dropped and counted instead of
//! blocking whoever logs: blocked, every task that logs would wait in `write(2)`, and
//! with an event per request every ShouldRateLimit call would run into its deadline
//! (`tests/it/stuck_stderr.rs` fills such a pipe). The crate's count of dropped lines
//! is `tollgate_log_lines_dropped_total`; once stderr takes lines again, one line says
//! how many were dropped (`event=log_lines_dropped`), written from the queue's
//! thread, which is the one that sees stderr drain.
//!
//! What is ours around the crate: that report, and [`flush`]. The crate flushes when
//! its `WorkerGuard` is dropped, and that drop, when the queue is full (stderr stuck:
//! the case all this is for), prints a message to stdout, which in a container is the
//! same stuck pipe: the exit would hang there. So the guard is never dropped, and
//! [`flush`] waits, bounded, until the thread has written every line queued before it.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::MakeWriter;

/// Lines the queue holds: a burst of this many lines while stderr is slow loses none
/// (stderr to a file or the kubelet's pipe takes thousands of lines a millisecond, so
/// only a stuck reader fills it). A line is a few hundred bytes: under 1 MiB queued.
pub const QUEUE_LINES: usize = 2048;

/// The process's one queue to stderr, started on first use.
static STDERR: OnceLock<Queue> = OnceLock::new();

/// The writer the log layer formats into: each event is one queued line.
pub fn stderr() -> Stderr {
    Stderr
}

/// Log lines dropped since start-up because stderr did not take them.
pub fn dropped_lines() -> u64 {
    STDERR.get().map_or(0, Queue::dropped_lines)
}

/// Waits at most `within` for the log lines queued so far to reach stderr: the last
/// lines of a process (why it stopped) must not die in the queue.
pub fn flush(within: Duration) -> bool {
    STDERR.get().is_none_or(|queue| queue.flush(within))
}

/// [`STDERR`] as a [`MakeWriter`] the log layer can own.
#[derive(Clone, Copy, Debug)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        STDERR
            .get_or_init(|| Queue::start(QUEUE_LINES, std::io::stderr()))
            .make_writer()
    }
}

/// A queue and the thread that writes it to a sink.
struct Queue {
    writer: NonBlocking,
    progress: Arc<Progress>,
    /// Never dropped: see the module's doc.
    _guard: WorkerGuard,
}

/// What the thread has done, shared with the writers and [`Queue::flush`].
#[derive(Default)]
struct Progress {
    /// The crate's count of dropped lines (set once the queue exists).
    dropped: OnceLock<ErrorCounter>,
    /// Lines given to the queue, counted once the crate has taken or dropped each.
    sent: AtomicU64,
    /// Lines written (or lost to a closed sink), and the drops already reported.
    written: Mutex<(u64, u64)>,
    wrote: Condvar,
}

impl Progress {
    fn dropped(&self) -> u64 {
        self.dropped
            .get()
            .map_or(0, |d| u64::try_from(d.dropped_lines()).unwrap_or(u64::MAX))
    }

    fn written(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Queue {
    fn start<W: Write + Send + Sync + 'static>(lines: usize, sink: W) -> Queue {
        let progress = Arc::new(Progress::default());
        let sink = Sink {
            sink,
            progress: progress.clone(),
        };
        let (writer, guard) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(lines)
            .thread_name("tollgate-logs")
            .finish(sink);
        let _ = progress.dropped.set(writer.error_counter());
        Queue {
            writer,
            progress,
            _guard: guard,
        }
    }

    fn dropped_lines(&self) -> u64 {
        self.progress.dropped()
    }

    fn make_writer(&self) -> Line {
        Line {
            writer: self.writer.clone(),
            progress: self.progress.clone(),
        }
    }

    fn flush(&self, within: Duration) -> bool {
        // Queued before this call: given and not dropped (a line racing this call may
        // or may not be waited for).
        let progress = &self.progress;
        let queued = progress
            .sent
            .load(Ordering::Acquire)
            .saturating_sub(progress.dropped());
        let deadline = Instant::now() + within;
        let mut written = progress.written();
        while written.0 < queued {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            written = progress
                .wrote
                .wait_timeout(written, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// One event: the log layer writes it whole, in one call, which the crate queues as
/// one line (or drops and counts).
pub struct Line {
    writer: NonBlocking,
    progress: Arc<Progress>,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.writer.write(bytes);
        self.progress.sent.fetch_add(1, Ordering::Release);
        written
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The sink as the queue's thread writes to it: each line counted (for
/// [`Queue::flush`]), and after a line that got through, the drops not yet reported,
/// as one log line of their own (queued behind the lines already waiting, so they
/// keep their order).
struct Sink<W> {
    sink: W,
    progress: Arc<Progress>,
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.write_all(bytes).map(|()| bytes.len())
    }

    /// The crate hands over one whole line per call.
    fn write_all(&mut self, line: &[u8]) -> std::io::Result<()> {
        // A closed sink loses the line; nothing else can be done with it.
        let result = self.sink.write_all(line);
        let dropped = self.progress.dropped();
        let unreported = {
            let mut written = self.progress.written();
            written.0 += 1;
            let unreported = dropped.saturating_sub(written.1);
            if result.is_ok() {
                written.1 = dropped;
            }
            unreported
        };
        self.progress.wrote.notify_all();
        if result.is_ok() && unreported > 0 {
            tracing::warn!(
                event = "log_lines_dropped",
                dropped = unreported,
                "stderr did not take log lines for a while: {unreported} were dropped"
            );
        }
        result
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sink.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that blocks until the test opens it, then keeps what it is given.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
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
        let queue = Queue::start(4, gate.clone());
        let began = Instant::now();
        for i in 0..100 {
            let mut line = queue.make_writer();
            line.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        // One line is held by the stuck write, four wait in the queue.
        assert!(queue.dropped_lines() >= 95, "{}", queue.dropped_lines());
        assert!(!queue.flush(Duration::from_millis(50)), "the sink is stuck");
        {
            let (open, changed) = &*gate.open;
            *open.lock().unwrap() = true;
            changed.notify_all();
        }
        assert!(queue.flush(Duration::from_secs(10)));
        let taken = String::from_utf8(gate.taken.lock().unwrap().clone()).unwrap();
        assert!(taken.starts_with("line 0\nline 1\n"), "{taken}");
        assert!(!taken.contains("line 99"), "{taken}");
        let lines = taken.lines().count() as u64;
        assert_eq!(lines + queue.dropped_lines(), 100, "{taken}");
    }
}
