//! TLS and mTLS on the gRPC port, with rustls (ring). [`ServerTls::load`] reads the
//! PEM files named by [`GrpcTls`] and fails start-up with a message naming the file
//! when one is missing or wrong. [`ServerTls::spawn_reload`] re-reads them every
//! [`RELOAD_INTERVAL`] and on SIGHUP: when their contents changed and the new set is
//! valid, new connections use it (connections already open keep theirs); an invalid
//! set is refused with a warning and the old one keeps serving.
//!
//! Handshakes run on each connection's own task ([`ServerTls::accept`], bounded by the
//! handshake timeout in `server/conn/`), so a slow or hostile client never holds up
//! the accept loop; failed handshakes (no client certificate, unknown CA, wrong SAN)
//! are logged, at most one line per second.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::error::Error;
use crate::settings::tls::GrpcTls;

/// How often the certificate files are compared with what is being served.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The files' contents, to tell a change from a re-read.
#[derive(PartialEq, Eq, Clone)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// The TLS configuration being served, swappable while connections are accepted.
pub struct ServerTls {
    settings: GrpcTls,
    config: ArcSwap<ServerConfig>,
    /// What `config` was built from, and the last contents refused (logged once).
    seen: Mutex<(Contents, Option<Contents>)>,
    reloads: AtomicU64,
    failures: LogLimiter,
}

impl ServerTls {
    /// Reads and checks the files now: a missing file, a key that does not match the
    /// certificate or an empty CA file stops the start.
    pub fn load(settings: GrpcTls) -> Result<Arc<Self>, Error> {
        let contents = read(&settings).map_err(Error::Settings)?;
        let config = build(&settings, &contents).map_err(Error::Settings)?;
        Ok(Arc::new(Self {
            settings,
            config: ArcSwap::from_pointee(config),
            seen: Mutex::new((contents, None)),
            reloads: AtomicU64::new(0),
            failures: LogLimiter::default(),
        }))
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.settings.client_ca.is_some()
    }

    /// How many times new certificates were swapped in.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Re-reads the files; swaps the new set in if it changed and is valid.
    /// `Ok(true)`: swapped; `Ok(false)`: unchanged (or the same bad set as before).
    pub fn reload(&self) -> Result<bool, String> {
        let contents = read(&self.settings)?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if contents == seen.0 || seen.1.as_ref() == Some(&contents) {
            return Ok(false);
        }
        match build(&self.settings, &contents) {
            Ok(config) => {
                self.config.store(Arc::new(config));
                *seen = (contents, None);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    event = "tls_reloaded",
                    cert = %self.settings.cert.display(),
                    "gRPC TLS certificates reloaded; new connections use them"
                );
                Ok(true)
            }
            Err(why) => {
                seen.1 = Some(contents);
                Err(why)
            }
        }
    }

    /// Polls the files every `interval`, and reloads on SIGHUP, until aborted.
    pub fn spawn_reload(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let tls = self.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hangups =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                {
                    let hangup = async {
                        match hangups.as_mut() {
                            Some(h) => h.recv().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = hangup => {}
                    }
                }
                #[cfg(not(unix))]
                tick.tick().await;
                if let Err(why) = tls.reload() {
                    tracing::warn!(
                        event = "tls_reload_failed",
                        error = %why,
                        "gRPC TLS certificates not reloaded; the previous ones keep serving"
                    );
                }
            }
        })
    }

    /// The TLS handshake on an accepted connection (`server/conn/`, which runs it on the
    /// connection's own task and bounds it by the handshake timeout), with the SAN
    /// check; `None` when the client is refused (logged).
    pub async fn accept(
        &self,
        tcp: TcpStream,
        peer: Option<SocketAddr>,
    ) -> Option<TlsStream<TcpStream>> {
        let acceptor = TlsAcceptor::from(self.config.load_full());
        let stream = match acceptor.accept(tcp).await {
            Ok(stream) => stream,
            Err(e) => {
                self.refused(peer, &e.to_string());
                return None;
            }
        };
        if let Err(why) = self.check_san(&stream) {
            self.refused(peer, &why);
            return None;
        }
        Some(stream)
    }

    /// With a required SAN, the client's certificate must be valid for it.
    fn check_san(&self, stream: &TlsStream<TcpStream>) -> Result<(), String> {
        let Some(san) = &self.settings.client_san else {
            return Ok(());
        };
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .ok_or("no client certificate")?;
        let name =
            ServerName::try_from(san.as_str()).map_err(|e| format!("client SAN '{san}': {e}"))?;
        webpki::EndEntityCert::try_from(leaf)
            .map_err(|e| format!("client certificate: {e}"))?
            .verify_is_valid_for_subject_name(&name)
            .map_err(|_| format!("client certificate is not valid for '{san}'"))
    }

    /// A client refused (or dropped: its handshake timed out), logged at most once a
    /// second.
    pub fn refused(&self, peer: Option<SocketAddr>, why: &str) {
        if let Some(suppressed) = self.failures.allow() {
            let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
            tracing::warn!(
                event = "tls_handshake_refused",
                %peer,
                reason = why,
                suppressed,
                "gRPC TLS connection refused"
            );
        }
    }
}

/// At most one log line per second; says how many were skipped.
#[derive(Default)]
struct LogLimiter {
    last: Mutex<Option<Instant>>,
    skipped: AtomicU64,
}

impl LogLimiter {
    fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.skipped.swap(0, Ordering::Relaxed))
    }
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("gRPC TLS {what} {}: {e}", path.display()))
}

fn read(settings: &GrpcTls) -> Result<Contents, String> {
    Ok(Contents {
        cert: read_file(&settings.cert, "certificate")?,
        key: read_file(&settings.key, "private key")?,
        client_ca: match &settings.client_ca {
            Some(path) => Some(read_file(path, "client CA")?),
            None => None,
        },
    })
}

fn certificates(
    pem: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("gRPC TLS {what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "gRPC TLS {what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// A rustls server config from the files' contents: ALPN h2 (gRPC), TLS 1.2 and 1.3,
/// client certificates required and verified when a client CA is given.
fn build(settings: &GrpcTls, contents: &Contents) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&contents.cert, &settings.cert, "certificate")?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key)
        .map_err(|e| format!("gRPC TLS private key {}: {e}", settings.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("gRPC TLS: {e}"))?;
    let builder = match (&settings.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(pem, path, "client CA")? {
                roots
                    .add(cert)
                    .map_err(|e| format!("gRPC TLS client CA {}: {e}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("gRPC TLS client CA {}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        format!(
            "gRPC TLS certificate {} and key {}: {e}",
            settings.cert.display(),
            settings.key.display()
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
