//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256>` over
//! `<webhook-id>.<webhook-timestamp>.<body>`. A secret written `whsec_<base64>` signs with
//! the decoded bytes; any other secret with its own bytes.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The HMAC key of a secret.
pub fn key(secret: &str) -> Vec<u8> {
    secret
        .strip_prefix("whsec_")
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

/// The `webhook-signature` header's value.
pub fn signature(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key(secret)) else {
        // HMAC takes keys of any length: never reached.
        return "v1,".into();
    };
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body.as_bytes());
    let sig = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(sig)
    )
}

/// A new secret, `whsec_` and 24 random bytes in base64.
pub fn new_secret() -> String {
    let bytes: [u8; 24] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification (its reference libraries'
    /// test vector).
    #[test]
    fn the_specifications_example_signs_alike() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let ts = 1614265330;
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            signature(secret, id, ts, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_plain_secret_is_its_own_key() {
        assert_eq!(key("not-base64-secret"), b"not-base64-secret");
        assert_eq!(key("whsec_AAEC"), vec![0, 1, 2]);
    }
}
