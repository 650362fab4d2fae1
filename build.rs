//! Compiles the trimmed Envoy protos in `proto/` with protox (pure Rust, so no system
//! `protoc` is needed) and generates tonic client and server code from the result.
//! The encoded descriptor set of the served services (rate limit and rate limit quota) is also written out for gRPC
//! reflection and protojson; the xDS protos (ADS and RateLimitConfig, which tollgate
//! only consumes as a client) are generated but stay out of it, so reflection keeps
//! describing only what the server serves.
//! It also stamps the commit (`TOLLGATE_COMMIT`) that `tollgate_build_info` reports.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    stamp_commit();
    let mut served = protox::Compiler::new(["proto"])?;
    served
        .include_imports(true)
        .include_source_info(false)
        .open_files([
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/service/rate_limit_quota/v3/rlqs.proto",
        ])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("tollgate_descriptor.bin"),
        served.encode_file_descriptor_set(),
    )?;
    let mut all = protox::Compiler::new(["proto"])?;
    all.include_imports(true)
        .include_source_info(false)
        .open_files([
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/service/rate_limit_quota/v3/rlqs.proto",
            "envoy/service/discovery/v3/ads.proto",
            "ratelimit/config/ratelimit/v3/rls_conf.proto",
        ])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(all.file_descriptor_set())?;
    Ok(())
}

/// The commit the binary is built from, for `--version` and `tollgate_build_info`:
/// `TOLLGATE_COMMIT` when the build is given one (a Docker build copies the sources
/// without `.git`: `--build-arg TOLLGATE_COMMIT=$(git rev-parse --short HEAD)`), else
/// `git rev-parse --short HEAD` when these sources are the top of a git work tree,
/// else `unknown`. Never a parent repository's commit (sources unpacked inside
/// another repository), and a missing commit never fails a build. Rebuilt when HEAD
/// moves (a new commit or another branch checked out).
fn stamp_commit() {
    println!("cargo:rerun-if-env-changed=TOLLGATE_COMMIT");
    let hex =
        |s: &String| !s.is_empty() && s.len() <= 40 && s.chars().all(|c| c.is_ascii_hexdigit());
    let here = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&here)
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    let same_dir = |a: &str, b: &str| {
        let canonical = |p: &str| std::fs::canonicalize(p).ok();
        canonical(a).is_some() && canonical(a) == canonical(b)
    };
    let ours = git(&["rev-parse", "--show-toplevel"]).is_some_and(|top| same_dir(&top, &here));
    let given = std::env::var("TOLLGATE_COMMIT").ok().filter(hex);
    let commit = given
        .or_else(|| {
            ours.then(|| git(&["rev-parse", "--short", "HEAD"]))
                .flatten()
                .filter(hex)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
    if !ours {
        return;
    }
    // In a worktree `.git` is a file naming the real git directory, so ask git where
    // HEAD and the current branch's ref live. Only that branch: watching every ref
    // would rebuild the crate whenever any branch moves.
    let mut watched = vec!["HEAD".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for what in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &what])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
