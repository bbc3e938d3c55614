//! The per-session CA of credential injection: made on the host when a session starts, its
//! private key never leaves sandboxd's memory (it is never serialized, written or sent; rcgen
//! zeroizes it when the session drops it); only its certificate goes into the sandbox.
//!
//! The CA is as narrow as X.509 allows: name-constrained to exactly the hosts that have a
//! credential (a client that checks constraints, as OpenSSL, rustls, Go and NSS do, refuses
//! anything else it might sign), no intermediate below it (path length 0), 90 days. Leaf
//! certificates are made on demand, only for those hosts, cached per host, valid one day and
//! remade when less than an hour remains. Every leaf of a session shares one leaf key, so
//! Chromium can pin that key (see `mitm_trust.rs`): a key that, too, exists only here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
    PublicKeyData, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

/// How long the CA is valid: longer than any session is expected to live.
const CA_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long a leaf is valid, and how much must remain for a cached one to be served.
const LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);
const LEAF_MIN_REMAINING: Duration = Duration::from_secs(3600);
/// Clocks of the sandbox and the host are one kernel's; a minute back covers rounding.
const BACKDATE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("a session CA needs at least one credential host")]
    NoHosts,
    #[error("{0:?} has no credential: the proxy makes certificates only for credential hosts")]
    NotACredentialHost(String),
    #[error("certificate generation failed: {0}")]
    Generate(String),
}

fn gen_err(e: impl std::fmt::Display) -> CaError {
    CaError::Generate(e.to_string())
}

struct Leaf {
    key: Arc<CertifiedKey>,
    not_after: SystemTime,
}

/// The one key of every leaf of a session, in rcgen's form (to sign leaves for it) and
/// rustls's. It outlives the session's CAs: when a user attaches a credential for a new host
/// the CA is made again for the new set of names, and the browser's pin on this key (fixed
/// when the browser started) stays right.
#[derive(Clone)]
pub struct LeafKey {
    key: Arc<KeyPair>,
    signer: Arc<dyn rustls::sign::SigningKey>,
}

impl LeafKey {
    pub fn generate() -> Result<LeafKey, CaError> {
        let key = KeyPair::generate().map_err(gen_err)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = super::mitm::provider()
            .key_provider
            .load_private_key(der)
            .map_err(gen_err)?;
        Ok(LeafKey {
            key: Arc::new(key),
            signer,
        })
    }

    /// base64(SHA-256(SubjectPublicKeyInfo)), Chromium's pin format.
    pub fn spki_sha256(&self) -> String {
        use base64::Engine as _;
        let spki = self.key.subject_public_key_info();
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&spki))
    }
}

/// One session's CA and its leaf cache.
pub struct SessionCa {
    ca: CertifiedIssuer<'static, KeyPair>,
    hosts: Vec<String>,
    leaf: LeafKey,
    leaves: Mutex<HashMap<String, Leaf>>,
}

impl std::fmt::Debug for SessionCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCa")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

fn unix(t: SystemTime) -> Result<time::OffsetDateTime, CaError> {
    let secs = t.duration_since(UNIX_EPOCH).map_err(gen_err)?.as_secs();
    time::OffsetDateTime::from_unix_timestamp(secs as i64).map_err(gen_err)
}

/// A random positive serial: leaves share a key, so a serial derived from it would repeat,
/// which NSS refuses.
fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

impl SessionCa {
    /// A new CA for a session whose credentials name `hosts` (exact, lower-case names).
    pub fn new(session: &str, hosts: &[String]) -> Result<SessionCa, CaError> {
        SessionCa::with_leaf(session, hosts, LeafKey::generate()?)
    }

    /// `new`, its leaves signed for `leaf` (kept across the CAs of one session).
    pub fn with_leaf(session: &str, hosts: &[String], leaf: LeafKey) -> Result<SessionCa, CaError> {
        if hosts.is_empty() {
            return Err(CaError::NoHosts);
        }
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        // The session id helps whoever reads the bundle; it is not secret.
        let label: String = session.chars().take(40).collect();
        dn.push(DnType::CommonName, format!("sandboxd egress CA {label}"));
        dn.push(DnType::OrganizationName, "sandboxd");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts.iter().cloned().map(GeneralSubtree::DnsName).collect(),
            excluded_subtrees: Vec::new(),
        });
        params.not_before = unix(now - BACKDATE)?;
        params.not_after = unix(now + CA_VALIDITY)?;
        params.serial_number = Some(serial());
        let ca_key = KeyPair::generate().map_err(gen_err)?;
        let ca = CertifiedIssuer::self_signed(params, ca_key).map_err(gen_err)?;
        Ok(SessionCa {
            ca,
            hosts: hosts.to_vec(),
            leaf,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA of a session under `config`: None when no host has a credential (nothing is
    /// intercepted, and the sandbox is given no CA to trust).
    pub fn for_config(
        session: &str,
        config: &crate::config::EgressConfig,
    ) -> Result<Option<SessionCa>, CaError> {
        let hosts: Vec<String> = config.credentials.iter().map(|c| c.host.clone()).collect();
        if hosts.is_empty() {
            return Ok(None);
        }
        SessionCa::new(session, &hosts).map(Some)
    }

    /// The CA certificate (PEM): what the sandbox trusts.
    pub fn cert_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA certificate (DER).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        self.ca.der()
    }

    /// The hosts this CA may sign for.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// base64(SHA-256(SubjectPublicKeyInfo)) of the leaf key, Chromium's pin format.
    pub fn leaf_spki_sha256(&self) -> String {
        self.leaf.spki_sha256()
    }

    /// The leaf for `host` (chain: leaf, CA), from the cache while it has an hour left.
    pub fn leaf_for(&self, host: &str) -> Result<Arc<CertifiedKey>, CaError> {
        if !self.hosts.iter().any(|h| h == host) {
            return Err(CaError::NotACredentialHost(host.to_string()));
        }
        let now = SystemTime::now();
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(leaf) = leaves.get(host)
            && leaf.not_after > now + LEAF_MIN_REMAINING
        {
            return Ok(leaf.key.clone());
        }
        let not_after = now + LEAF_VALIDITY;
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(gen_err)?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = unix(now - BACKDATE)?;
        params.not_after = unix(not_after)?;
        params.serial_number = Some(serial());
        let cert = params
            .signed_by(&*self.leaf.key, &*self.ca)
            .map_err(gen_err)?;
        let chain = vec![cert.der().clone(), self.ca.der().clone()];
        let key = Arc::new(CertifiedKey::new(chain, self.leaf.signer.clone()));
        leaves.insert(
            host.to_string(),
            Leaf {
                key: key.clone(),
                not_after,
            },
        );
        Ok(key)
    }
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
