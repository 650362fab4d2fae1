//! Config validation errors, one test per error class: every message must name the
//! file, the exact line and the offending field or descriptor. Also: several errors in
//! one set are all reported, and directory loading (dotfiles and Kubernetes `..data`
//! skipped, `.yml` and subdirectories loaded, other files ignored, the shipped
//! `config/` examples valid).

use std::fs;
use std::path::Path;

use tollgate::config::{load_path, load_sources};

/// Every error of `yaml` loaded as `test.yaml`, as `file:line: message` strings.
pub(crate) fn errors(yaml: &str) -> Vec<String> {
    match load_sources(&[(Path::new("test.yaml"), yaml)]) {
        Ok(_) => panic!("expected errors, but this loaded:\n{yaml}"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

/// Asserts exactly one error, at `test.yaml:<line>:`, containing every needle.
pub(crate) fn assert_one_error(yaml: &str, line: u64, needles: &[&str]) {
    let all = errors(yaml);
    assert_eq!(all.len(), 1, "expected one error, got {all:#?}");
    assert_error(&all[0], "test.yaml", line, needles);
}

pub(crate) fn assert_error(error: &str, file: &str, line: u64, needles: &[&str]) {
    let prefix = format!("{file}:{line}: ");
    assert!(
        error.starts_with(&prefix),
        "expected '{prefix}...', got '{error}'"
    );
    for needle in needles {
        assert!(
            error.contains(needle),
            "'{error}' should mention '{needle}'"
        );
    }
}

#[test]
fn unknown_key_at_top_level() {
    let yaml = "domain: d\ndescriptorz:\n  - key: a\n";
    assert_one_error(yaml, 2, &["unknown key", "descriptorz"]);
}

#[test]
fn unknown_key_in_a_descriptor() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    valeu: b\n";
    assert_one_error(yaml, 4, &["unknown key", "valeu"]);
}

#[test]
fn unknown_key_inside_rate_limit() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      algorithmm: gcra
";
    assert_one_error(yaml, 7, &["unknown key", "algorithmm"]);
}

#[test]
fn empty_domain() {
    let yaml = "# a comment first\ndomain: \"\"\ndescriptors: []\n";
    assert_one_error(yaml, 2, &["domain", "empty"]);
}

#[test]
fn missing_domain() {
    let yaml = "descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert_one_error(yaml, 1, &["domain", "missing"]);
}

#[test]
fn empty_file_is_a_missing_domain() {
    assert_one_error("", 1, &["domain", "missing"]);
    assert_one_error("# only a comment\n\n", 1, &["domain", "missing"]);
}

#[test]
fn duplicate_domain_across_two_files_names_both() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), "domain: dup\n").unwrap();
    fs::write(dir.path().join("b.yaml"), "# second\n\ndomain: dup\n").unwrap();
    let all: Vec<String> = load_path(dir.path())
        .expect_err("duplicate domains must not load")
        .0
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(all.len(), 1, "{all:#?}");
    let b = dir.path().join("b.yaml");
    let a = dir.path().join("a.yaml");
    assert_error(
        &all[0],
        &b.display().to_string(),
        3,
        &["duplicate domain 'dup'", &format!("{}:1", a.display())],
    );
}

#[test]
fn empty_key() {
    let yaml = "domain: d\ndescriptors:\n  - key: \"\"\n    value: v\n";
    assert_one_error(yaml, 3, &["key", "empty"]);
    // A descriptor without any key is the same mistake, at the descriptor's line.
    let yaml = "domain: d\ndescriptors:\n  - key: a\n  - value: v\n";
    assert_one_error(yaml, 4, &["key", "empty"]);
}

#[test]
fn duplicate_exact_composite_key() {
    let yaml = "domain: d
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 2}
";
    assert_one_error(yaml, 6, &["duplicate", "'d.k_v'"]);
}

#[test]
fn duplicate_key_only_composite_key_nested() {
    let yaml = "domain: d
descriptors:
  - key: p
    value: x
    descriptors:
      - key: k
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: k
        rate_limit: {unit: second, requests_per_unit: 2}
";
    assert_one_error(yaml, 8, &["duplicate", "'d.p_x.k'"]);
}

#[test]
fn duplicate_wildcard_composite_key() {
    let yaml = "domain: d
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /other
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
";
    assert_one_error(yaml, 8, &["duplicate", "'d.path_/api/*'"]);
}

#[test]
fn unknown_unit_lists_the_valid_units() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit:
      requests_per_unit: 1
      unit: fortnight
";
    assert_one_error(
        yaml,
        6,
        &[
            "descriptor 'a'",
            "unit",
            "'fortnight'",
            "second, minute, hour, day, week, month, year",
        ],
    );
}

#[test]
fn missing_unit_is_an_invalid_unit() {
    let yaml = "domain: d
descriptors:
  - key: a
    value: b
    rate_limit:
      requests_per_unit: 1
";
    // Line 5 is `rate_limit:`, the mapping that lacks a unit (line 6 is
    // `requests_per_unit`, which is not what is wrong).
    assert_one_error(yaml, 5, &["descriptor 'a_b'", "unit"]);
}

#[test]
fn unit_together_with_unlimited() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit:
      unlimited: true
      unit: second
";
    assert_one_error(yaml, 6, &["descriptor 'a'", "unit", "unlimited"]);
}

#[test]
fn replaces_naming_itself() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit:
      name: me
      unit: second
      requests_per_unit: 1
      replaces:
        - name: other
        - name: me
";
    assert_one_error(yaml, 10, &["descriptor 'a'", "replaces", "'me'"]);
}

#[test]
fn empty_replaces_entry() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - name: \"\"
";
    assert_one_error(yaml, 8, &["descriptor 'a'", "replaces", "empty"]);
}

#[test]
fn share_threshold_without_wildcard() {
    let yaml = "domain: d
descriptors:
  - key: path
    value: /exact
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_one_error(yaml, 5, &["descriptor 'path_/exact'", "share_threshold"]);
}

#[test]
fn yaml_syntax_error() {
    let yaml = "domain: d
descriptors:
  - key: a
    value: b: c
";
    let all = errors(yaml);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_error(&all[0], "test.yaml", 4, &["mapping values are not allowed"]);
}

#[test]
fn wrong_type_string_in_requests_per_unit() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: ten
";
    // The parser alone says `invalid u32`; the message must say which field.
    assert_one_error(yaml, 6, &["requests_per_unit"]);
}

#[test]
fn every_error_in_a_set_is_reported() {
    let one = "domain: one
descriptors:
  - key: a
    rate_limit:
      unit: fortnight
      requests_per_unit: 1
  - key: b
    rate_limit:
      unlimited: true
      unit: day
";
    let two = "domain: two\nbogus: 1\n";
    let three = "domain: \"\"\n";
    let result = load_sources(&[
        (Path::new("one.yaml"), one),
        (Path::new("two.yaml"), two),
        (Path::new("three.yaml"), three),
    ]);
    let all: Vec<String> = result
        .expect_err("three broken files")
        .0
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(all.len(), 4, "{all:#?}");
    let find = |prefix: &str| {
        all.iter()
            .find(|e| e.starts_with(prefix))
            .unwrap_or_else(|| panic!("no error starting with '{prefix}' in {all:#?}"))
    };
    assert!(find("one.yaml:5: ").contains("fortnight"));
    assert!(find("one.yaml:10: ").contains("unlimited"));
    assert!(find("two.yaml:2: ").contains("bogus"));
    assert!(find("three.yaml:1: ").contains("domain"));
}

#[test]
fn kubernetes_configmap_layout_loads_each_domain_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir(root.join("..2026_x")).unwrap();
    fs::write(
        root.join("..2026_x/a.yaml"),
        "domain: k8s\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_x", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/a.yaml", root.join("a.yaml")).unwrap();
    fs::write(root.join(".hidden.yaml"), "domain: hidden\n").unwrap();

    let config = load_path(root).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = config.domains().iter().map(|d| &*d.name).collect();
    assert_eq!(names, ["k8s"]);
    assert_eq!(config.domain("k8s").unwrap().rules.len(), 1);
}

#[test]
fn yml_and_nested_directories_load_and_other_files_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    fs::write(root.join("one.yml"), "domain: one\n").unwrap();
    fs::write(root.join("sub/deeper/two.yaml"), "domain: two\n").unwrap();
    fs::write(root.join("sub/three.yaml"), "domain: three\n").unwrap();
    fs::write(root.join("README.md"), "domain: [not yaml we read\n").unwrap();
    fs::write(root.join("sub/notes.txt"), "garbage: : :\n").unwrap();
    fs::write(root.join("x.yaml.bak"), "domain: bak\n").unwrap();

    let config = load_path(root).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = config.domains().iter().map(|d| &*d.name).collect();
    assert_eq!(names, ["one", "three", "two"]);
}

#[test]
fn empty_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_path(dir.path()).expect_err("no files");
    assert_eq!(err.0.len(), 1);
    assert!(
        err.0[0]
            .to_string()
            .contains(&dir.path().display().to_string()),
        "{err}"
    );
}

#[test]
fn shipped_example_configs_validate() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let config = load_path(&path).unwrap_or_else(|e| panic!("config/ must validate: {e}"));
    let names: Vec<&str> = config.domains().iter().map(|d| &*d.name).collect();
    assert_eq!(names, ["beta", "endpoints", "example", "login", "tenants"]);
    assert!(config.domains().iter().all(|d| !d.rules.is_empty()));
}
