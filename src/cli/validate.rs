//! `tollgate validate PATH`: the config loader alone. Exit 0 with a summary of the
//! domains and rules, or 1 with every error (file:line: message), one per line.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use super::console;
use crate::config::{self, Config, RuleKind};

pub fn run(path: &Path) -> ExitCode {
    match config::load_path(path) {
        Ok(config) => {
            if console::print_or_report("validate", &domain_summary(path, &config)) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(errors) => {
            let mut text = String::new();
            for error in &errors.0 {
                let _ = writeln!(text, "{error}");
            }
            let _ = writeln!(text, "{}: {} error(s)", path.display(), errors.0.len());
            console::eprint(&text);
            ExitCode::FAILURE
        }
    }
}

/// The domains and their rules, one line each (written with one write, so a reader
/// that stops early closes the pipe at most once).
fn domain_summary(path: &Path, config: &Config) -> String {
    let domains = config.domains();
    let rules: usize = domains.iter().map(|d| d.rules.len()).sum();
    let mut text = format!(
        "{}: OK, {} domain(s), {rules} rule(s)\n",
        path.display(),
        domains.len()
    );
    for domain in domains {
        let _ = writeln!(
            text,
            "  domain '{}': {} rule(s)",
            domain.name,
            domain.rules.len()
        );
        for rule in &domain.rules {
            let limit = match &rule.kind {
                RuleKind::Unlimited => "unlimited".to_owned(),
                RuleKind::Limited(limits) => {
                    let all: Vec<String> = limits.iter().map(ToString::to_string).collect();
                    all.join(" + ")
                }
            };
            let mut flags = if rule.shadow_mode {
                " shadow_mode".to_owned()
            } else {
                String::new()
            };
            if let Some(t) = rule.tarpit {
                let _ = write!(flags, " tarpit={:?}/{}", t.delay, t.max_concurrent);
            }
            let _ = writeln!(text, "    {}: {limit}{flags}", rule.path);
        }
    }
    text
}
