//! Campus single sign-on: the OpenID Connect authorization code flow with PKCE (S256),
//! `state` and `nonce`, through the `openidconnect` crate.
//!
//! 1. `/auth/login`: discover the provider (cached for an hour, re-read after a failure),
//!    make a PKCE verifier, a random `state` and `nonce`, keep them in the session, and
//!    send the browser to the provider.
//! 2. `/auth/callback`: the returned `state` must equal the session's (then it is
//!    forgotten, so a replayed callback finds none); the code is exchanged with the PKCE
//!    verifier; the ID token's signature (JWKS), issuer, audience, expiry and nonce are
//!    checked by the crate. Claims come from the verified ID token, and from userinfo when
//!    the token lacks email or groups.
//!
//! Users are keyed by (issuer, subject); see `service::identity`.

use crate::config::Config;
use crate::error::AppError;
use openidconnect::core::{
    CoreAuthDisplay, CoreAuthenticationFlow, CoreClaimName, CoreClaimType, CoreClient,
    CoreClientAuthMethod, CoreGenderClaim, CoreGrantType, CoreIdToken, CoreIdTokenClaims,
    CoreIdTokenVerifier, CoreJsonWebKey, CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm, CoreResponseMode, CoreResponseType, CoreSubjectIdentifierType,
};
use openidconnect::{
    AdditionalClaims, AdditionalProviderMetadata, AuthorizationCode, ClientId, ClientSecret,
    CsrfToken, IssuerUrl, Nonce, OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier,
    ProviderMetadata, RedirectUrl, Scope,
};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How long discovery results are trusted.
const DISCOVERY_TTL: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct LogoutMetadata {
    /// RP-initiated logout, when the provider offers it.
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
}
impl AdditionalProviderMetadata for LogoutMetadata {}

type Metadata = ProviderMetadata<
    LogoutMetadata,
    CoreAuthDisplay,
    CoreClientAuthMethod,
    CoreClaimName,
    CoreClaimType,
    CoreGrantType,
    CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm,
    CoreJsonWebKey,
    CoreResponseMode,
    CoreResponseType,
    CoreSubjectIdentifierType,
>;

/// The client, with the endpoints discovery gives.
type Client = CoreClient<
    openidconnect::EndpointSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointMaybeSet,
    openidconnect::EndpointMaybeSet,
>;

/// What a login says about the person, from the ID token and, where it lacks the email or
/// the groups, the userinfo endpoint.
struct Found {
    email: Option<String>,
    email_verified: Option<bool>,
    name: Option<String>,
    username: Option<String>,
    groups: Option<Vec<String>>,
}

/// Any extra claims, to find the groups claim (its name is configurable).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
struct ExtraClaims(serde_json::Map<String, serde_json::Value>);
impl AdditionalClaims for ExtraClaims {}

/// What the session keeps between `/auth/login` and `/auth/callback`.
#[derive(Serialize, Deserialize)]
pub struct PendingLogin {
    state: String,
    nonce: String,
    verifier: String,
}

pub use crate::identity::Identity;

pub struct Oidc {
    issuer: IssuerUrl,
    client_id: ClientId,
    secret: ClientSecret,
    redirect: RedirectUrl,
    scopes: Vec<String>,
    groups_claim: String,
    http: openidconnect::reqwest::Client,
    cache: Mutex<Option<(Instant, Metadata)>>,
}

fn refused(why: impl Into<String>) -> AppError {
    AppError::Unauthenticated(why.into())
}

impl Oidc {
    /// `None` when SSO is not configured.
    pub fn from_config(config: &Config) -> anyhow::Result<Option<Oidc>> {
        let o = &config.oidc;
        let (Some(issuer), Some(client_id)) = (&o.issuer, &o.client_id) else {
            return Ok(None);
        };
        let secret = o.secret()?.unwrap_or_default();
        let public = config
            .public_url
            .as_deref()
            .unwrap_or_default()
            .trim_end_matches('/');
        let http = openidconnect::reqwest::Client::builder()
            // Following redirects would let a provider bounce us to internal addresses.
            .redirect(openidconnect::reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(15))
            .build()?;
        Ok(Some(Oidc {
            issuer: IssuerUrl::new(issuer.clone())?,
            client_id: ClientId::new(client_id.clone()),
            secret: ClientSecret::new(secret),
            redirect: RedirectUrl::new(format!("{public}/auth/callback"))?,
            scopes: o.scopes.clone(),
            groups_claim: o.groups_claim.clone(),
            http,
            cache: Mutex::new(None),
        }))
    }

    async fn metadata(&self) -> Result<Metadata, AppError> {
        let mut cache = self.cache.lock().await;
        if let Some((at, m)) = cache.as_ref() {
            if at.elapsed() < DISCOVERY_TTL {
                return Ok(m.clone());
            }
        }
        let m = Metadata::discover_async(self.issuer.clone(), &self.http)
            .await
            .map_err(|e| {
                tracing::error!("OIDC discovery at {} failed: {e}", self.issuer.as_str());
                AppError::Unavailable(
                    "the campus login service cannot be reached or is misconfigured; \
                     try again later or tell the operators"
                        .into(),
                )
            })?;
        *cache = Some((Instant::now(), m.clone()));
        Ok(m)
    }

    fn client(&self, m: Metadata) -> Client {
        CoreClient::from_provider_metadata(m, self.client_id.clone(), Some(self.secret.clone()))
            .set_redirect_uri(self.redirect.clone())
    }

    /// Step 1: where to send the browser, and what to keep in the session.
    pub async fn begin(&self) -> Result<(String, PendingLogin), AppError> {
        let client = self.client(self.metadata().await?);
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut req = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for s in &self.scopes {
            req = req.add_scope(Scope::new(s.clone()));
        }
        let (url, state, nonce) = req.url();
        Ok((
            url.to_string(),
            PendingLogin {
                state: state.secret().clone(),
                nonce: nonce.secret().clone(),
                verifier: verifier.secret().clone(),
            },
        ))
    }

    /// Step 2: checks the callback and returns who logged in.
    pub async fn finish(
        &self,
        pending: Option<PendingLogin>,
        code: &str,
        state: &str,
    ) -> Result<Identity, AppError> {
        let pending = pending.ok_or_else(|| {
            refused("this login was not started here, or was already used; please log in again")
        })?;
        if !crate::auth::constant_time_eq(pending.state.as_bytes(), state.as_bytes()) {
            return Err(refused(
                "the login's state does not match; please log in again",
            ));
        }
        let client = self.client(self.metadata().await?);
        let token = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| AppError::Internal(e.into()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier))
            .request_async(&self.http)
            .await
            .map_err(|e| {
                tracing::warn!("OIDC code exchange refused: {e}");
                refused("the campus login service refused this login (expired or reused code); please log in again")
            })?;
        let id_token = openidconnect::TokenResponse::id_token(&token)
            .ok_or_else(|| refused("the campus login service sent no ID token"))?;
        let verifier = client.id_token_verifier();
        let claims = verify_id_token(id_token, &verifier, &pending.nonce)?;
        let mut found = Found {
            email: claims.email().map(|e| e.as_str().to_string()),
            email_verified: claims.email_verified(),
            name: claims
                .name()
                .and_then(|n| n.get(None))
                .map(|n| n.as_str().to_string()),
            username: claims.preferred_username().map(|u| u.as_str().to_string()),
            // The signature covers the payload: its extra claims (groups) can be trusted.
            groups: groups_in(&raw_payload(&id_token.to_string()), &self.groups_claim),
        };
        if found.email.is_none() || found.groups.is_none() {
            let access = token.access_token().clone();
            self.add_userinfo(&client, access, claims.subject().clone(), &mut found)
                .await;
        }
        let Found {
            email,
            email_verified,
            name,
            username,
            groups,
        } = found;
        let email = email.unwrap_or_default();
        let username = username
            .or_else(|| email.split('@').next().map(String::from))
            .unwrap_or_else(|| claims.subject().as_str().to_string());
        Ok(Identity {
            issuer: claims.issuer().as_str().to_string(),
            subject: claims.subject().as_str().to_string(),
            name: name.unwrap_or_else(|| username.clone()),
            username,
            email,
            email_verified: email_verified.unwrap_or(false),
            groups: groups.unwrap_or_default(),
            id_token: id_token.to_string(),
        })
    }

    /// Fills what the ID token lacked from the userinfo endpoint (a failure is logged: the
    /// login goes on with what the token said).
    async fn add_userinfo(
        &self,
        client: &Client,
        access: openidconnect::AccessToken,
        subject: openidconnect::SubjectIdentifier,
        found: &mut Found,
    ) {
        let Ok(req) = client.user_info(access, Some(subject)) else {
            return;
        };
        let info = match req
            .request_async::<ExtraClaims, _, CoreGenderClaim>(&self.http)
            .await
        {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!("OIDC userinfo failed: {e}");
                return;
            }
        };
        if found.email.is_none() {
            found.email = info.email().map(|e| e.as_str().to_string());
            found.email_verified = info.email_verified();
        }
        if found.name.is_none() {
            found.name = info
                .name()
                .and_then(|n| n.get(None))
                .map(|n| n.as_str().to_string());
        }
        if found.username.is_none() {
            found.username = info.preferred_username().map(|u| u.as_str().to_string());
        }
        if found.groups.is_none() {
            found.groups = groups_in(
                &serde_json::Value::Object(info.additional_claims().0.clone()),
                &self.groups_claim,
            );
        }
    }

    /// The provider's logout URL (RP-initiated logout), if it offers one.
    pub async fn logout_url(&self, id_token: Option<&str>, after: &str) -> Option<String> {
        let m = self.metadata().await.ok()?;
        let end = m.additional_metadata().end_session_endpoint.clone()?;
        let mut url = url::Url::parse(&end).ok()?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(t) = id_token {
                q.append_pair("id_token_hint", t);
            }
            q.append_pair("post_logout_redirect_uri", after);
            q.append_pair("client_id", self.client_id.as_str());
        }
        Some(url.to_string())
    }
}

/// Checks an ID token: signature against the provider's keys, issuer, audience, expiry
/// and our nonce. Any failure is a refused login.
fn verify_id_token<'t>(
    token: &'t CoreIdToken,
    verifier: &CoreIdTokenVerifier<'_>,
    nonce: &str,
) -> Result<&'t CoreIdTokenClaims, AppError> {
    token
        .claims(verifier, &Nonce::new(nonce.to_string()))
        .map_err(|e| {
            tracing::warn!("ID token refused: {e}");
            refused("the campus login service's answer did not verify; please log in again")
        })
}

/// The JSON payload of a JWT (not verified here: call only on a verified token).
fn raw_payload(jwt: &str) -> serde_json::Value {
    use base64::Engine;
    jwt.split('.')
        .nth(1)
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.trim_end_matches('='))
                .ok()
        })
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// The groups claim: a list of strings, or one string (some providers join with ", ").
fn groups_in(claims: &serde_json::Value, name: &str) -> Option<Vec<String>> {
    match claims.get(name)? {
        serde_json::Value::Array(a) => Some(
            a.iter()
                .filter_map(|g| g.as_str().map(String::from))
                .collect(),
        ),
        serde_json::Value::String(s) => Some(
            s.split([',', ';'])
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(String::from)
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_claim_shapes() {
        let v = serde_json::json!({"groups": ["a", "b"], "g2": "x; y, z", "n": 3});
        assert_eq!(groups_in(&v, "groups"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(
            groups_in(&v, "g2"),
            Some(vec!["x".into(), "y".into(), "z".into()])
        );
        assert_eq!(groups_in(&v, "missing"), None);
        assert_eq!(groups_in(&v, "n"), None);
    }

    /// ID tokens minted here with a key of our own, checked the way `finish` checks them.
    mod id_tokens {
        use super::super::*;
        use openidconnect::core::{CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey};
        use openidconnect::{
            Audience, EmptyAdditionalClaims, JsonWebKeyId, JsonWebKeySet, PrivateSigningKey,
            StandardClaims, SubjectIdentifier,
        };

        fn key(kid: &str) -> CoreRsaPrivateSigningKey {
            let out = std::process::Command::new("openssl")
                .args(["genrsa", "-traditional", "2048"])
                .output()
                .expect("the openssl CLI is needed (apt-get install openssl)");
            let pem = String::from_utf8(out.stdout).unwrap();
            CoreRsaPrivateSigningKey::from_pem(&pem, Some(JsonWebKeyId::new(kid.into()))).unwrap()
        }

        struct Mint {
            issuer: &'static str,
            audience: &'static str,
            expires_in: i64,
            nonce: &'static str,
        }

        const GOOD: Mint = Mint {
            issuer: "https://idp.test",
            audience: "portal",
            expires_in: 300,
            nonce: "n-1",
        };

        fn mint(k: &CoreRsaPrivateSigningKey, m: &Mint) -> CoreIdToken {
            let now = chrono::Utc::now();
            let claims = CoreIdTokenClaims::new(
                IssuerUrl::new(m.issuer.into()).unwrap(),
                vec![Audience::new(m.audience.into())],
                now + chrono::Duration::seconds(m.expires_in),
                now - chrono::Duration::seconds(60),
                StandardClaims::new(SubjectIdentifier::new("dana".into())),
                EmptyAdditionalClaims {},
            )
            .set_nonce(Some(Nonce::new(m.nonce.into())));
            CoreIdToken::new(
                claims,
                k,
                CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
                None,
                None,
            )
            .unwrap()
        }

        #[test]
        fn only_a_token_for_us_with_our_nonce_passes() {
            let k = key("k1");
            let jwks = JsonWebKeySet::new(vec![k.as_verification_key()]);
            let verifier = CoreIdTokenVerifier::new_confidential_client(
                ClientId::new("portal".into()),
                ClientSecret::new("secret".into()),
                IssuerUrl::new("https://idp.test".into()).unwrap(),
                jwks,
            );
            let good = mint(&k, &GOOD);
            assert_eq!(
                verify_id_token(&good, &verifier, "n-1")
                    .unwrap()
                    .subject()
                    .as_str(),
                "dana"
            );
            assert!(
                verify_id_token(&good, &verifier, "n-2").is_err(),
                "wrong nonce"
            );
            for bad in [
                Mint {
                    audience: "another-client",
                    ..GOOD
                },
                Mint {
                    expires_in: -30,
                    ..GOOD
                },
                Mint {
                    issuer: "https://evil.test",
                    ..GOOD
                },
            ] {
                assert!(verify_id_token(&mint(&k, &bad), &verifier, "n-1").is_err());
            }
            let stranger = key("k1");
            assert!(
                verify_id_token(&mint(&stranger, &GOOD), &verifier, "n-1").is_err(),
                "another key"
            );
        }
    }

    #[test]
    fn payload_of_a_jwt() {
        use base64::Engine;
        let body =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"groups":["lab-x"]}"#);
        let v = raw_payload(&format!("h.{body}.s"));
        assert_eq!(groups_in(&v, "groups"), Some(vec!["lab-x".into()]));
    }
}
