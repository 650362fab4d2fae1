//! Teardown of this run's servers: the run directory, the watchdog, and the `atexit`
//! clean-up, so no server (not even a zombie) outlives the test binary.
//!
//! A Rust test binary never drops its statics, so the first server start also launches
//! one watchdog (`sh`) whose stdin is a pipe whose only write end the test process holds.
//! When the test process ends, for any reason (success, panic, SIGKILL), the pipe closes;
//! the watchdog then SIGKILLs every server recorded in this run's root directory
//! (`<tmp>/tollgate-redis-XXXX/<node>/pid`) and deletes that directory. The watchdog
//! runs in its own process group and ignores HUP/INT/TERM, so a Ctrl-C on the test run
//! does not stop it before it has cleaned up. On a normal exit an `atexit` hook does the
//! same first, synchronously, and also reaps the processes.

use std::ffi::c_int;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// This run's directory of server directories, the servers, and the watchdog.
pub(super) struct RunRoot {
    pub(super) dir: PathBuf,
    /// Servers started by this process: killed and reaped by [`clean_up_at_exit`].
    pub(super) servers: Mutex<Vec<Child>>,
    /// The watchdog, and the write end of its stdin (its lifeline).
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

static RUN_ROOT: OnceLock<RunRoot> = OnceLock::new();

/// Waits for EOF on stdin (the test process is gone, or let it go at exit), then
/// SIGKILLs every recorded server (only if its command line still names redis-server,
/// against pid reuse) and removes the run directory, `$1`. (The script spells the name
/// `redis-serve[r]` so that `pgrep -f redis-server` does not match the watchdog.)
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT TERM PIPE
root=$1
while read -r _line; do :; done
ours() { [ ! -d /proc ] || grep -q 'redis-serve[r]' "/proc/$1/cmdline" 2>/dev/null; }
pids=
for f in "$root"/*/pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    ours "$p" && pids="$pids $p"
done
if [ -n "$pids" ]; then
    kill -KILL $pids 2>/dev/null
    n=0
    while [ $n -lt 100 ]; do
        alive=
        for p in $pids; do ours "$p" && alive="$alive $p"; done
        [ -z "$alive" ] && break
        n=$((n + 1))
        sleep 0.02
    done
fi
rm -rf "$root"
"#;

// atexit(3) has no safe wrapper in std.
#[allow(unsafe_code)]
unsafe extern "C" {
    /// C `atexit(3)`. libtest ends the process with `exit`, which runs these callbacks.
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// This run's root, created with its watchdog and `atexit` hook on first use.
pub(super) fn run_root() -> &'static RunRoot {
    RUN_ROOT.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-redis-")
            .tempdir()
            .unwrap_or_else(|error| panic!("redis harness: cannot create a temp dir: {error}"))
            .keep();
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("tollgate-redis-watchdog")
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|error| panic!("redis harness: cannot start the watchdog sh: {error}"));
        let lifeline = watchdog
            .stdin
            .take()
            .expect("the watchdog's stdin is piped");
        // SAFETY: registers a plain `extern "C" fn` that never unwinds; failure to
        // register only leaves the clean-up to the watchdog.
        #[allow(unsafe_code)]
        unsafe {
            atexit(clean_up_at_exit);
        }
        RunRoot {
            dir,
            servers: Mutex::new(Vec::new()),
            watchdog: Mutex::new(Some((watchdog, lifeline))),
        }
    })
}

/// On a normal exit (all tests done, passed or failed): kills and reaps the servers,
/// removes the run directory, then releases the watchdog and reaps it, so the binary
/// leaves neither processes nor zombies behind. (After SIGKILL or abort the watchdog
/// does the same, minus the reaping.) Must not panic: it is called from C.
extern "C" fn clean_up_at_exit() {
    let Some(root) = RUN_ROOT.get() else {
        return;
    };
    if let Ok(mut servers) = root.servers.try_lock() {
        for child in servers.iter_mut() {
            let _ = child.kill();
        }
        for child in servers.iter_mut() {
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&root.dir);
    }
    let Ok(mut watchdog) = root.watchdog.try_lock() else {
        return;
    };
    if let Some((mut watchdog, lifeline)) = watchdog.take() {
        drop(lifeline);
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(None) = watchdog.try_wait() {
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
}
