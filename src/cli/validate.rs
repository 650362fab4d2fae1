//! `tollgate validate PATH`: the config loader alone. Exit 0 with a summary of the
//! domains and rules, or 1 with every error (file:line: message), one per line.

use std::path::Path;
use std::process::ExitCode;

use crate::config::{self, RuleKind};

pub fn run(path: &Path) -> ExitCode {
    match config::load_path(path) {
        Ok(config) => {
            let domains = config.domains();
            let rules: usize = domains.iter().map(|d| d.rules.len()).sum();
            println!(
                "{}: OK, {} domain(s), {rules} rule(s)",
                path.display(),
                domains.len()
            );
            for domain in domains {
                println!("  domain '{}': {} rule(s)", domain.name, domain.rules.len());
                for rule in &domain.rules {
                    let limit = match &rule.kind {
                        RuleKind::Unlimited => "unlimited".to_owned(),
                        RuleKind::Limited(limits) => {
                            let all: Vec<String> = limits.iter().map(ToString::to_string).collect();
                            all.join(" + ")
                        }
                    };
                    let mut shadow = if rule.shadow_mode {
                        " shadow_mode".to_owned()
                    } else {
                        String::new()
                    };
                    if let Some(t) = rule.tarpit {
                        shadow.push_str(&format!(" tarpit={:?}/{}", t.delay, t.max_concurrent));
                    }
                    println!("    {}: {limit}{shadow}", rule.path);
                }
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for error in &errors.0 {
                eprintln!("{error}");
            }
            eprintln!("{}: {} error(s)", path.display(), errors.0.len());
            ExitCode::FAILURE
        }
    }
}
