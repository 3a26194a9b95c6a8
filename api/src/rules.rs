//! Rules on single values: names of labs and users, image references.

use crate::Invalid;

/// A lab's slug: 1 to 40 lower-case letters, digits and '-', not starting with '-'.
pub fn slug(field: &str, s: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= 40
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            field,
            "use 1 to 40 characters: lower-case letters, digits and '-'",
        ))
    }
}

/// A user name: 1 to 64 letters, digits, '-', '_' and '.'.
pub fn username(s: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "username",
            "use 1 to 64 characters: letters, digits, '-', '_' and '.'",
        ))
    }
}

/// A Docker image reference: `[host[:port]/]path[:tag][@sha256:<64 hex>]`.
pub fn image_reference(s: &str) -> Result<(), Invalid> {
    let bad = |why: &str| {
        Err(Invalid::new(
            "image",
            format!("{s:?} is not a valid image reference: {why}"),
        ))
    };
    if s.is_empty() {
        return Err(Invalid::new("image", "an image is required"));
    }
    if s.len() > 512 {
        return bad("longer than 512 characters");
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        {
            return bad("a digest is sha256: and 64 lower-case hex digits");
        }
    }
    // A tag follows the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            && !t.starts_with(['.', '-']);
        if !ok {
            return bad("a tag is 1 to 128 letters, digits, '_', '.' or '-'");
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (h, port) = host.split_once(':').unwrap_or((host, ""));
        let host_ok = !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
            && (port.is_empty() || port.parse::<u16>().is_ok());
        if !host_ok {
            return bad("the registry host is not valid");
        }
    }
    for p in &parts {
        let ok = !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && p.starts_with(|c: char| c.is_ascii_alphanumeric())
            && p.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return bad(
                "path components are lower-case letters, digits and '.', '_' or '-' between them",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        for ok in [
            "busybox",
            "commons-demo:latest",
            "registry.campus.edu:5000/vision/train:v1.2",
            "localhost/x",
            &format!("pytorch/pytorch@sha256:{}", "a".repeat(64)),
        ] {
            assert!(image_reference(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "UPPER",
            "a b",
            "x:",
            "x@sha256:12",
            "-x",
            "a//b",
            "x:tag with space",
        ] {
            assert_eq!(image_reference(bad).unwrap_err().field, "image", "{bad}");
        }
    }

    #[test]
    fn slugs_and_usernames() {
        assert!(slug("lab", "vision-2").is_ok());
        for bad in ["", "-x", "Vision", "a b", &"x".repeat(41)] {
            assert_eq!(slug("lab", bad).unwrap_err().field, "lab", "{bad:?}");
        }
        assert!(username("j.doe_1").is_ok());
        assert!(username("j doe").is_err());
    }
}
