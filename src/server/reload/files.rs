//! The files of a config set as the loader reads them (`.yaml`/`.yml`, recursive,
//! names starting with `.` skipped, symlinks followed), and their hash: how a reload
//! knows the set on disk is the one already served.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// SHA-256 (first 16 hex digits) over the files [`config::load_path`] reads, by the
/// same rules (`.yaml`/`.yml`, recursive, names starting with `.` skipped, symlinks
/// followed), each as its path relative to `path` and its contents, in name order.
pub fn hash_set(path: &Path) -> io::Result<String> {
    let mut files = Vec::new();
    if fs::metadata(path)?.is_file() {
        files.push(path.to_path_buf());
    } else {
        collect(path, &mut files, 0)?;
    }
    files.sort();
    let mut digest = Sha256::new();
    for file in &files {
        let contents = fs::read(file)?;
        let relative = file.strip_prefix(path).unwrap_or(file);
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
    let mut files = Vec::new();
    fs::metadata(path).is_ok_and(|m| m.is_dir())
        && collect(path, &mut files, 0).is_ok()
        && files.is_empty()
}

/// Symlink loops cannot recurse forever: a directory tree this deep is refused.
const MAX_DEPTH: usize = 64;

fn collect(dir: &Path, files: &mut Vec<PathBuf>, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("config directory nested too deep"));
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = fs::metadata(&path) else {
            continue; // a dangling link, skipped by the loader too
        };
        if meta.is_dir() {
            collect(&path, files, depth + 1)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            files.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
