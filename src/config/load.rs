//! Reading a config set from disk: the files [`super::walk`] lists (one file, or every
//! `.yaml`/`.yml` file under a directory, bounded, symlink loops refused), one domain
//! per file, validated together.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::compile::compile_domain;
use super::diagnostics::{ConfigError, ConfigErrors};
use super::schema::DomainYaml;
use super::walk::{self, WalkError};
use super::{Config, Domain, keys, yaml};

/// Loads and validates the whole set at `path`; every error found is returned.
pub fn load_path(path: &Path) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let files = match walk::list(path) {
        Ok(files) => files,
        Err(e) => return Err(ConfigErrors(vec![walk_error(path, &e)])),
    };
    if files.is_empty() {
        return Err(ConfigErrors(vec![ConfigError::new(
            path,
            None,
            "no .yaml or .yml config files found",
        )]));
    }
    let mut sources = Vec::with_capacity(files.len());
    for (file, contents) in walk::read(&files) {
        match contents.map(String::from_utf8) {
            Ok(Ok(text)) => sources.push((file, text)),
            Ok(Err(_)) => errors.push(ConfigError::new(&file, None, "cannot read: not UTF-8")),
            Err(e) => errors.push(walk_error(&file, &e)),
        }
    }
    let refs: Vec<(&Path, &str)> = sources
        .iter()
        .map(|(f, t)| (f.as_path(), t.as_str()))
        .collect();
    match load_sources(&refs) {
        Ok(config) if errors.is_empty() => Ok(config),
        Ok(_) => Err(ConfigErrors(errors)),
        Err(ConfigErrors(more)) => {
            errors.extend(more);
            Err(ConfigErrors(errors))
        }
    }
}

/// Validates a set of (file name, contents) pairs as one config.
pub fn load_sources(sources: &[(&Path, &str)]) -> Result<Config, ConfigErrors> {
    load(sources, true)
}

/// [`load_sources`] for documents nobody wrote line by line (xDS resources rendered as
/// YAML): no error names a line, its own or another document's, since it would point
/// into text nobody can see.
pub fn load_documents(sources: &[(&Path, &str)]) -> Result<Config, ConfigErrors> {
    load(sources, false).map_err(|ConfigErrors(errors)| {
        ConfigErrors(
            errors
                .into_iter()
                .map(|e| ConfigError { line: None, ..e })
                .collect(),
        )
    })
}

fn load(sources: &[(&Path, &str)], lines: bool) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut domains: HashMap<std::sync::Arc<str>, (Domain, PathBuf, u64)> = HashMap::new();
    for (file, text) in sources {
        let Some((domain, line, reported)) = compile_file(file, text, &mut errors) else {
            continue;
        };
        if let Some((_, first, first_line)) = domains.get(&domain.name) {
            let first = if lines {
                format!("at {}:{first_line}", first.display())
            } else {
                format!("in {}", first.display())
            };
            let message = format!(
                "domain: duplicate domain '{}' (first defined {first})",
                domain.name
            );
            if !reported.contains(&line) {
                errors.push(ConfigError::new(file, Some(line), message));
            }
            continue;
        }
        domains.insert(domain.name.clone(), (domain, file.to_path_buf(), line));
    }
    if errors.is_empty() {
        Ok(Config::new(
            domains.into_values().map(|(d, _, _)| d).collect(),
        ))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// One file compiled; every error of it, in line order, into `errors`. Also the line
/// naming its domain and the lines the first pass reported.
fn compile_file(
    file: &Path,
    text: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<(Domain, u64, HashSet<u64>)> {
    let mut found = Vec::new();
    let parsed = parse(file, text, &mut found);
    let compiled = parsed.and_then(|(yaml, reported)| {
        let line = yaml.domain.as_ref().map_or(1, |d| d.line);
        let mut compiled = Vec::new();
        let domain = compile_domain(file, text, yaml, &mut compiled);
        // One error per line: what the first pass said about a line is the cause of
        // anything the compiler says there (it checked a stand-in value).
        found.extend(
            compiled
                .into_iter()
                .filter(|e| e.line.is_none_or(|l| !reported.contains(&l))),
        );
        Some((domain?, line, reported))
    });
    found.sort_by_key(|e| e.line);
    errors.append(&mut found);
    compiled
}

/// The file's typed schema, after the first pass has reported (into `errors`) and
/// taken out every unknown key and mistyped value; also the lines it reported.
fn parse(
    file: &Path,
    text: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<(DomainYaml, HashSet<u64>)> {
    // An empty file (or only comments) is an empty mapping, so it fails as a missing
    // domain, as it does in envoyproxy/ratelimit, instead of as a parser error.
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Some((DomainYaml::default(), HashSet::new()));
    }
    let mut tree = match yaml::parse(text) {
        Ok(tree) => tree,
        Err(e) => {
            let line = e.location().map(|l| l.line()).filter(|l| *l > 0);
            let message = describe_parse_error(&e, text, line);
            errors.push(ConfigError::new(file, line, message));
            return None;
        }
    };
    let mut reported = HashSet::new();
    for (line, message) in keys::check(&mut tree) {
        reported.insert(line);
        errors.push(ConfigError::new(file, Some(line), message));
    }
    match yaml::from_tree::<DomainYaml>(&tree) {
        Ok(yaml) => Some((yaml, reported)),
        // The first pass clears what the schema refuses; this is a key or a type it
        // does not know of (keys.rs out of step with schema.rs).
        Err(e) => {
            errors.push(ConfigError::new(file, e.line, e.message));
            None
        }
    }
}

/// The parser's message without its source snippet or trailing position (we print the
/// position ourselves, in `file:line:` form), prefixed with the field the offending
/// line sets when there is one.
fn describe_parse_error(e: &serde_saphyr::Error, source: &str, line: Option<u64>) -> String {
    if let Some(message) = budget_message(e) {
        return message;
    }
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or("invalid YAML").trim();
    let first = strip_position(first);
    // Library advice about its own options means nothing to a config author.
    let first = first
        .split(", set DuplicateKeyPolicy")
        .next()
        .unwrap_or(first);
    let field = line
        .and_then(|n| source.lines().nth(usize::try_from(n).ok()?.checked_sub(1)?))
        .and_then(|l| l.trim_start().trim_start_matches("- ").split_once(':'))
        .map(|(key, value)| (key.trim(), value.trim()))
        .filter(|(key, _)| {
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    match field {
        Some((key, value)) if !value.is_empty() => format!("{key}: {first} (got '{value}')"),
        Some((key, _)) => format!("{key}: {first}"),
        None => first.to_owned(),
    }
}

/// The parser's nesting limit: lists and mappings inside each other (serde-saphyr's
/// default budget, which guards the stack against a hostile document).
pub const MAX_YAML_DEPTH: usize = 64;

/// A breach of the parser's budget, in words: the parser's own message is a Debug
/// dump (`budget breached: Depth { depth: 65 }`) that tells a config author nothing.
fn budget_message(e: &serde_saphyr::Error) -> Option<String> {
    use serde_saphyr::budget::BudgetBreach;
    let serde_saphyr::Error::Budget { breach, .. } = e.without_snippet() else {
        return None;
    };
    Some(match breach {
        BudgetBreach::Depth { .. } => format!(
            "nested too deeply: more than {MAX_YAML_DEPTH} levels of lists and mappings \
             (each descriptor level takes two)"
        ),
        BudgetBreach::Aliases { .. } | BudgetBreach::Anchors { .. } => {
            "too many YAML anchors or aliases".to_owned()
        }
        _ => "the document is larger than the YAML parser accepts".to_owned(),
    })
}

fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    }
}

/// A walk error as a diagnostic: an unreadable file or directory on its own path; a
/// bound or a loop (whose message names the paths at fault) on the config path read.
fn walk_error(read: &Path, error: &WalkError) -> ConfigError {
    match error {
        // The path is the diagnostic's prefix already; say only what went wrong.
        WalkError::Io { source, .. } if error.path() == read => {
            ConfigError::new(read, None, format!("cannot read config path: {source}"))
        }
        WalkError::Io { source, .. } => {
            ConfigError::new(error.path(), None, format!("cannot read: {source}"))
        }
        other => ConfigError::new(read, None, other.to_string()),
    }
}
