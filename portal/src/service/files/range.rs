//! The `Range` header of a download (RFC 9110, section 14): one range of bytes is served
//! (206); several ranges, another unit, or a header that does not parse are ignored and
//! the whole file is served (200), as the RFC allows; a range wholly past the end is
//! refused (416).

/// What a download serves of a file of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// All of it (200).
    Whole,
    /// Bytes `start..=end` (206, `Content-Range: bytes start-end/size`).
    Part { start: u64, end: u64 },
    /// Nothing the file has (416, `Content-Range: bytes */size`).
    Unsatisfiable,
}

/// What `header` asks of a file of `size` bytes.
pub fn wanted(header: Option<&str>, size: u64) -> Wanted {
    let Some(h) = header else {
        return Wanted::Whole;
    };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Wanted::Whole;
    };
    if spec.contains(',') {
        return Wanted::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Wanted::Whole;
    };
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (first.trim().is_empty(), num(first), num(last)) {
        // `-N`: the last N bytes.
        (true, _, Some(n)) => {
            if n == 0 || size == 0 {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part {
                    start: size.saturating_sub(n),
                    end: size - 1,
                }
            }
        }
        // `A-` or `A-B`.
        (false, Some(start), last) if last.is_some() || last_is_empty(last, spec) => {
            if let Some(end) = last {
                if end < start {
                    return Wanted::Whole;
                }
            }
            if start >= size {
                return Wanted::Unsatisfiable;
            }
            let end = last.map_or(size - 1, |e| e.min(size - 1));
            Wanted::Part { start, end }
        }
        _ => Wanted::Whole,
    }
}

/// `A-`: nothing after the dash.
fn last_is_empty(last: Option<u64>, spec: &str) -> bool {
    last.is_none() && spec.trim().ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_range_is_served() {
        let part = |start, end| Wanted::Part { start, end };
        assert_eq!(wanted(Some("bytes=0-3"), 10), part(0, 3));
        assert_eq!(wanted(Some("bytes=4-"), 10), part(4, 9));
        assert_eq!(wanted(Some("bytes=-3"), 10), part(7, 9));
        assert_eq!(wanted(Some("bytes=-30"), 10), part(0, 9));
        assert_eq!(wanted(Some("bytes=8-100"), 10), part(8, 9));
        assert_eq!(wanted(Some("bytes= 2-2"), 10), part(2, 2));
    }

    #[test]
    fn others_are_ignored_or_refused() {
        assert_eq!(wanted(None, 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=0-1,4-5"), 10), Wanted::Whole);
        assert_eq!(wanted(Some("items=0-1"), 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=5-2"), 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=x-2"), 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=-"), 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=+1-2"), 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=10-"), 10), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=-0"), 10), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=0-"), 0), Wanted::Unsatisfiable);
    }
}
