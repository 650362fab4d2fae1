//! Configuration diagnostics: errors that name the file, the line and the offending
//! field, so a user can go straight to the mistake (loading collects every error, not
//! the first), and the helpers every part of the compiler reports through: the
//! [`Report`] callback, [`key_line`] (which line a key is written on) and
//! [`parse_duration`] (the one duration syntax of the YAML).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One mistake in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; `None` when the mistake has no single line (an unreadable file).
    pub line: Option<u64>,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: &Path, line: Option<u64>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// Every mistake found in a config set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "{n} configuration error{}",
            if n == 1 { "" } else { "s" }
        )?;
        for error in &self.0 {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}

/// Reports an error at a line; the caller adds the file.
pub type Report<'a> = &'a mut dyn FnMut(u64, String);

/// The line at or above `from` where `key:` is written: where a mapping that starts
/// at `from` was opened.
pub fn key_line(source: &str, from: u64, key: &str) -> u64 {
    let lines: Vec<&str> = source.lines().collect();
    let from = usize::try_from(from).unwrap_or(usize::MAX).min(lines.len());
    (1..=from)
        .rev()
        .find(|&n| {
            let line = lines[n - 1].trim_start().trim_start_matches("- ");
            line.starts_with(key) && line[key.len()..].trim_start().starts_with(':')
        })
        .map_or(from as u64, |n| n as u64)
}

/// `250ms`, `2s`, `1.5s`, `1m`, `1h`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds).ok()
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("5 parsecs"), None);
        assert_eq!(parse_duration(""), None);
    }
}
