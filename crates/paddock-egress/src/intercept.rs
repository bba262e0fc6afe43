//! TLS interception, for connections whose ClientHello names a host the sandbox's vault binds
//! over `https` and nothing else: every other TLS flow stays an opaque relay. The sandbox's
//! own CA (made at its create, its key only here and in the sandbox's root-only directory on
//! the host) signs a certificate for that name; the enforcer dials the upstream with TLS of
//! its own, checked against the host's trust store (and the operator's extra CAs), and relays
//! HTTP/1.1 between the two through [`crate::inject`]. Only `http/1.1` is offered to the
//! sandbox, so no HTTP/2 connection can be coalesced for another authority.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Hosts whose certificate and TLS configuration are kept per sandbox; beyond it the cache
/// starts again.
const LEAF_CACHE: usize = 256;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn ca_params(label: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Paddock");
    dn.push(DnType::CommonName, format!("Paddock credential proxy CA {label}"));
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p
}

/// A new CA for one sandbox (`label`: its id): its certificate and its key, both PEM.
pub fn generate_ca(label: &str) -> Result<(String, String), String> {
    let key = KeyPair::generate().map_err(|e| format!("making the sandbox's CA key: {e}"))?;
    let mut p = ca_params(label);
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(3650);
    let cert = p.self_signed(&key).map_err(|e| format!("making the sandbox's CA: {e}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// What the enforcer intercepts with: the sandbox's CA and how it checks upstreams.
pub struct Interception {
    issuer: Issuer<'static, KeyPair>,
    /// Per bound host: its leaf in a server configuration, made on the first connection.
    servers: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    upstream: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Interception {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interception(..)")
    }
}

impl Interception {
    /// From the CA's key (the CA's name is made again from `label`, as [`generate_ca`] made
    /// it) and extra PEM CAs upstreams may be signed by besides the host's.
    pub fn new(label: &str, ca_key_pem: &str, extra_roots_pem: &[String]) -> Result<Self, String> {
        let key = KeyPair::from_pem(ca_key_pem).map_err(|e| format!("the sandbox's CA key: {e}"))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
        for pem in extra_roots_pem {
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let c = c.map_err(|e| format!("an extra upstream CA is not PEM: {e}"))?;
                roots.add(c).map_err(|e| format!("an extra upstream CA: {e}"))?;
            }
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            issuer: Issuer::new(ca_params(label), key),
            servers: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut p = CertificateParams::new(vec![host.to_string()]).map_err(|e| e.to_string())?;
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, host);
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(30);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        let cert = p.signed_by(&key, &self.issuer).map_err(|e| e.to_string())?;
        let der = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| e.to_string())?;
        let signing = provider().key_provider.load_private_key(der).map_err(|e| e.to_string())?;
        Ok(Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing)))
    }

    /// Server side of a connection to `host`: only `http/1.1`, only `host`'s certificate.
    pub fn acceptor(&self, host: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
        if let Some(c) = self.servers.lock().unwrap_or_else(|e| e.into_inner()).get(host) {
            return Ok(tokio_rustls::TlsAcceptor::from(c.clone()));
        }
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(One(self.leaf(host)?)));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if servers.len() >= LEAF_CACHE {
            servers.clear();
        }
        servers.insert(host.to_string(), config.clone());
        Ok(tokio_rustls::TlsAcceptor::from(config))
    }

    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.upstream.clone())
    }

    pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
        ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))
    }
}

#[derive(Debug)]
struct One(Arc<CertifiedKey>);

impl ResolvesServerCert for One {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// A connection whose first bytes were already read (the ClientHello): they are read again
/// first.
pub struct Replay<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self { prefix, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_leaf_for_a_bound_host_chains_to_the_sandboxs_ca() {
        let (ca_pem, key_pem) = generate_ca("sbx1").unwrap();
        let i = Interception::new("sbx1", &key_pem, &[]).unwrap();
        let acceptor = i.acceptor("api.test").unwrap();
        // A client that trusts only the sandbox's CA completes a handshake for api.test.
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { acceptor.accept(b).await.map(|_| ()) });
        let conn = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(Interception::server_name("api.test").unwrap(), a)
            .await;
        assert!(conn.is_ok(), "{:?}", conn.err());
        server.await.unwrap().unwrap();
        // Another CA's key does not make the same CA.
        let (_, other_key) = generate_ca("sbx1").unwrap();
        assert_ne!(key_pem, other_key);
    }
}
