//! The one bounded walk of a config path: which files a config set is made of, for the
//! loader ([`super::load_path`]: `validate`, start-up, reload) and for the reloader's
//! hash of the set alike, so both always read the same files by the same rules.
//!
//! Rules: a file is the set; a directory contributes every `.yaml`/`.yml` file below
//! it, recursively, in name order; names starting with `.` are skipped (Kubernetes
//! mounts a ConfigMap as `..data` and timestamped `..2024_…` directories beside
//! symlinks to the files: reading those too would load every domain three times);
//! symlinks are followed (the ConfigMap's files are links through `..data`); dangling
//! links are skipped.
//!
//! Bounds, because the directory is input too (unbounded, a `ln -s . self` makes
//! `validate` run for minutes growing to a gigabyte, and a live server grow on every
//! reload): every directory is entered at most once, by its
//! (device, inode), so a symlink loop is refused naming the link and where it leads,
//! and so is a directory reached twice by two paths; and [`MAX_DEPTH`],
//! [`MAX_FILES`], [`MAX_ENTRIES`] and [`MAX_BYTES`] cap the rest. Each is generous for
//! a real config (hundreds of files, a few MiB) and each is named in its error.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Directories below the config directory, at most.
pub const MAX_DEPTH: usize = 16;
/// Config files in one set, at most.
pub const MAX_FILES: usize = 10_000;
/// Directory entries examined in one walk (config files or not), at most.
pub const MAX_ENTRIES: usize = 100_000;
/// Bytes of all config files of one set together, at most (64 MiB).
pub const MAX_BYTES: u64 = 64 << 20;

/// Why a config path cannot be walked; each names the path at fault.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "symlink loop: {} leads back to {} (a directory it is inside); remove the link",
        path.display(), ancestor.display()
    )]
    Loop { path: PathBuf, ancestor: PathBuf },
    #[error(
        "{} is the directory {} again (reached twice through symlinks); each file must be read once",
        path.display(), first.display()
    )]
    Twice { path: PathBuf, first: PathBuf },
    #[error("{}: nested deeper than {MAX_DEPTH} directories", path.display())]
    TooDeep { path: PathBuf },
    #[error("more than {MAX_FILES} config files (the bound of a config set); at {}", path.display())]
    TooManyFiles { path: PathBuf },
    #[error("more than {MAX_ENTRIES} directory entries (the bound of one walk); at {}", path.display())]
    TooManyEntries { path: PathBuf },
    #[error("config files larger than {MAX_BYTES} bytes (64 MiB) together; at {}", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
}

impl WalkError {
    /// The path the error is about (where a diagnostic points).
    pub fn path(&self) -> &Path {
        match self {
            WalkError::Io { path, .. }
            | WalkError::Loop { path, .. }
            | WalkError::Twice { path, .. }
            | WalkError::TooDeep { path }
            | WalkError::TooManyFiles { path }
            | WalkError::TooManyEntries { path }
            | WalkError::TooLarge { path }
            | WalkError::NotAFile { path } => path,
        }
    }
}

/// The config files at `path`, in name order, within the bounds (the sizes are
/// checked as listed; [`read`] holds the byte bound while the files are read).
pub fn list(path: &Path) -> Result<Vec<PathBuf>, WalkError> {
    let io = |source| WalkError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(io)?;
    if !meta.is_dir() {
        if !meta.is_file() {
            return Err(WalkError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let mut walk = Walk::default();
    walk.dir(path, &meta, &mut Vec::new())?;
    walk.files.sort();
    Ok(walk.files)
}

/// Reads `files` (as [`list`] returned them), each whole, all together at most
/// [`MAX_BYTES`]: a file that grew since it was listed cannot take more.
pub fn read(files: &[PathBuf]) -> Vec<(PathBuf, Result<Vec<u8>, WalkError>)> {
    let mut left = MAX_BYTES;
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let contents = read_one(file, left);
        if let Ok(bytes) = &contents {
            left -= bytes.len() as u64;
        }
        let over = matches!(contents, Err(WalkError::TooLarge { .. }));
        out.push((file.clone(), contents));
        if over {
            break;
        }
    }
    out
}

fn read_one(file: &Path, left: u64) -> Result<Vec<u8>, WalkError> {
    let io = |source| WalkError::Io {
        path: file.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    // One byte more than is left tells "exactly the rest" from "too much".
    File::open(file)
        .map_err(io)?
        .take(left + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > left {
        return Err(WalkError::TooLarge {
            path: file.to_path_buf(),
        });
    }
    Ok(bytes)
}

#[derive(Default)]
struct Walk {
    files: Vec<PathBuf>,
    bytes: u64,
    entries: usize,
    /// Every directory entered, by (device, inode), with the path it was first reached by.
    seen: HashMap<(u64, u64), PathBuf>,
}

impl Walk {
    /// `ancestors`: the (device, inode) of the directories `dir` is inside, so that a
    /// directory seen again is told apart as a loop (it contains itself) or a twin.
    fn dir(
        &mut self,
        dir: &Path,
        meta: &fs::Metadata,
        ancestors: &mut Vec<(u64, u64)>,
    ) -> Result<(), WalkError> {
        let id = (meta.dev(), meta.ino());
        if let Some(first) = self.seen.get(&id) {
            let path = dir.to_path_buf();
            return Err(if ancestors.contains(&id) {
                WalkError::Loop {
                    path,
                    ancestor: first.clone(),
                }
            } else {
                WalkError::Twice {
                    path,
                    first: first.clone(),
                }
            });
        }
        if ancestors.len() > MAX_DEPTH {
            return Err(WalkError::TooDeep {
                path: dir.to_path_buf(),
            });
        }
        self.seen.insert(id, dir.to_path_buf());
        let io = |source| WalkError::Io {
            path: dir.to_path_buf(),
            source,
        };
        // In name order, so that of several faults the same one is always reported.
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(WalkError::TooManyEntries {
                    path: dir.to_path_buf(),
                });
            }
            if !entry.file_name().as_encoded_bytes().starts_with(b".") {
                names.push(entry.file_name());
            }
        }
        names.sort();
        ancestors.push(id);
        for name in names {
            let path = dir.join(name);
            // Follows symlinks; a dangling one is skipped, as it always was.
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                self.dir(&path, &meta, ancestors)?;
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                self.file(path, &meta)?;
            }
        }
        ancestors.pop();
        Ok(())
    }

    fn file(&mut self, path: PathBuf, meta: &fs::Metadata) -> Result<(), WalkError> {
        // A FIFO or a device (`x.yaml -> /dev/zero`) would block or never end.
        if !meta.is_file() {
            return Err(WalkError::NotAFile { path });
        }
        if self.files.len() >= MAX_FILES {
            return Err(WalkError::TooManyFiles { path });
        }
        self.bytes += meta.len();
        if self.bytes > MAX_BYTES {
            return Err(WalkError::TooLarge { path });
        }
        self.files.push(path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn names(dir: &Path, files: &[PathBuf]) -> Vec<String> {
        let relative = |f: &PathBuf| f.strip_prefix(dir).unwrap().display().to_string();
        files.iter().map(relative).collect()
    }

    #[test]
    fn configmap_links_are_followed_and_dot_names_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let version = dir.path().join("..2024_01_01");
        fs::create_dir(&version).unwrap();
        fs::write(version.join("a.yaml"), "domain: a\n").unwrap();
        symlink("..2024_01_01", dir.path().join("..data")).unwrap();
        symlink("..data/a.yaml", dir.path().join("a.yaml")).unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/b.yml"), "domain: b\n").unwrap();
        fs::write(dir.path().join("notes.txt"), "x").unwrap();
        symlink("missing.yaml", dir.path().join("dangling.yaml")).unwrap();
        let files = list(dir.path()).unwrap();
        assert_eq!(names(dir.path(), &files), ["a.yaml", "sub/b.yml"]);
    }

    #[test]
    fn a_link_to_its_own_directory_is_a_loop_naming_the_link() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        symlink("..", dir.path().join("sub/up")).unwrap();
        let error = list(dir.path()).unwrap_err();
        assert!(matches!(error, WalkError::Loop { .. }), "{error}");
        assert_eq!(error.path(), dir.path().join("sub/up"));
        assert!(error.to_string().contains("symlink loop"), "{error}");
    }

    #[test]
    fn two_links_to_each_other_are_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a")).unwrap();
        fs::create_dir_all(dir.path().join("b")).unwrap();
        symlink("../b", dir.path().join("a/to_b")).unwrap();
        symlink("../a", dir.path().join("b/to_a")).unwrap();
        let error = list(dir.path()).unwrap_err();
        assert!(matches!(error, WalkError::Loop { .. }), "{error}");
    }

    #[test]
    fn a_directory_reached_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        symlink("real", dir.path().join("twin")).unwrap();
        let error = list(dir.path()).unwrap_err();
        assert!(matches!(error, WalkError::Twice { .. }), "{error}");
    }

    #[test]
    fn depth_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().to_path_buf();
        for _ in 0..MAX_DEPTH {
            deep.push("d");
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("a.yaml"), "domain: a\n").unwrap();
        assert_eq!(
            list(dir.path()).unwrap().len(),
            1,
            "{MAX_DEPTH} levels pass"
        );
        fs::create_dir(deep.join("d")).unwrap();
        let error = list(dir.path()).unwrap_err();
        assert!(matches!(error, WalkError::TooDeep { .. }), "{error}");
        assert!(error.to_string().contains("16"), "{error}");
    }

    #[test]
    fn bytes_are_bounded_when_listed_and_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        let file = File::create(&big).unwrap();
        file.set_len(MAX_BYTES + 1).unwrap(); // sparse: no real 64 MiB on disk
        let error = list(dir.path()).unwrap_err();
        assert!(matches!(error, WalkError::TooLarge { .. }), "{error}");
        // A file that grew after it was listed is cut at the bound.
        let read = read_one(&big, 10).unwrap_err();
        assert!(matches!(read, WalkError::TooLarge { .. }), "{read}");
    }

    #[test]
    fn a_device_named_yaml_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
        let error = list(dir.path()).unwrap_err();
        assert!(matches!(error, WalkError::NotAFile { .. }), "{error}");
        let error = list(&dir.path().join("zero.yaml")).unwrap_err();
        assert!(matches!(error, WalkError::NotAFile { .. }), "{error}");
    }
}
