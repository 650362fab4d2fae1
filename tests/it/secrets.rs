//! Redis passwords never reach the logs: `tollgate serve` (a child process, as an
//! operator runs it) at `LOG_LEVEL=debug`, in text and in JSON, with the password in
//! `REDIS_AUTH` or in the URL, right (the server starts, decides, reloads and stops)
//! or wrong (the start fails, saying why), against the harness's Redis with an ACL
//! user. Whatever it prints, on stdout or stderr, must not contain the password.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use common::process::{self, Server};

const USER: &str = "tollgate_secrets";
/// Distinctive, so a leak cannot be a coincidence; also tried URL-encoded.
const PASSWORD: &str = "Pa55-secrets-7f3a9c2e";
const WRONG: &str = "Wr0ng-secrets-b81d44f0";
const FORMATS: [&str; 2] = ["text", "json"];

/// The harness's Redis, with an ACL user whose password is [`PASSWORD`].
fn redis_addr() -> &'static str {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        let redis = common::redis::standalone();
        let password = format!(">{PASSWORD}");
        redis.cli(&["ACL", "SETUSER", USER, "on", &password, "~*", "+@all"]);
        redis.addr()
    })
}

fn config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.yaml"),
        "domain: secrets\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .unwrap();
    dir
}

/// `serve` at debug level in `format`, with `env` on top.
fn serve(format: &str, config: &Path, ports: (u16, u16), env: &[(&str, String)]) -> Command {
    let mut command = process::tollgate();
    command
        .args(["serve", "--config"])
        .arg(config)
        .args(["--grpc-addr", &format!("127.0.0.1:{}", ports.0)])
        .args(["--http-addr", &format!("127.0.0.1:{}", ports.1)])
        .args(["--drain-seconds", "0"])
        .env("LOG_LEVEL", "debug")
        .env("LOG_FORMAT", format);
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

fn assert_no_secret(output: &str, secret: &str, what: &str) {
    for form in [secret.to_owned(), secret.replace('-', "%2D")] {
        assert!(
            !output.contains(&form),
            "{what}: the password appears in the output:\n{output}"
        );
    }
}

/// Starts, serves a few decisions (one denied), reloads on SIGHUP, stops; then checks
/// everything it printed.
fn serves_without_leaking(env: &[(&str, String)], what: &str) {
    for format in FORMATS {
        let dir = config_dir();
        let ports = process::free_ports();
        let mut server = Server::spawn(serve(format, dir.path(), ports, env));
        server.wait_until_serving(ports.0);
        for _ in 0..3 {
            process::check(&server, ports.0, "secrets", "user=alice");
        }
        let pid = server.child.id().to_string();
        let hup = Command::new("kill").args(["-HUP", &pid]).status();
        assert!(hup.expect("run kill").success());
        let (status, log) = stop(server);
        assert!(status.success(), "{what} ({format}): exit {status}:\n{log}");
        assert!(
            log.contains("connected to Redis"),
            "{what} ({format}): the debug log is there:\n{log}"
        );
        if format == "json" {
            assert!(log.lines().any(|l| l.starts_with('{')), "{log}");
        }
        assert_no_secret(&log, PASSWORD, &format!("{what} ({format})"));
    }
}

/// SIGTERM; the exit status and everything printed (the log file goes with `server`).
fn stop(mut server: Server) -> (std::process::ExitStatus, String) {
    let pid = server.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(kill.expect("run kill").success());
    let status = process::wait_for_exit(&mut server.child, process::DEADLINE)
        .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", server.log()));
    (status, server.log())
}

/// The start fails (exit 2) and says why, without the password it was given.
fn refused_without_leaking(env: &[(&str, String)], secret: &str, what: &str) {
    for format in FORMATS {
        let dir = config_dir();
        let ports = process::free_ports();
        let out = process::run(&mut serve(format, dir.path(), ports, env));
        let printed = format!(
            "{}{}",
            process::text(&out.stdout),
            process::text(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{what} ({format}):\n{printed}");
        assert!(
            printed.contains("authentication failed") || printed.contains("WRONGPASS"),
            "{what} ({format}): says why:\n{printed}"
        );
        assert_no_secret(&printed, secret, &format!("{what} ({format})"));
    }
}

#[test]
fn password_in_redis_auth_is_never_logged() {
    let env = [
        ("REDIS_URL", redis_addr().to_owned()),
        ("REDIS_AUTH", format!("{USER}:{PASSWORD}")),
    ];
    serves_without_leaking(&env, "REDIS_AUTH");
}

#[test]
fn password_in_the_url_is_never_logged() {
    let env = [(
        "REDIS_URL",
        format!("redis://{USER}:{PASSWORD}@{}/0", redis_addr()),
    )];
    serves_without_leaking(&env, "password in REDIS_URL");
}

#[test]
fn wrong_password_in_redis_auth_is_refused_without_being_logged() {
    let env = [
        ("REDIS_URL", redis_addr().to_owned()),
        ("REDIS_AUTH", format!("{USER}:{WRONG}")),
    ];
    refused_without_leaking(&env, WRONG, "wrong REDIS_AUTH");
}

#[test]
fn wrong_password_in_the_url_is_refused_without_being_logged() {
    let env = [(
        "REDIS_URL",
        format!("redis://{USER}:{WRONG}@{}/0", redis_addr()),
    )];
    refused_without_leaking(&env, WRONG, "wrong password in REDIS_URL");
}
