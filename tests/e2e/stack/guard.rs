//! Child processes of the Envoy stack (Envoy, the upstream, the tollgate replicas) that
//! cannot outlive the test binary.
//!
//! [`Guarded`] kills and reaps its process on drop, which covers passing and panicking
//! tests. For the rest (the binary SIGKILLed, aborted, or stopped by Ctrl-C) one
//! watchdog `sh` per binary holds the read end of a pipe whose write end only this
//! process has; when the pipe closes it SIGKILLs every process still recorded in this
//! run's directory (one `<n>.pid` file per process: pid and a command-line marker,
//! checked against `/proc/<pid>/cmdline` so a reused pid is never killed), then removes
//! the directory. Same scheme as the Redis harness (`redis/teardown.rs`), which cannot
//! be reused as is: it only kills `redis-server`s.

use std::ffi::c_int;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Reads pid files `<pid> <marker>` after EOF on stdin; kills those whose command
/// line still contains the marker; removes the run directory `$1`.
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT TERM PIPE
root=$1
while read -r _line; do :; done
for f in "$root"/*.pid; do
    [ -f "$f" ] || continue
    read -r p m < "$f" || continue
    if tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$m"; then
        kill -KILL "$p" 2>/dev/null
    fi
done
rm -rf "$root"
"#;

struct Watchdog {
    dir: PathBuf,
    lifeline: Mutex<Option<(Child, ChildStdin)>>,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

// atexit(3) has no safe wrapper in std.
#[allow(unsafe_code)]
unsafe extern "C" {
    /// C `atexit(3)`; libtest ends the process with `exit`, which runs it.
    fn atexit(callback: extern "C" fn()) -> c_int;
}

fn watchdog() -> &'static Watchdog {
    WATCHDOG.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-e2e-")
            .tempdir()
            .expect("e2e harness: temp dir")
            .keep();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("tollgate-e2e-watchdog")
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("e2e harness: cannot start the watchdog sh");
        let lifeline = child.stdin.take().expect("piped stdin");
        // SAFETY: registers a plain `extern "C" fn` that never unwinds.
        #[allow(unsafe_code)]
        unsafe {
            atexit(release_watchdog);
        }
        Watchdog {
            dir,
            lifeline: Mutex::new(Some((child, lifeline))),
        }
    })
}

/// At a normal exit every [`Guarded`] was dropped already: let the watchdog go (it
/// finds nothing to kill and removes the directory) and reap it, so no zombie stays.
extern "C" fn release_watchdog() {
    let Some(watchdog) = WATCHDOG.get() else {
        return;
    };
    let Ok(mut slot) = watchdog.lifeline.try_lock() else {
        return;
    };
    if let Some((mut child, lifeline)) = slot.take() {
        drop(lifeline);
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(None) = child.try_wait() {
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// This run's directory, which the watchdog removes: stacks keep their files in it,
/// so nothing is left behind even if the binary is killed.
pub fn run_dir() -> &'static Path {
    &watchdog().dir
}

/// A record in the watchdog's directory; removing it on drop means "already handled".
pub struct PidRecord(PathBuf);

impl PidRecord {
    /// Records `pid`, which the watchdog kills if its command line contains `marker`.
    pub fn new(pid: u32, marker: &str) -> PidRecord {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = watchdog().dir.join(format!("{n}.pid"));
        fs::write(&path, format!("{pid} {marker}\n"))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        PidRecord(path)
    }
}

impl Drop for PidRecord {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A child process with its output in a log file, killed and reaped on drop.
pub struct Guarded {
    name: String,
    child: Child,
    log: PathBuf,
    _record: PidRecord,
}

impl Guarded {
    /// Spawns `command` with stdout and stderr to `<dir>/<name>.log`. The watchdog
    /// identifies the process by `marker` (a string of its command line).
    pub fn spawn(name: &str, dir: &Path, marker: &str, mut command: Command) -> Guarded {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log handle");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
        let record = PidRecord::new(child.id(), marker);
        Guarded {
            name: name.to_owned(),
            child,
            log,
            _record: record,
        }
    }

    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Panics with the log tail if the process has ended.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            panic!("{} exited with {status}\n{}", self.name, self.log_tail(40));
        }
    }

    /// Whether its output so far contains `needle`.
    pub fn log_contains(&self, needle: &str) -> bool {
        fs::read_to_string(&self.log).is_ok_and(|text| text.contains(needle))
    }

    /// The last `lines` lines of its output, headed by its name.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        let _ = File::open(&self.log).and_then(|mut f| f.read_to_string(&mut text));
        let all: Vec<&str> = text.lines().collect();
        let tail = all[all.len().saturating_sub(lines)..].join("\n");
        format!("--- {} ({}):\n{tail}", self.name, self.log.display())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
