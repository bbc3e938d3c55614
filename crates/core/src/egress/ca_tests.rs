//! The session CA: leaves only for credential hosts, cached, one pinned key; what the CA
//! signs verifies for its hosts and, by its name constraints, for nothing else; what the
//! sandbox is given to trust it.

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{ServerName, UnixTime};

use super::*;
use crate::egress::mitm::provider;
use crate::egress::mitm_trust::{BUNDLE_PATH, CA_PATH, sandbox_trust};

fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn verifier(ca: &SessionCa) -> std::sync::Arc<WebPkiServerVerifier> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    WebPkiServerVerifier::builder_with_provider(roots.into(), provider())
        .build()
        .unwrap()
}

fn verify(ca: &SessionCa, leaf: &CertificateDer<'static>, name: &str) -> Result<(), String> {
    verifier(ca)
        .verify_server_cert(
            leaf,
            &[],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn leaves_only_for_credential_hosts_cached_and_sharing_one_key() {
    let ca = SessionCa::new("s1", &hosts(&["a.test", "b.test"])).unwrap();
    let err = ca.leaf_for("c.test").err().unwrap();
    assert!(
        matches!(err, CaError::NotACredentialHost(ref h) if h == "c.test"),
        "{err}"
    );
    let a = ca.leaf_for("a.test").unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&a, &ca.leaf_for("a.test").unwrap()),
        "cached"
    );
    let b = ca.leaf_for("b.test").unwrap();
    assert_ne!(a.cert[0], b.cert[0]);
    assert_eq!(a.cert[1], *ca.cert_der(), "the chain is leaf, CA");
    // Both leaves carry the one session leaf key that Chromium pins.
    let spki = ca.leaf.key.subject_public_key_info();
    for leaf in [&a, &b] {
        assert!(memchr::memmem::find(&leaf.cert[0], &spki).is_some());
    }
    verify(&ca, &a.cert[0], "a.test").unwrap();
    verify(&ca, &b.cert[0], "b.test").unwrap();
    let wrong = verify(&ca, &a.cert[0], "b.test").unwrap_err();
    assert!(wrong.contains("not valid for name"), "{wrong}");
    assert!(matches!(SessionCa::new("s", &[]), Err(CaError::NoHosts)));
}

/// Even a certificate the CA's own key signs for another name is refused by a verifier:
/// the CA is name-constrained to the credential hosts.
#[test]
fn the_ca_is_name_constrained_to_its_hosts() {
    let ca = SessionCa::new("s2", &hosts(&["a.test"])).unwrap();
    let mut params = CertificateParams::new(vec!["evil.test".to_string()]).unwrap();
    params.is_ca = IsCa::ExplicitNoCa;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let forged = params.signed_by(&*ca.leaf.key, &*ca.ca).unwrap();
    let err = verify(&ca, forged.der(), "evil.test").unwrap_err();
    assert!(err.contains("NameConstraintViolation"), "{err}");
}

#[test]
fn the_sandbox_gets_the_ca_a_bundle_and_a_pin_of_the_leaf_key() {
    let ca = SessionCa::new("s3", &hosts(&["a.test"])).unwrap();
    let trust = sandbox_trust(&ca);
    let file = |p: &str| {
        let (_, data) = trust.files.iter().find(|(path, _)| path == p).unwrap();
        String::from_utf8(data.clone()).unwrap()
    };
    let ca_pem = file(CA_PATH);
    assert_eq!(ca_pem.matches("BEGIN CERTIFICATE").count(), 1);
    let parsed = CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap();
    assert_eq!(parsed, *ca.cert_der());
    let bundle = file(BUNDLE_PATH);
    assert!(
        bundle.ends_with(&ca_pem),
        "the bundle ends with the session CA"
    );
    assert!(
        bundle.matches("BEGIN CERTIFICATE").count() > 100,
        "and holds the public roots"
    );
    assert!(!bundle.contains("PRIVATE KEY") && !ca_pem.contains("PRIVATE KEY"));
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
    ] {
        assert!(
            trust
                .env
                .contains(&(var.to_string(), BUNDLE_PATH.to_string())),
            "{var}"
        );
    }
    assert!(
        trust
            .env
            .contains(&("NODE_EXTRA_CA_CERTS".into(), CA_PATH.into()))
    );
    use base64::Engine as _;
    let spki = ca.leaf.key.subject_public_key_info();
    let pin = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&spki));
    assert_eq!(
        trust.chromium_args,
        vec![format!("--ignore-certificate-errors-spki-list={pin}")]
    );
    // The CA's own key is not what is pinned (any server could present the public CA cert).
    let ca_spki = ca.ca.key().subject_public_key_info();
    assert_ne!(ca_spki, spki);
}
