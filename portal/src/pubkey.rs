//! Users' SSH public keys: what a pasted key must be before the portal stores it, and the
//! fingerprint by which the SSH gateway recognises it. Pure: no I/O, no database.
//!
//! Parsing is the `ssh-key` crate's (through `russh::keys`); only the checks on top of
//! it are ours. Invariants of a [`ParsedKey`]:
//! - its algorithm is one we accept: `ssh-ed25519`, `ecdsa-sha2-nistp256/384/521`,
//!   `ssh-rsa` of 2048 to 16384 bits, and the FIDO security-key variants
//!   `sk-ssh-ed25519@openssh.com` and `sk-ecdsa-sha2-nistp256@openssh.com` (the library
//!   parses and verifies both, and so does russh's server); never DSA, certificates or
//!   names the library does not know;
//! - `public_key` is the library's canonical one-line form `algo base64 [comment]`, so
//!   the same key pasted with other spacing is the same text;
//! - `fingerprint` is `SHA256:<base64>`, exactly as `ssh-keygen -l` prints it, and
//!   depends on the key alone (not on its comment): it is what makes a key unique.

pub use crate::domain::ParsedKey;
use crate::error::AppError;
use russh::keys::ssh_key::public::KeyData;
use russh::keys::{Algorithm, HashAlg, PublicKey};
use thiserror::Error;

/// Most keys one user may register.
pub const MAX_KEYS_PER_USER: i64 = 50;
/// Longest name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Longest paste we look at (a 16384-bit RSA key with a long comment is about 3 KiB).
pub const MAX_KEY_BYTES: usize = 16 * 1024;
pub const MIN_RSA_BITS: u32 = 2048;
/// OpenSSH's own upper limit.
pub const MAX_RSA_BITS: u32 = 16384;

/// Why a key is refused. Each says what is wrong in words a user can act on; the API
/// gives [`KeyError::code`] as `error` and [`KeyError::field`] as `field`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("paste your public key: the one line in ~/.ssh/id_ed25519.pub (or id_ecdsa.pub, id_rsa.pub)")]
    Empty,
    #[error("this is {0} bytes, far longer than any public key (at most {MAX_KEY_BYTES})")]
    TooLong(usize),
    #[error(
        "this is a PRIVATE key: never paste a private key anywhere, it is the half that must \
         stay on your computer. Paste the public key instead (the file ending in .pub, e.g. \
         ~/.ssh/id_ed25519.pub); if this private key was shared, make a new key pair"
    )]
    PrivateKey,
    #[error(
        "this is an SSH2 (RFC 4716) public key; convert it to the OpenSSH one-line form \
         with `ssh-keygen -i -f FILE` and paste that"
    )]
    Rfc4716,
    #[error("paste one key, on one line (this has {0} lines); add further keys one by one")]
    SeveralLines(usize),
    #[error(
        "this is not an OpenSSH public key: expected one line such as \
         `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA... you@laptop` ({0})"
    )]
    Malformed(String),
    #[error("SSH certificates are not accepted; paste the plain public key")]
    Certificate,
    #[error(
        "{0} keys are not accepted{why}; use ssh-ed25519 (recommended), \
         ecdsa-sha2-nistp256/384/521, or ssh-rsa with at least 2048 bits",
        why = if .0 == "ssh-dss" { " (DSA is insecure)" } else { "" }
    )]
    Unsupported(String),
    #[error(
        "this RSA key has {0} bits; at least {MIN_RSA_BITS} are needed \
         (make a new key with `ssh-keygen -t ed25519`)"
    )]
    RsaTooShort(u32),
    #[error("this RSA key has {0} bits; at most {MAX_RSA_BITS} are accepted")]
    RsaTooLong(u32),
    #[error("the name has {0} characters; at most {MAX_NAME_CHARS}")]
    NameTooLong(usize),
    #[error("the name may not contain line breaks or other control characters")]
    NameControl,
    /// The same words whoever registered the key: they reveal nothing about other users.
    #[error("this key is already registered (a key can be registered only once)")]
    Duplicate,
    #[error("you have {MAX_KEYS_PER_USER} keys, the most allowed; remove one first")]
    TooMany,
}

impl KeyError {
    /// The API's `error` code.
    pub fn code(&self) -> &'static str {
        match self {
            KeyError::Empty => "key_missing",
            KeyError::TooLong(_) => "key_too_long",
            KeyError::PrivateKey => "private_key",
            KeyError::Rfc4716 => "key_not_openssh_format",
            KeyError::SeveralLines(_) => "several_keys",
            KeyError::Malformed(_) => "not_a_public_key",
            KeyError::Certificate => "certificate_not_accepted",
            KeyError::Unsupported(_) => "unsupported_algorithm",
            KeyError::RsaTooShort(_) => "rsa_key_too_short",
            KeyError::RsaTooLong(_) => "rsa_key_too_long",
            KeyError::NameTooLong(_) => "name_too_long",
            KeyError::NameControl => "name_invalid",
            KeyError::Duplicate => "duplicate_key",
            KeyError::TooMany => "too_many_keys",
        }
    }

    /// The request field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            KeyError::NameTooLong(_) | KeyError::NameControl => "name",
            _ => "public_key",
        }
    }
}

impl From<KeyError> for AppError {
    fn from(e: KeyError) -> Self {
        AppError::invalid_as(e.code(), e.field(), e.to_string())
    }
}

/// The fingerprint of `key` as stored and as `ssh-keygen -l` prints it: `SHA256:...`.
/// The SSH gateway compares an offered key by this.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Checks a pasted public key and the optional name, and returns what to store.
///
/// 1. Trim; refuse empty and oversized input.
/// 2. Refuse private keys (any PEM or OpenSSH `PRIVATE KEY` block, PuTTY files) and the
///    RFC 4716 form, each with its own message; then anything on more than one line.
/// 3. Refuse certificates (by their algorithm name: the parser only says "unknown
///    algorithm"); parse with `ssh-key`; refuse algorithms we do not accept; RSA
///    must have 2048 to 16384 bits (counted exactly, from the modulus).
/// 4. Name: the given one (trimmed), else the key's comment (cut to the longest name),
///    else the algorithm and the start of the fingerprint.
pub fn parse(text: &str, name: Option<&str>) -> Result<ParsedKey, KeyError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if text.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLong(text.len()));
    }
    if text.contains("PRIVATE KEY") || text.starts_with("PuTTY-User-Key-File") {
        return Err(KeyError::PrivateKey);
    }
    if text.starts_with("---- BEGIN SSH2 PUBLIC KEY") {
        return Err(KeyError::Rfc4716);
    }
    let lines = text.lines().count();
    if lines > 1 || text.contains('\r') {
        return Err(KeyError::SeveralLines(lines.max(2)));
    }
    let first_word = text.split_whitespace().next().unwrap_or_default();
    if first_word.ends_with("-cert-v01@openssh.com") {
        return Err(KeyError::Certificate);
    }
    let key = PublicKey::from_openssh(text).map_err(|e| KeyError::Malformed(e.to_string()))?;
    check_algorithm(&key)?;
    let algorithm = key.algorithm().as_str().to_string();
    let fingerprint = fingerprint(&key);
    let public_key = key
        .to_openssh()
        .map_err(|e| KeyError::Malformed(e.to_string()))?;
    let name = choose_name(name, key.comment().as_str_lossy(), &algorithm, &fingerprint)?;
    Ok(ParsedKey {
        name,
        algorithm,
        fingerprint,
        public_key,
    })
}

fn check_algorithm(key: &PublicKey) -> Result<(), KeyError> {
    match key.key_data() {
        KeyData::Ed25519(_) | KeyData::SkEd25519(_) | KeyData::SkEcdsaSha2NistP256(_) => Ok(()),
        // The curve is checked against the algorithm name by the parser.
        KeyData::Ecdsa(_) => Ok(()),
        KeyData::Rsa(rsa) => {
            let bits = rsa
                .n()
                .as_positive_bytes()
                .and_then(|b| {
                    let first = b.first()?;
                    u32::try_from(b.len() * 8)
                        .ok()?
                        .checked_sub(first.leading_zeros())
                })
                .unwrap_or(0);
            if bits < MIN_RSA_BITS {
                Err(KeyError::RsaTooShort(bits))
            } else if bits > MAX_RSA_BITS {
                Err(KeyError::RsaTooLong(bits))
            } else {
                Ok(())
            }
        }
        // (Refused by name already; the parser does not return these today.)
        KeyData::Certificate(_) => Err(KeyError::Certificate),
        // DSA, and any algorithm name the library does not know (parsed as opaque data).
        other => Err(KeyError::Unsupported(unsupported_name(other.algorithm()))),
    }
}

fn unsupported_name(a: Algorithm) -> String {
    let name = a.as_str();
    // The name is the user's own text for unknown algorithms: keep it short and plain.
    let shown: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
    if shown.is_empty() {
        "these".into()
    } else {
        shown
    }
}

fn choose_name(
    given: Option<&str>,
    comment: &str,
    algorithm: &str,
    fingerprint: &str,
) -> Result<String, KeyError> {
    if let Some(given) = given.map(str::trim).filter(|n| !n.is_empty()) {
        let chars = given.chars().count();
        if chars > MAX_NAME_CHARS {
            return Err(KeyError::NameTooLong(chars));
        }
        if given.chars().any(char::is_control) {
            return Err(KeyError::NameControl);
        }
        return Ok(given.to_string());
    }
    let comment: String = comment
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME_CHARS)
        .collect();
    if !comment.trim().is_empty() {
        return Ok(comment.trim().to_string());
    }
    let short: String = fingerprint.chars().take("SHA256:".len() + 8).collect();
    Ok(format!("{algorithm} {short}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use russh::keys::ssh_key::public::{Ed25519PublicKey, SkEd25519};
    use std::path::Path;
    use std::process::Command;

    /// Makes a key pair with OpenSSH's own `ssh-keygen`; returns (public line, private file).
    fn keygen(dir: &Path, file: &str, args: &[&str]) -> (String, String) {
        let path = dir.join(file);
        let out = Command::new("ssh-keygen")
            .args(["-q", "-N", "", "-f"])
            .arg(&path)
            .args(args)
            .output()
            .expect("ssh-keygen is needed for these tests: apt-get install openssh-client");
        assert!(out.status.success(), "ssh-keygen {args:?}: {out:?}");
        let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        let private = std::fs::read_to_string(&path).unwrap();
        (public, private)
    }

    /// The fingerprint as `ssh-keygen -l` prints it.
    fn openssh_fingerprint(dir: &Path, file: &str) -> String {
        let out = Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(dir.join(file).with_extension("pub"))
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_whitespace().nth(1).unwrap().to_string()
    }

    /// An SSH wire blob: each part as a length-prefixed string.
    fn blob(parts: &[&[u8]]) -> String {
        let mut v = Vec::new();
        for p in parts {
            v.extend((p.len() as u32).to_be_bytes());
            v.extend(*p);
        }
        base64::engine::general_purpose::STANDARD.encode(v)
    }

    #[test]
    fn accepts_what_ssh_keygen_makes_with_its_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        for (file, args, algorithm) in [
            ("ed", vec!["-t", "ed25519"], "ssh-ed25519"),
            (
                "ec256",
                vec!["-t", "ecdsa", "-b", "256"],
                "ecdsa-sha2-nistp256",
            ),
            (
                "ec384",
                vec!["-t", "ecdsa", "-b", "384"],
                "ecdsa-sha2-nistp384",
            ),
            (
                "ec521",
                vec!["-t", "ecdsa", "-b", "521"],
                "ecdsa-sha2-nistp521",
            ),
            ("rsa", vec!["-t", "rsa", "-b", "2048"], "ssh-rsa"),
        ] {
            let mut args = args;
            args.extend(["-C", "alice@laptop"]);
            let (public, _) = keygen(dir.path(), file, &args);
            let k = parse(&public, None).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(k.algorithm, algorithm);
            assert_eq!(
                k.fingerprint,
                openssh_fingerprint(dir.path(), file),
                "{file}"
            );
            assert_eq!(k.public_key, public.trim(), "canonical form of {file}");
            assert_eq!(k.name, "alice@laptop", "the comment is the default name");
        }
    }

    #[test]
    fn refuses_short_rsa_saying_how_many_bits() {
        let dir = tempfile::tempdir().unwrap();
        let (public, _) = keygen(dir.path(), "r1024", &["-t", "rsa", "-b", "1024"]);
        let e = parse(&public, None).unwrap_err();
        assert_eq!(e, KeyError::RsaTooShort(1024));
        assert!(e.to_string().contains("has 1024 bits"), "{e}");
        // Bits are counted exactly, not rounded up to whole bytes.
        let (public, _) = keygen(dir.path(), "r2047", &["-t", "rsa", "-b", "2047"]);
        assert_eq!(parse(&public, None), Err(KeyError::RsaTooShort(2047)));
    }

    #[test]
    fn a_private_key_gets_its_own_warning() {
        let dir = tempfile::tempdir().unwrap();
        let (_, openssh) = keygen(dir.path(), "ed", &["-t", "ed25519"]);
        let (_, pem) = keygen(dir.path(), "pem", &["-t", "ecdsa", "-m", "PEM"]);
        for private in [openssh, pem] {
            let e = parse(&private, Some("oops")).unwrap_err();
            assert_eq!(e, KeyError::PrivateKey, "{private}");
            assert!(e.to_string().contains("never paste a private key"), "{e}");
            assert_eq!(AppError::from(e).code(), "private_key");
        }
    }

    #[test]
    fn refuses_garbage_certificates_and_other_forms() {
        let dir = tempfile::tempdir().unwrap();
        let (public, _) = keygen(dir.path(), "u", &["-t", "ed25519"]);
        for garbage in [
            "hello world",
            "ssh-ed25519",
            "ssh-ed25519 not!base64",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA==",
            "AAAAC3NzaC1lZDI1NTE5AAAAILM+rvN+ot98qgEN796jTiQfZfG1KaT0PtFDJ/XFSqti",
        ] {
            let e = parse(garbage, None).unwrap_err();
            assert!(matches!(e, KeyError::Malformed(_)), "{garbage:?}: {e:?}");
            assert_eq!(e.code(), "not_a_public_key");
        }
        // The text names one algorithm and the data another.
        let swapped = public.replacen("ssh-ed25519", "ssh-rsa", 1);
        assert!(matches!(parse(&swapped, None), Err(KeyError::Malformed(_))));

        let status = Command::new("ssh-keygen")
            .args(["-q", "-s"])
            .arg(dir.path().join("u"))
            .args(["-I", "id", "-n", "alice"])
            .arg(dir.path().join("u.pub"))
            .status()
            .unwrap();
        assert!(status.success());
        let cert = std::fs::read_to_string(dir.path().join("u-cert.pub")).unwrap();
        assert_eq!(parse(&cert, None), Err(KeyError::Certificate));

        let out = Command::new("ssh-keygen")
            .args(["-e", "-f"])
            .arg(dir.path().join("u.pub"))
            .output()
            .unwrap();
        let rfc4716 = String::from_utf8(out.stdout).unwrap();
        assert_eq!(parse(&rfc4716, None), Err(KeyError::Rfc4716));

        let two = format!("{public}{public}");
        assert_eq!(parse(&two, None), Err(KeyError::SeveralLines(2)));
        assert_eq!(parse(" \n\t ", None), Err(KeyError::Empty));
        let huge = format!("ssh-ed25519 {}", "A".repeat(MAX_KEY_BYTES));
        assert!(matches!(parse(&huge, None), Err(KeyError::TooLong(_))));
    }

    #[test]
    fn refuses_dsa_and_unknown_algorithms() {
        let one: &[u8] = &[1];
        let dsa = format!("ssh-dss {}", blob(&[b"ssh-dss", one, one, one, one]));
        let e = parse(&dsa, None).unwrap_err();
        assert_eq!(e, KeyError::Unsupported("ssh-dss".into()));
        assert!(e.to_string().contains("DSA is insecure"), "{e}");
        let name = b"frob-v1@example.com";
        let other = format!("frob-v1@example.com {}", blob(&[name, b"xyz"]));
        let e = parse(&other, None).unwrap_err();
        assert_eq!(
            e,
            KeyError::Unsupported("frob-v1@example.com".into()),
            "{e}"
        );
        assert_eq!(e.code(), "unsupported_algorithm");
    }

    #[test]
    fn accepts_fido_security_keys() {
        let key = PublicKey::new(
            KeyData::SkEd25519(SkEd25519::new(Ed25519PublicKey([7; 32]), "ssh:")),
            "yubikey",
        );
        let k = parse(&key.to_openssh().unwrap(), None).unwrap();
        assert_eq!(k.algorithm, "sk-ssh-ed25519@openssh.com");
        assert_eq!(k.name, "yubikey");
    }

    #[test]
    fn trims_and_names() {
        let dir = tempfile::tempdir().unwrap();
        let (public, _) = keygen(dir.path(), "ed", &["-t", "ed25519", "-C", ""]);
        let plain = parse(&public, None).unwrap();
        assert!(
            plain.name.starts_with("ssh-ed25519 SHA256:") && plain.name.len() == 27,
            "no name and no comment: named from the key: {}",
            plain.name
        );
        let spaced = format!("\r\n  {} \r\n\n", public.trim());
        let k = parse(&spaced, Some("  work laptop  ")).unwrap();
        assert_eq!(k.name, "work laptop");
        assert_eq!(k.public_key, plain.public_key);
        // The comment is not part of the key: same fingerprint, so a duplicate.
        let commented = format!("{} someone-else", public.trim());
        assert_eq!(
            parse(&commented, None).unwrap().fingerprint,
            plain.fingerprint
        );
        let long = "x".repeat(MAX_NAME_CHARS + 1);
        let e = parse(&public, Some(&long)).unwrap_err();
        assert_eq!(e, KeyError::NameTooLong(101));
        let app = AppError::from(e);
        assert_eq!((app.code(), app.field()), ("name_too_long", Some("name")));
        assert_eq!(parse(&public, Some("a\u{7}b")), Err(KeyError::NameControl));
        // A long comment is cut to a name rather than refused.
        let commented = format!("{} {}", public.trim(), "c".repeat(300));
        assert_eq!(parse(&commented, None).unwrap().name.len(), MAX_NAME_CHARS);
    }
}
