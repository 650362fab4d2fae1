//! Fuzz target: config parsing (`tollgate::config::load_sources`). Any bytes, split
//! into up to three files at 0xFF bytes, must load or be refused with errors that
//! name a file: never a panic, a hang or unbounded memory.

#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let texts: Vec<String> = data
        .split(|b| *b == 0xFF)
        .take(3)
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect();
    let paths: Vec<PathBuf> = (0..texts.len())
        .map(|i| PathBuf::from(format!("f{i}.yaml")))
        .collect();
    let sources: Vec<(&std::path::Path, &str)> = paths
        .iter()
        .map(PathBuf::as_path)
        .zip(texts.iter().map(String::as_str))
        .collect();
    match tollgate::config::load_sources(&sources) {
        Ok(config) => {
            // A loaded config is usable: every domain can be looked up by its name.
            for domain in config.domains() {
                assert!(config.domain(&domain.name).is_some());
            }
        }
        Err(errors) => {
            let text = errors.to_string();
            assert!(!text.is_empty());
        }
    }
});
