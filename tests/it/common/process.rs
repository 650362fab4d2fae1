//! `tollgate serve` as a child process, as an operator runs it: the binary with a
//! clean environment, free ports, readiness by a real call, `check` as a client, and
//! SIGTERM. Every wait is bounded; a panicking test kills its server.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The binary with an empty environment, so no stray REDIS_URL, PORT or SHADOW_MODE of
/// the caller changes what is tested.
pub fn tollgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.env_clear().current_dir(root());
    command
}

pub fn run(command: &mut Command) -> Output {
    command.output().expect("run tollgate")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Two distinct free ports for a server's gRPC and HTTP listeners ([`super::ports`]).
pub fn free_ports() -> (u16, u16) {
    let ports = super::ports::free_ports(2, false);
    (ports[0], ports[1])
}

pub fn wait_for_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `serve` process whose output goes to a log file; killed if the test panics.
pub struct Server {
    pub child: Child,
    log: tempfile::NamedTempFile,
}

impl Server {
    pub fn spawn(mut command: Command) -> Server {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let out = log.reopen().expect("reopen log");
        let err = log.reopen().expect("reopen log");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn tollgate serve");
        Server { child, log }
    }

    pub fn log(&self) -> String {
        let mut text = String::new();
        let _ = File::open(self.log.path()).and_then(|mut f| f.read_to_string(&mut text));
        text
    }

    /// Retries until the gRPC port answers a ShouldRateLimit call (for a domain no
    /// config has, so no counter moves), bounded, failing early if the process exits.
    pub fn wait_until_serving(&mut self, port: u16) {
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + DEADLINE;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("serve exited early with {status}:\n{}", self.log());
            }
            let out = run(tollgate()
                .args(["check", "--addr", &addr, "--timeout-ms", "2000"])
                .args(["--domain", "readiness-probe", "--descriptor", "k=v"]));
            if out.status.success() {
                return;
            }
            last = text(&out.stderr);
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{addr} did not answer within {DEADLINE:?}: {last}\n{}",
            self.log()
        );
    }

    /// SIGTERM, then the exit status within the deadline.
    pub fn terminate(mut self) -> ExitStatus {
        self.sigterm_and_wait()
    }

    /// SIGTERM, then the exit status and the whole log. Assert on a log's lines this
    /// way: a running server writes its lines from a queue of its own, so a read before
    /// the exit can miss the last lines or end inside one; the exit flushes the queue.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let status = self.sigterm_and_wait();
        (status, self.log())
    }

    fn sigterm_and_wait(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(kill.expect("run kill").success(), "kill -TERM {pid} failed");
        match wait_for_exit(&mut self.child, DEADLINE) {
            Some(status) => status,
            None => panic!("no exit within {DEADLINE:?} of SIGTERM:\n{}", self.log()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `tollgate check`'s table; its exit code must be 0 (OK) or 1 (OVER_LIMIT).
pub fn check(server: &Server, port: u16, domain: &str, descriptor: &str) -> String {
    let addr = format!("127.0.0.1:{port}");
    let out = run(tollgate()
        .args(["check", "--addr", &addr, "--domain", domain])
        .args(["--descriptor", descriptor]));
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "check failed: {}\n{}\n--- server log ---\n{}",
        text(&out.stdout),
        text(&out.stderr),
        server.log()
    );
    text(&out.stdout)
}

/// The table row of `descriptor`, split into cells.
pub fn row(table: &str, descriptor: &str) -> Vec<String> {
    table
        .lines()
        .find(|l| l.starts_with(descriptor))
        .unwrap_or_else(|| panic!("no row for {descriptor}:\n{table}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `serve` on free ports with `config` as `file` in a fresh directory, no watcher
/// (reloads by SIGHUP only), no drain, `args` after the defaults and `env`; ready to
/// answer. Returns the server, its directory (kept alive) and the gRPC and HTTP ports.
pub fn serve_config(
    file: &str,
    config: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Server, tempfile::TempDir, u16, u16) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join(file), config).expect("write the config");
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .args(["serve", "--no-watch", "--drain-seconds", "0", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    (server, dir, grpc, http)
}
