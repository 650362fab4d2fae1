//! `tollgate migrate-check [--env-file F] CONFIG`: for one environment (the process's,
//! or the `KEY=VALUE` lines of F) and one config set, every way `tollgate serve` will
//! behave differently from envoyproxy/ratelimit: settings refused or ignored (with
//! what to do instead), a config that does not load, and the documented differences
//! that apply to this config (docs/migration.md). Exit 0 when nothing differs, 1 when
//! something does, 2 when the environment file cannot be read.
//!
//! It names upstream's variables to explain them; `settings/` is what reads them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::console;
use crate::config::{Config, FailureMode, RuleKind};
use crate::settings::{ServeFlags, ServeSettings, compat, parse_bool};

#[derive(Debug, clap::Args)]
pub struct MigrateCheckArgs {
    /// KEY=VALUE lines (a Kubernetes env list or a .env file) instead of the process environment
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// The config directory (or file) envoyproxy/ratelimit serves today
    pub config: PathBuf,
}

pub fn run(args: MigrateCheckArgs) -> ExitCode {
    let env: HashMap<String, String> = match &args.env_file {
        Some(file) => match read_env_file(file) {
            Ok(env) => env,
            Err(message) => {
                console::eprintln(&format!("tollgate migrate-check: {message}"));
                return ExitCode::from(2);
            }
        },
        None => std::env::vars().collect(),
    };
    let var = |name: &str| env.get(name).filter(|v| !v.trim().is_empty()).cloned();
    let differences = differences(&var, &args.config);
    let mut text = String::new();
    for line in &differences {
        let _ = writeln!(text, "{line}");
    }
    let _ = writeln!(
        text,
        "{} difference(s) from envoyproxy/ratelimit for {}",
        differences.len(),
        args.config.display()
    );
    let printed = console::print_or_report("migrate-check", &text);
    if !differences.is_empty() || !printed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Every difference, one line each, settings first.
pub fn differences(var: &dyn Fn(&str) -> Option<String>, path: &Path) -> Vec<String> {
    let mut out = setting_differences(var);
    match crate::server::reload::load_set(path) {
        Ok(set) => out.extend(behaviour_differences(var, &set.config)),
        Err(error) => {
            for message in error.messages() {
                out.push(format!("config: {message}"));
            }
        }
    }
    out
}

/// What the environment alone changes: settings refused or ignored, and defaults
/// that differ (statsd, the store, health following Redis).
fn setting_differences(var: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    // serve names every refused setting, one line each.
    if let Err(error) = ServeSettings::resolve(&ServeFlags::default(), var) {
        for refused in error.to_string().lines() {
            out.push(format!("setting {refused} (serve refuses to start)"));
        }
    }
    for (name, reason) in compat::ignored(var) {
        let value = var(name).unwrap_or_default();
        if !compat::agrees(name, &value) {
            out.push(format!("setting {name}={value} is ignored: {reason}"));
        }
    }
    // Upstream's default is statsd on: unset means the metrics users have go missing.
    if var("USE_STATSD").is_none() {
        out.push(
            "metrics: upstream sends statsd by default (USE_STATSD unset); tollgate serves \
             Prometheus at /metrics on the HTTP port instead (set USE_STATSD=false upstream \
             to match)"
                .to_owned(),
        );
    }
    if var("REDIS_URL").is_none() {
        out.push(
            "backend: REDIS_URL is unset: tollgate counts in memory, per process (upstream \
             connects to its default Redis socket); set REDIS_URL to share counters"
                .to_owned(),
        );
    }
    // The environment alone decides it: named even when the config does not load.
    if var("REDIS_URL").is_some() && var("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION").is_none() {
        out.push(
            "health: an unreachable Redis makes tollgate NOT_SERVING \
             (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION defaults to true here, false upstream); \
             set it to false to match"
                .to_owned(),
        );
    }
    out
}

/// The documented differences that apply to this config under this environment.
fn behaviour_differences(var: &dyn Fn(&str) -> Option<String>, config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let domains = config.domains();
    let limited: Vec<&str> = domains
        .iter()
        .filter(|d| {
            d.rules
                .iter()
                .any(|r| matches!(r.kind, RuleKind::Limited(_)))
        })
        .map(|d| &*d.name)
        .collect();
    let stops = var("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT").and_then(|v| parse_bool(&v));
    if !limited.is_empty() && stops != Some(true) {
        out.push(format!(
            "behaviour: a denied request consumes nothing (upstream counts it unless \
             STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true): domains {}",
            limited.join(", ")
        ));
    }
    let fail_open: Vec<&str> = domains
        .iter()
        .filter(|d| d.failure_mode == FailureMode::Allow && limited.contains(&&*d.name))
        .map(|d| &*d.name)
        .collect();
    if var("REDIS_URL").is_some() && !limited.is_empty() {
        out.push(format!(
            "switch: tollgate's Redis keys are its own, so every counter starts from zero \
             when it takes over (upstream's counts are not read): domains {}",
            limited.join(", ")
        ));
    }
    if var("REDIS_URL").is_some() && !fail_open.is_empty() {
        out.push(format!(
            "behaviour: on a Redis error tollgate answers OK (failure_mode: allow, the \
             default) where upstream returns an error for Envoy's failure_mode_deny to \
             decide; set failure_mode: error to match: domains {}",
            fail_open.join(", ")
        ));
    }
    out
}

/// `KEY=VALUE` lines; blank lines and `#` comments skipped, `export ` and one pair of
/// surrounding quotes allowed.
fn read_env_file(path: &Path) -> Result<HashMap<String, String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut env = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!(
                "{}:{}: expected KEY=VALUE, got '{line}'",
                path.display(),
                number + 1
            ));
        };
        let value = value.trim();
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        env.insert(key.trim().to_owned(), unquoted.to_owned());
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_take_comments_exports_and_quotes_and_name_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("env");
        std::fs::write(&file, "# c\n\nexport A=1\nB=\"two words\"\nC='x'\n").unwrap();
        let env = read_env_file(&file).unwrap();
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two words");
        assert_eq!(env["C"], "x");
        std::fs::write(&file, "A=1\nnonsense\n").unwrap();
        assert!(
            read_env_file(&file)
                .unwrap_err()
                .ends_with(":2: expected KEY=VALUE, got 'nonsense'")
        );
    }
}
