//! Uploads in parts (`/api/v1/uploads`): a large file sent as numbered parts, each its own
//! short request, so that a dropped connection costs one part, not the file, and a
//! browser that was closed picks up where it stopped.
//!
//! 1. `POST /api/v1/uploads` with an [`UploadStart`] reserves the whole size against the
//!    space's quota (413 when it does not fit) and answers an [`UploadView`]: its id and
//!    [`UploadView::part_bytes`].
//! 2. `PUT /api/v1/uploads/{id}/parts/{n}` sends part `n` (0-based): bytes
//!    `n * part_bytes ..` up to the next part or the end. Sending a part again replaces it.
//! 3. `GET /api/v1/uploads` lists the caller's unfinished uploads (to resume one, find it
//!    by space, path and size and send the parts it lacks); `GET /api/v1/uploads/{id}`
//!    shows one.
//! 4. `POST /api/v1/uploads/{id}/complete` joins the parts into the file (checking the
//!    SHA-256 when the start named one); `DELETE /api/v1/uploads/{id}` gives it up.
//!
//! Invariants: nothing of an upload is visible as a file before it completes; an upload
//! nobody sends to for [`RESUMABLE_FOR_S`] is removed with its parts.

use crate::files::{check_path, parse_ref, Space};
use crate::Invalid;
use serde::{Deserialize, Serialize};

/// The size of every part but the last (8 MiB; the store's own part size).
pub const PART_BYTES: u64 = 8 << 20;
/// An unfinished upload is kept this long after its last part (a day).
pub const RESUMABLE_FOR_S: i64 = 24 * 3600;

/// `POST /api/v1/uploads`: the file an upload will make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UploadStart {
    /// Where the file goes: `PATH` in the caller's space, `lab:SLUG/PATH` in a lab's.
    pub path: String,
    /// The file's size in bytes; the parts must add up to it.
    pub size: u64,
    /// The file's SHA-256 in hex, checked when the parts are joined.
    #[serde(default)]
    pub sha256: Option<String>,
}

impl UploadStart {
    /// The space and the path it names, checked (`path` is the field in a refusal).
    pub fn target(&self) -> Result<(Space, &str), Invalid> {
        let (space, path) = parse_ref("path", &self.path)?;
        check_path("path", path)?;
        if let Some(s) = &self.sha256 {
            if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Invalid::new(
                    "sha256",
                    format!("sha256 must be 64 hex digits, got {s:?}"),
                ));
            }
        }
        Ok((space, path))
    }
}

/// An upload in parts, as `POST`/`GET /api/v1/uploads...` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadView {
    /// The upload's id in the routes.
    pub id: i64,
    /// Where the file goes, as [`UploadStart::path`] names it (`lab:SLUG/` for a lab's).
    pub path: String,
    /// The file's size in bytes.
    pub size: u64,
    /// The size of every part but the last.
    pub part_bytes: u64,
    /// How many parts the file has.
    pub parts: u32,
    /// The parts stored so far, ascending.
    pub received: Vec<u32>,
    /// Bytes of the parts stored so far.
    pub received_bytes: u64,
}

/// How many parts a file of `size` bytes has (one, empty, for an empty file).
pub fn part_count(size: u64) -> u32 {
    u32::try_from(size.div_ceil(PART_BYTES).max(1)).unwrap_or(u32::MAX)
}

/// The bytes part `n` of a file of `size` bytes holds, or `None` past the last part.
pub fn part_len(size: u64, n: u32) -> Option<u64> {
    if n >= part_count(size) {
        return None;
    }
    let start = u64::from(n) * PART_BYTES;
    Some((size - start).min(PART_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_file_exactly() {
        for size in [
            0,
            1,
            PART_BYTES - 1,
            PART_BYTES,
            PART_BYTES + 1,
            5 * PART_BYTES + 7,
        ] {
            let n = part_count(size);
            let total: u64 = (0..n).map(|i| part_len(size, i).unwrap()).sum();
            assert_eq!(total, size, "size {size}");
            assert_eq!(part_len(size, n), None);
            assert!((0..n).all(|i| i + 1 == n || part_len(size, i) == Some(PART_BYTES)));
        }
        assert_eq!(part_count(0), 1);
        assert_eq!(part_count(PART_BYTES + 1), 2);
    }

    #[test]
    fn a_start_names_its_bad_field() {
        let ok = UploadStart {
            path: "lab:vision/data/a.bin".into(),
            size: 3,
            sha256: None,
        };
        assert_eq!(
            ok.target().unwrap(),
            (Space::Lab("vision".into()), "data/a.bin")
        );
        let bad = UploadStart {
            path: "../x".into(),
            ..ok.clone()
        };
        assert_eq!(bad.target().unwrap_err().field, "path");
        let sha = UploadStart {
            sha256: Some("xyz".into()),
            ..ok
        };
        assert_eq!(sha.target().unwrap_err().field, "sha256");
    }
}
