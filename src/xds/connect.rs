//! Dialling the control plane: the URL (`host:port` as upstream takes it, or with a
//! scheme), TLS with our client certificate for mTLS, the CA and name the server is
//! checked against, the extra gRPC headers of the stream and the largest response
//! accepted.
//!
//! The certificate files are read again at every dial, so a rotated certificate
//! (Envoy Gateway rotates them in a mounted Secret) is used from the next reconnect;
//! [`Dialer::new`] reads them once first, so a missing or broken file stops the start.

use std::path::Path;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::XdsError;
use crate::settings::xds::{XdsSettings, XdsTls};

// No HTTP/2 keepalive pings, as upstream's client sends none: Envoy Gateway's xDS
// server runs grpc-go without a keepalive enforcement policy, so it accepts a ping at
// most every 5 minutes and, after two early ones, closes the connection with GOAWAY
// `too_many_pings`; pinging every 30 s cost a reconnect, a full refetch and a WARN
// every two minutes. A dead control plane is still noticed when its TCP connection
// resets or the server's own keepalive pings go unanswered.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything needed to open a stream, checked once.
#[derive(Debug, Clone)]
pub struct Dialer {
    url: String,
    tls: Option<XdsTls>,
    headers: MetadataMap,
    pub max_message_bytes: Option<usize>,
}

impl Dialer {
    /// Checks the URL, the headers and the certificate files.
    pub fn new(settings: &XdsSettings) -> Result<Self, XdsError> {
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let url = if settings.server_url.contains("://") {
            settings.server_url.clone()
        } else {
            format!("{scheme}://{}", settings.server_url)
        };
        Endpoint::from_shared(url.clone()).map_err(|e| {
            XdsError::Settings(format!(
                "CONFIG_GRPC_XDS_SERVER_URL: cannot use '{}': {e}",
                settings.server_url
            ))
        })?;
        let mut headers = MetadataMap::new();
        for (key, value) in &settings.additional_headers {
            let bad = |e: &dyn std::fmt::Display| {
                XdsError::Settings(format!(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: cannot send '{key}: {value}': {e}"
                ))
            };
            let k = AsciiMetadataKey::from_bytes(key.as_bytes()).map_err(|e| bad(&e))?;
            let v = AsciiMetadataValue::try_from(value.as_str()).map_err(|e| bad(&e))?;
            headers.append(k, v);
        }
        let dialer = Self {
            url,
            tls: settings.tls.clone(),
            headers,
            max_message_bytes: settings.max_message_bytes,
        };
        if let Some(tls) = &dialer.tls {
            check_files(tls)?;
        }
        Ok(dialer)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The gRPC metadata sent on the stream.
    pub fn headers(&self) -> &MetadataMap {
        &self.headers
    }

    /// Opens a connection (TCP, then TLS when asked).
    pub async fn connect(&self) -> Result<Channel, XdsError> {
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| XdsError::Settings(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls_config(tls)?)
                .map_err(|e| XdsError::Tls(e.to_string()))?;
        }
        endpoint
            .connect()
            .await
            .map_err(|e| XdsError::Connect(describe(&e)))
    }
}

/// tonic's TLS client config from the files, read now.
fn tls_config(tls: &XdsTls) -> Result<ClientTlsConfig, XdsError> {
    let mut config = ClientTlsConfig::new();
    config = match &tls.server_ca {
        Some(path) => config.ca_certificate(Certificate::from_pem(read(path, "server CA")?)),
        // upstream's Go TLS falls back to the system roots; ours are the web's.
        None => config.with_webpki_roots(),
    };
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        config = config.identity(Identity::from_pem(
            read(cert, "client certificate")?,
            read(key, "client key")?,
        ));
    }
    if let Some(san) = &tls.server_san {
        config = config.domain_name(san.clone());
    }
    Ok(config)
}

/// Every file named exists and holds what its name says, so a mistake stops the start
/// instead of failing every reconnect.
fn check_files(tls: &XdsTls) -> Result<(), XdsError> {
    let certs = |path: &Path, what: &str| -> Result<(), XdsError> {
        let pem = read(path, what)?;
        let count = CertificateDer::pem_slice_iter(&pem)
            .filter(Result::is_ok)
            .count();
        if count == 0 {
            return Err(XdsError::Tls(format!(
                "{what} {}: no PEM certificate in it",
                path.display()
            )));
        }
        Ok(())
    };
    if let Some(ca) = &tls.server_ca {
        certs(ca, "server CA")?;
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        certs(cert, "client certificate")?;
        PrivateKeyDer::from_pem_slice(&read(key, "client key")?).map_err(|e| {
            XdsError::Tls(format!("client key {}: no private key: {e}", key.display()))
        })?;
    }
    Ok(())
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, XdsError> {
    std::fs::read(path)
        .map_err(|e| XdsError::Tls(format!("cannot read the {what} {}: {e}", path.display())))
}

/// A transport error with its causes, which tonic keeps in the source chain.
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
