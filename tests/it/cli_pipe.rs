//! No panic on a closed pipe: `tollgate validate config | head -1` must end quietly,
//! where `println!` panics on EPIPE. Each command here writes to a pipe whose reader is already
//! gone, so the very first write fails with EPIPE (a reader that closes after the
//! first line races with a command that writes everything at once, and would let
//! the test pass without ever hitting the error). The process must end by its own
//! exit code: never 101, never "panicked" on stderr.

use crate::common;

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};

use common::process::{run, text, tollgate};

/// Runs `command` with stdout a pipe whose read end is closed; returns the exit status
/// and what it wrote on stderr.
fn with_closed_stdout(command: &mut Command) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (child.wait().expect("wait"), stderr)
}

fn assert_no_panic(what: &str, status: ExitStatus, stderr: &str) {
    assert_ne!(status.code(), Some(101), "{what} panicked: {stderr}");
    assert!(status.code().is_some(), "{what} died of a signal: {status}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
}

#[test]
fn commands_writing_into_a_closed_pipe_exit_cleanly() {
    let cases: [(&str, &[&str], i32); 4] = [
        ("validate config", &["validate", "config"], 0),
        ("simulate", &["simulate", "--pattern", "boundary"], 0),
        ("check --help", &["check", "--help"], 0),
        ("inspect --help", &["inspect", "--help"], 0),
    ];
    for (what, args, code) in cases {
        // The same command with a reader present prints something (so the closed
        // pipe above really was written to).
        let out = run(tollgate().args(args));
        assert!(!out.stdout.is_empty(), "{what} printed nothing");

        let (status, stderr) = with_closed_stdout(tollgate().args(args));
        assert_no_panic(what, status, &stderr);
        assert_eq!(status.code(), Some(code), "{what}: {stderr}");
    }
}

#[test]
fn errors_written_into_a_closed_pipe_keep_their_exit_code() {
    // validate's errors go to stderr: close that one instead.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.yaml"), "domain: b\nbogus: true\n").unwrap();
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let status = tollgate()
        .arg("validate")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(writer)
        .status()
        .expect("run validate");
    assert_eq!(status.code(), Some(1), "{status}");

    // check's table into a closed pipe still reports the outcome: 2, nothing listening.
    let (status, stderr) = with_closed_stdout(tollgate().args([
        "check",
        "--addr",
        "127.0.0.1:1",
        "--domain",
        "d",
        "--descriptor",
        "k=v",
    ]));
    assert_no_panic("check", status, &stderr);
    assert_eq!(status.code(), Some(2), "{}", text(stderr.as_bytes()));
}
