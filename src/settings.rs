//! Resolving `tollgate serve`'s settings: our flags first, then the environment
//! variables envoyproxy/ratelimit deployments already set, then defaults.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::error::Error;

/// Default config location when neither `--config` nor `RUNTIME_ROOT` is given.
pub const DEFAULT_CONFIG: &str = "config";
pub const DEFAULT_GRPC_ADDR: &str = "0.0.0.0:8081";
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:8080";

/// What `serve` was asked for on the command line (all optional).
#[derive(Debug, Clone, Default)]
pub struct ServeFlags {
    pub config: Option<PathBuf>,
    pub grpc_addr: Option<String>,
    pub http_addr: Option<String>,
    pub shadow_mode: bool,
}

/// Fully resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSettings {
    pub config: PathBuf,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub shadow_mode: bool,
}

impl ServeSettings {
    /// `env` looks a variable up (std::env::var in production, a map in tests).
    pub fn resolve(
        flags: &ServeFlags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());

        // envoyproxy/ratelimit reads `<RUNTIME_ROOT>/<RUNTIME_SUBDIRECTORY>/config/`.
        let config = match (&flags.config, var("RUNTIME_ROOT")) {
            (Some(path), _) => path.clone(),
            (None, Some(root)) => {
                let mut path = PathBuf::from(root);
                if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
                    path.push(sub);
                }
                path.push("config");
                path
            }
            (None, None) => PathBuf::from(DEFAULT_CONFIG),
        };
        let grpc_addr = address(
            flags.grpc_addr.clone(),
            var("GRPC_HOST"),
            var("GRPC_PORT"),
            DEFAULT_GRPC_ADDR,
            "--grpc-addr / GRPC_HOST:GRPC_PORT",
        )?;
        let http_addr = address(
            flags.http_addr.clone(),
            var("HOST"),
            var("PORT"),
            DEFAULT_HTTP_ADDR,
            "--http-addr / HOST:PORT",
        )?;
        let shadow_mode = flags.shadow_mode
            || match var("SHADOW_MODE") {
                Some(v) => parse_bool(&v).ok_or_else(|| {
                    Error::Settings(format!("SHADOW_MODE: '{v}' is not a boolean"))
                })?,
                None => false,
            };
        Ok(Self {
            config,
            grpc_addr,
            http_addr,
            shadow_mode,
        })
    }
}

/// The flag wins; otherwise HOST and PORT override the default's parts one by one.
fn address(
    flag: Option<String>,
    host: Option<String>,
    port: Option<String>,
    default: &str,
    what: &str,
) -> Result<SocketAddr, Error> {
    let text = match flag {
        Some(flag) => flag,
        None => {
            let (default_host, default_port) = default.rsplit_once(':').unwrap_or((default, ""));
            let host = host.unwrap_or_else(|| default_host.to_owned());
            let port = port.unwrap_or_else(|| default_port.to_owned());
            if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        }
    };
    text.to_socket_addrs()
        .map_err(|e| Error::Settings(format!("{what}: cannot use '{text}': {e}")))?
        .next()
        .ok_or_else(|| Error::Settings(format!("{what}: '{text}' resolves to no address")))
}

/// Go's `strconv.ParseBool`, which envoyproxy/ratelimit's settings use.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(flags: ServeFlags, vars: &[(&str, &str)]) -> Result<ServeSettings, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ServeSettings::resolve(&flags, &|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_match_envoyproxy_ratelimit() {
        let s = resolve(ServeFlags::default(), &[]).unwrap();
        assert_eq!(s.config, PathBuf::from("config"));
        assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
        assert!(!s.shadow_mode);
    }

    #[test]
    fn environment_applies_when_flags_are_absent() {
        let vars = [
            ("RUNTIME_ROOT", "/srv/runtime_data/current"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "9001"),
            ("PORT", "9002"),
            ("SHADOW_MODE", "true"),
        ];
        let s = resolve(ServeFlags::default(), &vars).unwrap();
        assert_eq!(
            s.config,
            PathBuf::from("/srv/runtime_data/current/ratelimit/config")
        );
        assert_eq!(s.grpc_addr, "127.0.0.1:9001".parse().unwrap());
        assert_eq!(s.http_addr, "0.0.0.0:9002".parse().unwrap());
        assert!(s.shadow_mode);
    }

    #[test]
    fn flags_win_over_environment() {
        let flags = ServeFlags {
            config: Some("mine".into()),
            grpc_addr: Some("127.0.0.1:1".into()),
            http_addr: Some("127.0.0.1:2".into()),
            shadow_mode: false,
        };
        let s = resolve(
            flags,
            &[("RUNTIME_ROOT", "/x"), ("GRPC_PORT", "9"), ("PORT", "8")],
        )
        .unwrap();
        assert_eq!(s.config, PathBuf::from("mine"));
        assert_eq!(s.grpc_addr.port(), 1);
        assert_eq!(s.http_addr.port(), 2);
    }

    #[test]
    fn bad_values_are_named() {
        let err = resolve(ServeFlags::default(), &[("SHADOW_MODE", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("SHADOW_MODE"), "{err}");
        let err = resolve(ServeFlags::default(), &[("GRPC_PORT", "notaport")]).unwrap_err();
        assert!(err.to_string().contains("GRPC_HOST:GRPC_PORT"), "{err}");
    }
}
