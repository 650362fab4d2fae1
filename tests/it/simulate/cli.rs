//! The built `tollgate simulate`: the README's boundary run prints the table and writes
//! the chart; a subset of algorithms with a unit and multiplier; a bad CSV names its
//! line; misplaced flags and unknown patterns are refused.

use std::process::Command;

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

#[test]
fn the_cli_prints_the_table_and_writes_the_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("boundary.svg");
    let out = tollgate()
        .args(["simulate", "--pattern", "boundary", "--svg"])
        .arg(&chart)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "ALGORITHM",
        "ADMITTED",
        "DENIED",
        "MAX IN ANY 1 min",
        "LONGEST WAIT",
        "limit    10 per 1 min",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected} in:\n{stdout}"
        );
    }
    let row = |name: &str| {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{stdout}"));
        line.split_whitespace()
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("fixed_window"), ["20", "0", "20", "0"]);
    assert_eq!(row("sliding_log"), ["10", "10", "10", "0"]);
    assert_eq!(row("leaky_bucket"), ["11", "9", "10", "54.0", "s"]);
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.matches("<polyline class=\"series\"").count() == 6);

    // A subset of algorithms, a unit and multiplier, a steady pattern.
    let out = tollgate()
        .args([
            "simulate",
            "--pattern",
            "steady",
            "--rate",
            "2",
            "--unit",
            "second",
            "--unit-multiplier",
            "5",
            "--algorithm",
            "gcra,leaky_bucket",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("limit    10 per 5 s")
            && stdout.contains("gcra")
            && !stdout.contains("fixed_window"),
        "{stdout}"
    );
}

#[test]
fn the_cli_names_the_bad_csv_line() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("traffic.csv");
    std::fs::write(&csv, "timestamp_ms\n1000\n2000,2\n3000,two\n").unwrap();
    let out = tollgate()
        .args(["simulate", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:4: cost 'two'", csv.display())),
        "{stderr}"
    );

    // Flags that do not fit: a clear message, exit 1; an unknown pattern: clap, exit 2.
    let out = tollgate()
        .args(["simulate", "--pattern", "burst", "--rate", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rate applies to the steady pattern"));
    let out = tollgate()
        .args(["simulate", "--pattern", "zigzag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
