//! The hash of a config set's files: how a reload knows the set on disk is the one
//! already served. The files are the loader's own ([`walk`]: the same bounded walk,
//! the same rules), so the hash covers exactly what a load would read.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::config::walk::{self, WalkError};

/// SHA-256 (first 16 hex digits) over the files [`crate::config::load_path`] reads,
/// each as its path relative to `path` and its contents, in name order. Fails as the
/// walk does (a symlink loop, a bound) or when a file cannot be read.
pub fn hash_set(path: &Path) -> Result<String, WalkError> {
    let files = walk::list(path)?;
    let mut digest = Sha256::new();
    for (file, contents) in walk::read(&files) {
        let contents = contents?;
        let relative = file.strip_prefix(path).unwrap_or(&file);
        digest.update(relative.to_string_lossy().as_bytes());
        digest.update([0]);
        digest.update((contents.len() as u64).to_le_bytes());
        digest.update(&contents);
    }
    Ok(digest
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// True when `path` is a directory holding no config file (by the loader's rules):
/// envoyproxy/ratelimit serves such a directory as a set without domains.
pub fn is_empty_set(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
        && walk::list(path).is_ok_and(|files| files.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn hash_covers_names_and_contents_and_skips_dot_names() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), "domain: a\n").unwrap();
        let first = hash_set(dir.path()).unwrap();
        assert_eq!(first.len(), 16);
        fs::write(dir.path().join(".hidden.yaml"), "x").unwrap();
        fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert_eq!(hash_set(dir.path()).unwrap(), first);
        fs::write(dir.path().join("a.yaml"), "domain: b\n").unwrap();
        assert_ne!(hash_set(dir.path()).unwrap(), first);
        fs::rename(dir.path().join("a.yaml"), dir.path().join("b.yaml")).unwrap();
        let renamed = hash_set(dir.path()).unwrap();
        fs::rename(dir.path().join("b.yaml"), dir.path().join("a.yaml")).unwrap();
        assert_ne!(renamed, hash_set(dir.path()).unwrap());
    }

    #[test]
    fn a_directory_without_config_files_is_an_empty_set() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert!(is_empty_set(dir.path()));
        assert!(
            !is_empty_set(&dir.path().join("missing")),
            "a missing path is an error"
        );
        fs::write(dir.path().join("a.yaml"), "domain: a\n").unwrap();
        assert!(!is_empty_set(dir.path()));
    }
}
