//! The docs' sample outputs are what the program prints, so they cannot drift (two
//! did: `validate`'s message for a mistyped `requests_per_unit`, and its list of
//! algorithms once `concurrency` joined it).
//!
//! - Every fenced block of README.md and docs/*.md whose first line is
//!   `$ tollgate <arguments>` is run (from the repository root, in an empty
//!   environment) and must print the rest of the block, stdout then stderr.
//! - README's walkthrough: `serve` on `config/` answers the README's `check` loop and
//!   its `/json` call as the README says it does.

use std::fs;

use crate::common::process::{Server, check, free_ports, root, run, text, tollgate};

/// `(file, command line, expected output)` of every `$ tollgate` block.
fn samples() -> Vec<(String, String, String)> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<_> = fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut samples = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("read a doc");
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if !line.starts_with("```") {
                continue;
            }
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            if let Some(command) = block.first().and_then(|l| l.strip_prefix("$ tollgate ")) {
                let name = file
                    .strip_prefix(root())
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                samples.push((name, command.to_owned(), block[1..].join("\n")));
            }
        }
    }
    samples
}

#[test]
fn every_sample_output_in_the_docs_is_what_tollgate_prints() {
    let samples = samples();
    let commands: Vec<&str> = samples.iter().map(|(_, c, _)| c.as_str()).collect();
    // The two the docs must keep: a failing validate and a migrate-check.
    assert!(
        commands.iter().any(|c| c.starts_with("validate "))
            && commands.iter().any(|c| c.starts_with("migrate-check ")),
        "{commands:?}"
    );
    for (file, command, expected) in &samples {
        let out = run(tollgate().args(command.split_whitespace()));
        let printed = text(&out.stdout) + &text(&out.stderr);
        assert_eq!(
            printed.trim_end(),
            expected.trim_end(),
            "{file}: `tollgate {command}` prints something else than the doc shows"
        );
    }
}

/// The README's first 429, as it tells it: ten OKs and an OVER_LIMIT from `check`,
/// then a 429 from `POST /json`; each line the README shows is printed.
#[test]
fn the_readme_walkthrough_answers_as_the_readme_says() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .arg("--config")
        .arg(root().join("config"))
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--drain-seconds", "0"]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    let lasts: Vec<String> = (0..11)
        .map(|_| {
            let table = check(&server, grpc, "login", "remote_address=10.1.2.3");
            table.lines().last().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(lasts[..10], vec!["overall: OK".to_owned(); 10], "{lasts:?}");
    assert_eq!(lasts[10], "overall: OVER_LIMIT", "{lasts:?}");
    for shown in ["overall: OK", "overall: OVER_LIMIT"] {
        assert!(
            readme.contains(shown),
            "README.md no longer shows '{shown}'"
        );
    }
    let json = json_call(http);
    assert!(json.ends_with(" 429"), "{json}");
    assert!(json.contains(r#""overallCode":"OVER_LIMIT""#), "{json}");
    assert!(
        readme.contains(r#"{"overallCode":"OVER_LIMIT""#),
        "README.md: /json"
    );
    let (status, _) = server.stop();
    assert!(status.success());
}

/// README's `curl -s -w ' %{http_code}\n' -X POST localhost:8080/json -d ...`, as text.
fn json_call(http: u16) -> String {
    let body = r#"{"domain":"login","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.2.3"}]}]}"#;
    let out = std::process::Command::new("curl")
        .args(["-s", "-w", " %{http_code}", "-X", "POST"])
        .arg(format!("127.0.0.1:{http}/json"))
        .args(["-d", body])
        .output()
        .expect("run curl");
    text(&out.stdout)
}
