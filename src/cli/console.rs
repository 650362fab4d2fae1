//! The CLI's only way to stdout and stderr. A reader that stops early (`tollgate
//! validate config | head -3`) closes the pipe: `print!` would panic on that EPIPE
//! (the runtime ignores SIGPIPE, so the write fails instead of killing us, and the
//! crate forbids `unsafe` to restore the signal). Here a closed pipe ends the output
//! quietly and the command still returns its own exit code, so scripts that read
//! `$?` (or `pipefail`) see the decision, not the pipe.

use std::io::{self, Write};

/// Writes `text` to stdout and flushes. A closed pipe is not an error (the reader has
/// all it wanted); any other failure is returned for the caller to report.
pub fn write_stdout(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes `text` to stderr. Errors are dropped: stderr is where failures are
/// reported, so there is nowhere left to report its own.
pub fn eprint(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr
        .write_all(text.as_bytes())
        .and_then(|()| stderr.flush());
}

/// [`eprint`] with a newline.
pub fn eprintln(text: &str) {
    eprint(&format!("{text}\n"));
}

/// [`print`] for a command's result: on a failure other than a closed pipe, says so
/// on stderr and returns false (the command then exits with 2).
pub fn print_or_report(command: &str, text: &str) -> bool {
    match write_stdout(text) {
        Ok(()) => true,
        Err(e) => {
            eprintln(&format!("tollgate {command}: cannot write to stdout: {e}"));
            false
        }
    }
}
