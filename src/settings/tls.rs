//! TLS settings of the gRPC port: our `--grpc-tls-*` flags, else envoyproxy/ratelimit's
//! `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY`,
//! `GRPC_CLIENT_TLS_CACERT` (a client CA turns on mTLS: every client must present a
//! certificate it signed) and `GRPC_CLIENT_TLS_SAN` (the name a client certificate
//! must carry). Envoy Gateway names the client CA `GRPC_SERVER_TLS_CA_CERT`, which
//! envoyproxy/ratelimit never reads; both names are honoured here. Only paths are
//! resolved here; `server::tls` reads the files.

use std::path::PathBuf;

use super::{ServeFlags, parse_bool};
use crate::error::Error;

/// TLS on the gRPC port: where the PEM files are. The files are read at start-up and
/// again whenever they change (or on SIGHUP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcTls {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// The server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// mTLS: CA certificates a client certificate must chain to; none = no client
    /// certificate asked for.
    pub client_ca: Option<PathBuf>,
    /// mTLS: a DNS name or IP address the client certificate must be valid for.
    pub client_san: Option<String>,
}

/// `None` unless TLS was asked for: by `--grpc-tls-cert`, or by
/// `GRPC_SERVER_USE_TLS=true` (then `GRPC_SERVER_TLS_CERT` and `_KEY` are needed).
pub(super) fn grpc_tls(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<GrpcTls>, Error> {
    let env_on = match var("GRPC_SERVER_USE_TLS") {
        Some(v) => parse_bool(&v).ok_or_else(|| {
            Error::Settings(format!("GRPC_SERVER_USE_TLS: '{v}' is not a boolean"))
        })?,
        None => false,
    };
    let flag_on = flags.grpc_tls_cert.is_some() || flags.grpc_tls_key.is_some();
    if !env_on && !flag_on {
        if flags.grpc_tls_client_ca.is_some() || flags.grpc_tls_client_san.is_some() {
            return Err(Error::Settings(
                "--grpc-tls-client-ca and --grpc-tls-client-san need --grpc-tls-cert and --grpc-tls-key"
                    .into(),
            ));
        }
        return Ok(None);
    }
    let path = |flag: &Option<PathBuf>, name: &str| -> Option<PathBuf> {
        flag.clone().or_else(|| var(name).map(PathBuf::from))
    };
    let cert = path(&flags.grpc_tls_cert, "GRPC_SERVER_TLS_CERT").ok_or_else(|| {
        Error::Settings(
            "TLS on the gRPC port needs a certificate: --grpc-tls-cert or GRPC_SERVER_TLS_CERT"
                .into(),
        )
    })?;
    let key = path(&flags.grpc_tls_key, "GRPC_SERVER_TLS_KEY").ok_or_else(|| {
        Error::Settings(
            "TLS on the gRPC port needs a private key: --grpc-tls-key or GRPC_SERVER_TLS_KEY"
                .into(),
        )
    })?;
    let client_ca = match flags.grpc_tls_client_ca.clone() {
        Some(flag) => Some(flag),
        None => client_ca_variable(var)?,
    };
    let client_san = flags
        .grpc_tls_client_san
        .clone()
        .or_else(|| var("GRPC_CLIENT_TLS_SAN"))
        .map(|s| s.trim().to_owned());
    if client_san.is_some() && client_ca.is_none() {
        return Err(Error::Settings(
            "GRPC_CLIENT_TLS_SAN / --grpc-tls-client-san needs a client CA \
             (GRPC_CLIENT_TLS_CACERT or GRPC_SERVER_TLS_CA_CERT / --grpc-tls-client-ca): \
             without one no client \
             certificate is asked for"
                .into(),
        ));
    }
    Ok(Some(GrpcTls {
        cert,
        key,
        client_ca,
        client_san,
    }))
}

/// `GRPC_CLIENT_TLS_CACERT` (envoyproxy/ratelimit's name) or `GRPC_SERVER_TLS_CA_CERT`
/// (Envoy Gateway's). Envoy Gateway's proxies present a client certificate from the
/// same CA, so honouring its name turns on the mTLS it asks for without refusing them.
/// Two different files are refused rather than one chosen silently: the set of trusted
/// clients must not depend on which name wins.
fn client_ca_variable(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<PathBuf>, Error> {
    match (
        var("GRPC_CLIENT_TLS_CACERT"),
        var("GRPC_SERVER_TLS_CA_CERT"),
    ) {
        (Some(a), Some(b)) if a.trim() != b.trim() => Err(Error::Settings(format!(
            "GRPC_CLIENT_TLS_CACERT ('{a}') and GRPC_SERVER_TLS_CA_CERT ('{b}') both name \
             the client CA but differ: set one"
        ))),
        (Some(path), _) | (None, Some(path)) => Ok(Some(PathBuf::from(path.trim()))),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(flags: &ServeFlags, pairs: &[(&str, &str)]) -> Result<Option<GrpcTls>, Error> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        grpc_tls(flags, &|name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn off_unless_asked() {
        assert_eq!(resolve(&ServeFlags::default(), &[]).unwrap(), None);
        let off = [
            ("GRPC_SERVER_USE_TLS", "false"),
            ("GRPC_SERVER_TLS_CERT", "c"),
        ];
        assert_eq!(resolve(&ServeFlags::default(), &off).unwrap(), None);
    }

    #[test]
    fn envoyproxy_ratelimit_variables() {
        let tls = resolve(
            &ServeFlags::default(),
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
                ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
                ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
                ("GRPC_CLIENT_TLS_SAN", "envoy.internal"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(tls.cert, PathBuf::from("/certs/tls.crt"));
        assert_eq!(tls.key, PathBuf::from("/certs/tls.key"));
        assert_eq!(tls.client_ca, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.client_san.as_deref(), Some("envoy.internal"));
    }

    #[test]
    fn envoy_gateways_ca_variable_turns_on_mtls_too() {
        let base = [
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let pairs: Vec<_> = base.iter().chain(extra).copied().collect();
            resolve(&ServeFlags::default(), &pairs)
        };
        let tls = with(&[("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt")]);
        let ca = tls.unwrap().unwrap().client_ca;
        assert_eq!(ca, Some(PathBuf::from("/certs/ca.crt")));
        let same = with(&[
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ]);
        let ca = same.unwrap().unwrap().client_ca;
        assert_eq!(ca, Some(PathBuf::from("/certs/ca.crt")));
        let differ = with(&[
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_CACERT", "/other/ca.crt"),
        ]);
        let err = differ.unwrap_err().to_string();
        assert!(err.contains("GRPC_SERVER_TLS_CA_CERT"), "{err}");
    }

    #[test]
    fn flags_win_and_turn_tls_on() {
        let flags = ServeFlags {
            grpc_tls_cert: Some("a.crt".into()),
            grpc_tls_key: Some("a.key".into()),
            ..ServeFlags::default()
        };
        let tls = resolve(&flags, &[("GRPC_SERVER_TLS_CERT", "env.crt")])
            .unwrap()
            .unwrap();
        assert_eq!(tls.cert, PathBuf::from("a.crt"));
        assert_eq!(tls.client_ca, None);
    }

    #[test]
    fn missing_pieces_are_errors() {
        let no_key = resolve(
            &ServeFlags::default(),
            &[("GRPC_SERVER_USE_TLS", "1"), ("GRPC_SERVER_TLS_CERT", "c")],
        );
        assert!(no_key.unwrap_err().to_string().contains("private key"));
        let san_only = resolve(
            &ServeFlags::default(),
            &[
                ("GRPC_SERVER_USE_TLS", "1"),
                ("GRPC_SERVER_TLS_CERT", "c"),
                ("GRPC_SERVER_TLS_KEY", "k"),
                ("GRPC_CLIENT_TLS_SAN", "x"),
            ],
        );
        assert!(san_only.unwrap_err().to_string().contains("client CA"));
        let bad = resolve(&ServeFlags::default(), &[("GRPC_SERVER_USE_TLS", "yes")]);
        assert!(bad.unwrap_err().to_string().contains("not a boolean"));
    }
}
