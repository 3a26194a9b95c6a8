//! Files in the campus object store: a user's own space (`/api/v1/files/...`) and a lab's
//! shared one (`/api/v1/labs/{slug}/files/...`). The types of the listing, of the use
//! shown beside a quota, of the quota settings, and the rules a path must keep, which
//! the portal checks on every request and the CLI before it sends one.
//!
//! Invariants: a path that passes [`check_path`] is non-empty UTF-8 of at most
//! [`MAX_PATH_BYTES`] bytes, relative, made of segments separated by single `/`, none of
//! them empty, `.` or `..`, and holds no control character; so it names one place under
//! its space and nothing outside it, and prints on one line.

use crate::Invalid;
use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};

/// The longest path, in bytes of UTF-8.
pub const MAX_PATH_BYTES: usize = 1024;

/// The header a client may send with an upload: the SHA-256 it expects (hex); the portal
/// refuses the upload, keeping nothing, when the bytes it received hash otherwise. The
/// portal sends it with every download.
pub const SHA256_HEADER: &str = "x-commons-sha256";

/// One file of a listing (`GET /api/v1/files?prefix=P`), and the answer to an upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    /// The path in its space (`data/train.tar`).
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// When its contents were last written (UTC).
    pub modified: NaiveDateTime,
    /// SHA-256 of the contents, in hex, computed as they arrived.
    pub sha256: String,
}

/// What a file space holds against its quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SpaceUse {
    /// Bytes of its files, plus the bytes of uploads under way (they count as they arrive).
    pub used_bytes: u64,
    /// How many files.
    pub files: u64,
    /// The most it may hold, in bytes (10^9 to the GB).
    pub quota_bytes: u64,
}

/// `PUT /api/v1/labs/{slug}/files-quota` (operators) and
/// `PUT /api/v1/labs/{slug}/members/{username}/files-quota` (the lab's admins): the quota
/// in GB (10^9 bytes); `null` goes back to the campus default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FilesQuotaRequest {
    #[serde(default)]
    pub quota_gb: Option<f64>,
}

/// What a files-quota setting stored, and the quota now in force for the space it governs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FilesQuotaSaved {
    /// The value set (`null`: none, the campus default applies).
    pub quota_gb: Option<f64>,
    /// The quota in force now, in bytes.
    pub quota_bytes: u64,
}

/// Which space a file reference names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Space {
    /// The caller's own.
    Mine,
    /// A lab's, by slug.
    Lab(String),
}

/// A reference to a file or a folder as users write it: `PATH` in their own space,
/// `lab:SLUG/PATH` in a lab's. `field` names it in a refusal. The path part is not
/// checked here (a prefix may be empty or end in `/`).
pub fn parse_ref<'a>(field: &str, s: &'a str) -> Result<(Space, &'a str), Invalid> {
    let Some(rest) = s.strip_prefix("lab:") else {
        return Ok((Space::Mine, s));
    };
    let (slug, path) = rest.split_once('/').unwrap_or((rest, ""));
    crate::rules::slug(field, slug).map_err(|e| {
        Invalid::new(
            field,
            format!("{s:?} names a lab as lab:SLUG/PATH, and its slug is wrong: {e}"),
        )
    })?;
    Ok((Space::Lab(slug.to_string()), path))
}

/// The most inputs a job may name.
pub const MAX_INPUTS: usize = 64;

/// One of a job's inputs (`inputs`), as parsed from what the user wrote: a file or a
/// folder (a trailing `/`: everything under it) of their own space or a lab's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub space: Space,
    /// The path in its space, without the folder's trailing `/`.
    pub path: String,
    /// A folder: every file whose path starts with `path/`.
    pub folder: bool,
}

impl Input {
    /// Where its files are under `/inputs`: `PATH` for the owner's space,
    /// `lab/SLUG/PATH` for a lab's.
    pub fn staged_path(&self) -> String {
        match &self.space {
            Space::Mine => self.path.clone(),
            Space::Lab(slug) => format!("lab/{slug}/{}", self.path),
        }
    }

    /// The prefix of the space's listing that holds its files.
    pub fn prefix(&self) -> String {
        if self.folder {
            format!("{}/", self.path)
        } else {
            self.path.clone()
        }
    }
}

/// One input as written: `PATH`, `PATH/` (a folder), `lab:SLUG/PATH[/]`. A refusal names
/// `inputs` and the input.
pub fn parse_input(s: &str) -> Result<Input, Invalid> {
    let field = "inputs";
    let (space, rest) = parse_ref(field, s)?;
    let (path, folder) = match rest.strip_suffix('/') {
        Some(p) => (p, true),
        None => (rest, false),
    };
    check_path(field, path)
        .map_err(|e| Invalid::new(field, format!("input {s:?}: {}", e.message)))?;
    Ok(Input {
        space,
        path: path.to_string(),
        folder,
    })
}

/// A job's inputs: at most [`MAX_INPUTS`], each well formed, none named twice, and no two
/// staged at the same place (a file and a folder of the same name).
pub fn check_inputs(inputs: &[String]) -> Result<Vec<Input>, Invalid> {
    if inputs.len() > MAX_INPUTS {
        return Err(Invalid::new(
            "inputs",
            format!(
                "a job names at most {MAX_INPUTS} inputs, not {}",
                inputs.len()
            ),
        ));
    }
    let parsed = inputs
        .iter()
        .map(|s| parse_input(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = std::collections::BTreeSet::new();
    for (i, s) in parsed.iter().zip(inputs) {
        if !seen.insert(i.staged_path()) {
            return Err(Invalid::new(
                "inputs",
                format!("input {s:?} is named twice (as a file or a folder)"),
            ));
        }
    }
    Ok(parsed)
}

/// A file's path: see the module's invariants. The refusal says which rule it breaks.
pub fn check_path(field: &str, p: &str) -> Result<(), Invalid> {
    let bad = |why: String| Err(Invalid::new(field, why));
    if p.is_empty() {
        return bad("a path is required (like data/train.tar)".into());
    }
    if p.len() > MAX_PATH_BYTES {
        return bad(format!(
            "a path has at most {MAX_PATH_BYTES} bytes; this one has {}",
            p.len()
        ));
    }
    if p.starts_with('/') {
        return bad(format!(
            "{p:?} starts with '/': paths are relative to the file space (data/x, not /data/x)"
        ));
    }
    if let Some(c) = p.chars().find(|c| c.is_control()) {
        return bad(format!(
            "{p:?} holds the control character U+{:04X}: paths may not",
            c as u32
        ));
    }
    for seg in p.split('/') {
        match seg {
            "" => {
                return bad(format!(
                    "{p:?} has an empty segment ('//' or a '/' at the end): name a file, \
                     with single '/' between folders"
                ))
            }
            "." | ".." => {
                return bad(format!(
                    "{p:?} has a {seg:?} segment: paths may not use '.' or '..'"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// A listing's prefix: empty (everything), a path, or a path and a final `/` (a folder).
pub fn check_prefix(field: &str, p: &str) -> Result<(), Invalid> {
    match p.strip_suffix('/') {
        _ if p.is_empty() => Ok(()),
        Some(folder) => check_path(field, folder),
        None => check_path(field, p),
    }
}

/// A path for a URL: every byte but unreserved characters and '/' percent-encoded, so
/// each segment reaches the portal as it is.
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Each byte of `path` but unreserved characters and '/' percent-encoded: a file path as
/// a URL path (what [`percent_decode`] reads back).
pub fn percent_encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `%XX` as the byte XX, anything else as it is: a path from a URL, decoded once (the
/// caller checks the bytes are UTF-8).
pub fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Bytes in words with two significant figures at least: "512 B", "1.5 kB", "2.25 GB"
/// (decimal units, as the quotas are given).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{n} B");
    }
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    format!("{s} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_paths_pass() {
        for p in [
            "a",
            "data/train.tar",
            "ünïcode/файл.txt",
            "with space/and+plus%25",
            ".hidden/..x/x..",
        ] {
            check_path("path", p).unwrap();
        }
        check_path("path", &"x".repeat(MAX_PATH_BYTES)).unwrap();
    }

    #[test]
    fn bad_paths_name_their_rule() {
        let why = |p: &str| check_path("path", p).unwrap_err().message;
        assert!(why("").contains("required"));
        assert!(why(&"é".repeat(513)).contains("at most 1024 bytes"));
        assert!(why("/etc/passwd").contains("relative"));
        assert!(why("a//b").contains("empty segment"));
        assert!(why("a/").contains("empty segment"));
        assert!(why("a/../b").contains("'..'"));
        assert!(why("./a").contains("'.'"));
        assert!(why("..").contains("'..'"));
        assert!(why("a\nb").contains("U+000A"));
        assert_eq!(check_path("inputs", "").unwrap_err().field, "inputs");
    }

    #[test]
    fn prefixes_may_be_empty_or_folders() {
        check_prefix("prefix", "").unwrap();
        check_prefix("prefix", "data/").unwrap();
        check_prefix("prefix", "da").unwrap();
        assert!(check_prefix("prefix", "/").is_err());
        assert!(check_prefix("prefix", "a//").is_err());
        assert!(check_prefix("prefix", "../").is_err());
    }

    #[test]
    fn references_name_their_space() {
        assert_eq!(parse_ref("f", "a/b").unwrap(), (Space::Mine, "a/b"));
        assert_eq!(
            parse_ref("f", "lab:vision/a/b").unwrap(),
            (Space::Lab("vision".into()), "a/b")
        );
        assert_eq!(
            parse_ref("f", "lab:vision").unwrap(),
            (Space::Lab("vision".into()), "")
        );
        let e = parse_ref("dest", "lab:Bad Lab/x").unwrap_err();
        assert_eq!(e.field, "dest");
        assert!(e.message.contains("lab:SLUG/PATH"), "{}", e.message);
    }

    #[test]
    fn inputs_are_files_or_folders_of_a_space() {
        let i = parse_input("data/train.tar").unwrap();
        assert_eq!(i.prefix(), "data/train.tar");
        assert_eq!((i.space, i.folder), (Space::Mine, false));
        let i = parse_input("lab:vision/code/").unwrap();
        assert_eq!(i.space, Space::Lab("vision".into()));
        assert_eq!((i.path.as_str(), i.folder), ("code", true));
        assert_eq!(i.staged_path(), "lab/vision/code");
        assert_eq!(i.prefix(), "code/");
        for bad in [
            "",
            "/etc/passwd",
            "a//b",
            "../x",
            "a/../b",
            "/",
            "lab:vision/",
            "lab:Bad/x",
        ] {
            let e = parse_input(bad).unwrap_err();
            assert_eq!(e.field, "inputs", "{bad}");
        }
        assert!(parse_input("a/../b").unwrap_err().message.contains("'..'"));
        let many: Vec<String> = (0..65).map(|n| format!("f{n}")).collect();
        assert!(check_inputs(&many)
            .unwrap_err()
            .message
            .contains("at most 64"));
        let twice = ["code".to_string(), "code/".to_string()];
        assert!(check_inputs(&twice).unwrap_err().message.contains("twice"));
        assert_eq!(check_inputs(&many[..64]).unwrap().len(), 64);
    }

    #[test]
    fn percent_decoding_is_once_and_bytewise() {
        assert_eq!(percent_decode("a%2Fb%25c"), b"a/b%c");
        assert_eq!(percent_decode("%C3%A9"), "é".as_bytes());
        assert_eq!(percent_decode("%FF"), vec![0xFF]);
        assert_eq!(percent_decode("100%"), b"100%");
        assert_eq!(percent_decode("%4"), b"%4");
        assert_eq!(percent_decode("%zz"), b"%zz");
        assert_eq!(percent_decode(&encode_path("a b/é%")), "a b/é%".as_bytes());
    }

    #[test]
    fn paths_are_encoded_for_urls() {
        assert_eq!(encode_path("a b/é#?%.txt"), "a%20b/%C3%A9%23%3F%25.txt");
    }

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_500), "1.5 kB");
        assert_eq!(human_bytes(2_250_000_000), "2.25 GB");
        assert_eq!(human_bytes(10_000_000_000), "10 GB");
        assert_eq!(human_bytes(123_456_789), "123 MB");
        assert_eq!(human_bytes(600_000), "600 kB");
        assert_eq!(human_bytes(100_000_000_000), "100 GB");
    }
}
