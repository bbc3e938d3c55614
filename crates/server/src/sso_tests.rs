//! The ID-token verification of `sso::verify` on tokens this test signs itself with a real
//! RS256 key (the mock provider in tests/web_ui_sso.rs cannot issue a token for another
//! audience, and tampering must change a signed token): a good token passes and yields the
//! configured claims; a tampered payload, another audience, another issuer, a wrong nonce,
//! an expired token, a token signed by another key and an unsigned one are refused.

use base64::Engine as _;
use chrono::{Duration, Utc};
use openidconnect::core::{
    CoreGenderClaim, CoreIdTokenVerifier, CoreJsonWebKey, CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey,
};
use openidconnect::{
    AdditionalClaims, Audience, ClientId, EndUserUsername, IdToken, IdTokenClaims, IssuerUrl,
    JsonWebKeyId, JsonWebKeySet, Nonce, PrivateSigningKey, StandardClaims, SubjectIdentifier,
};
use serde::{Deserialize, Serialize};

use super::*;

/// A throw-away RSA key made for this test (`openssl genrsa 2048`); it signs nothing else.
const KEY: &str = "
-----BEGIN RSA PRIVATE KEY-----
MIIEoQIBAAKCAQEAvM+tKDGie5fz93cXlhFYl/xA0MYheDRgNAISzIidL0ysCt+h
FJqimOpghTKm26vhdMxKhInE5pwR9j9i2PfQGDtqOvkX1t8pR10AjC+0Ku/XBKfY
0SZJ+37dqtXjYYpcludtMPmutJGXgJB3nYhDsw+1P6w1jwMrZn0XMXrz7jPRhWCu
jVcmmwKua5Gn8ghvOnDWSdD4rLbUV2kHGOISpvoVLxMnyCvta7l+s+Z9Ihl9S2L7
iBADhKrb82La3hniV7njMTDXfntT0Fc05XPEpudwOzPdezB/97GL/GDzKZrYDEpI
3BfJvxhEO0/sxsmDkrAwGGMm8OGXu40iSr/PfQIDAQABAoH/PNJlSp5uUpU6EvUF
6FGuJ0eSqp0okV0asYQbmz8RhZGCpw8eoXNzD4sbaneiWanAf2f6dx3qPsXDjAcj
eyeMWMqGsjRYeZsDW8aIu/VMriHH3cki7Oeb3Ggj7vVeFsl7cHZx2FT8i/snSjHq
NDtbtblImKCtsTDcuScsQG7jnLV1nwx0bLwE879xo13Nvrt4kseK2BQrZN0N310l
O/PL9Re8eQ1yPiCY5AqtEayiEgo9DKEfzqmF7kyg1y2S6orNh1+htqnWba7yg+wJ
BHzPbrMn4lS8X8J5fQrL/P3XC0uNs3smC/Z9I+bjtZ7LW1Mcr0lEjjCLSx9mthLN
mvH1AoGBAOldbfpG4x+GZq2spc2p7cRQA+f6TJMWDkwvlDCQLmrtVXR9sTT3e0pk
NFz/QCy8vCsWhSE4gQ9G0jqFHis0mtjja8bEgpJQcaFH4BeFI1SGGqzFk4vXeThv
3S7XGLK73+Dcxf2Y7Azp1fWvpEjRBjIdzpF8u+/+jvh0zSf47GuHAoGBAM8f9Imf
ROmhpVP78LCLj/W2He4H2JWVG3KfzsfYshxQBtitR0u3URugVkGlfTo3ZrWuIw6O
TpnTMikr0Sl4tYKCCYaHFRH7/mPlK/AIzmK3vXxRWNvDtDsryYtok+iR8PzI99N0
SVMsnyLX5uujBscu79b6DVjV+E3Ww44L1FXbAoGAKtyLJ42/h3nDACEWruiIECd2
IDRbviQt6hZPDIBe1irTKDsxwf22elpfN7l2CwF7Ohq/xvM+2RRz5mWuvdbCnhVf
JTnQlZkK1cmCwi8k5xBec98yE1w3GoOJR2IgWiuhmgZSoxpkOJb2QlLJRMqHbcsF
trkHN7Q0hDPHvpC8s58CgYBo5DDtxQecHW1hc7Q3Y+YatAjCM5z+W42T5dRNJrNE
XU6qSk5RzNs5V2B3TDx3z/imxzIfu/eYNPkxGmyJSQT6u6nhQ+VqvyfcJQG0RHFo
Us6V94g9ewV59bnSbLqCy+2zxn6iykAb6/wHJDlgWaYkFuQFBYre0zU1Di7ob5sv
gwKBgQDFfGG087bEJbP2AIM377fUxwNvupnjb/Te7VdqE9zT1AFOIJLurl4MI+vZ
9dHRidsJ8gx+y6DkdC34vDF62IIV8gtn5Ldq3Yte+MGsfbKUvKqJudSXPl16YorP
PaWTFFWk30cTdYoyYw1JRB/j5lH358HiJ0UuK56kWjlzM3moww==
-----END RSA PRIVATE KEY-----
";

const ISSUER: &str = "http://127.0.0.1:9/";
const CLIENT: &str = "sandboxd-test";

#[derive(Debug, Serialize, Deserialize)]
struct Groups {
    groups: Vec<String>,
}
impl AdditionalClaims for Groups {}

type Token =
    IdToken<Groups, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm>;

fn key() -> CoreRsaPrivateSigningKey {
    CoreRsaPrivateSigningKey::from_pem(KEY.trim(), Some(JsonWebKeyId::new("k1".into()))).unwrap()
}

struct Spec {
    issuer: &'static str,
    audience: &'static str,
    nonce: &'static str,
    expires_in: Duration,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            issuer: ISSUER,
            audience: CLIENT,
            nonce: "n-1",
            expires_in: Duration::minutes(5),
        }
    }
}

fn sign(spec: Spec) -> String {
    let now = Utc::now();
    let standard = StandardClaims::new(SubjectIdentifier::new("sub-alice".into()))
        .set_preferred_username(Some(EndUserUsername::new("alice".into())));
    let claims = IdTokenClaims::new(
        IssuerUrl::new(spec.issuer.into()).unwrap(),
        vec![Audience::new(spec.audience.into())],
        now + spec.expires_in,
        now - Duration::minutes(10),
        standard,
        Groups {
            groups: vec!["staff".into(), "sandboxd-admins".into()],
        },
    )
    .set_nonce(Some(Nonce::new(spec.nonce.into())));
    Token::new(
        claims,
        &key(),
        CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
        None,
        None,
    )
    .unwrap()
    .to_string()
}

fn verifier() -> CoreIdTokenVerifier<'static> {
    let jwks = JsonWebKeySet::<CoreJsonWebKey>::new(vec![key().as_verification_key()]);
    CoreIdTokenVerifier::new_public_client(
        ClientId::new(CLIENT.into()),
        IssuerUrl::new(ISSUER.into()).unwrap(),
        jwks,
    )
}

fn config() -> SsoConfig {
    SsoConfig {
        issuer: ISSUER.into(),
        client_id: CLIENT.into(),
        user_claim: "preferred_username".into(),
        ..Default::default()
    }
}

fn check(raw: &str) -> Result<Identity, SsoError> {
    verify(raw, &verifier(), "n-1", &config())
}

#[test]
fn a_good_token_yields_the_configured_claims() {
    let id = check(&sign(Spec::default())).unwrap();
    assert_eq!(id.name, "alice");
    assert_eq!(id.subject, "sub-alice");
    assert_eq!(id.groups, ["staff", "sandboxd-admins"]);
    let by_sub = SsoConfig {
        user_claim: "sub".into(),
        ..config()
    };
    let raw = sign(Spec::default());
    assert_eq!(
        verify(&raw, &verifier(), "n-1", &by_sub).unwrap().name,
        "sub-alice"
    );
    let missing = SsoConfig {
        user_claim: "email".into(),
        ..config()
    };
    assert!(matches!(
        verify(&raw, &verifier(), "n-1", &missing),
        Err(SsoError::MissingClaim(c)) if c == "email"
    ));
}

/// The payload re-encoded with another user name, the signature kept.
fn tampered(raw: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = raw.split('.').collect();
    let payload = String::from_utf8(b64.decode(parts[1]).unwrap()).unwrap();
    assert!(payload.contains("\"alice\""));
    let forged = payload.replace("\"alice\"", "\"admin\"");
    format!("{}.{}.{}", parts[0], b64.encode(forged), parts[2])
}

#[test]
fn a_tampered_token_is_refused() {
    let raw = sign(Spec::default());
    let err = check(&tampered(&raw)).unwrap_err();
    assert!(
        err.to_string().contains("Signature verification failed"),
        "{err}"
    );
}

#[test]
fn another_audience_is_refused() {
    let err = check(&sign(Spec {
        audience: "someone-else",
        ..Default::default()
    }))
    .unwrap_err();
    assert!(err.to_string().contains("Invalid audiences"), "{err}");
}

#[test]
fn another_issuer_is_refused() {
    let err = check(&sign(Spec {
        issuer: "http://127.0.0.1:10/",
        ..Default::default()
    }))
    .unwrap_err();
    assert!(err.to_string().contains("Invalid issuer"), "{err}");
}

#[test]
fn a_wrong_nonce_is_refused() {
    let err = check(&sign(Spec {
        nonce: "n-other",
        ..Default::default()
    }))
    .unwrap_err();
    assert!(err.to_string().contains("Invalid nonce"), "{err}");
}

#[test]
fn an_expired_token_is_refused() {
    let err = check(&sign(Spec {
        expires_in: Duration::minutes(-5),
        ..Default::default()
    }))
    .unwrap_err();
    assert!(err.to_string().contains("Expired"), "{err}");
}

#[test]
fn an_unsigned_token_is_refused() {
    let raw = sign(Spec::default());
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = raw.split('.').collect();
    let none = format!("{}.{}.", b64.encode(r#"{"alg":"none"}"#), parts[1]);
    assert!(check(&none).is_err());
}
