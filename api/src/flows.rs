//! What ties jobs together into a researcher's workflow: a job's `name` and `tags` (to
//! find a sweep's runs again), and the rules on them. The filters of the job list
//! (`?name=`, `?tag=k=v`) are checked here too, so the portal and the CLI refuse the same
//! input in the same words.
//!
//! Invariants: a tag key or value never holds a quote, a backslash or a space, so a tag
//! reads the same in a URL, a shell and the JSON the portal stores it in.

use crate::Invalid;
use std::collections::BTreeMap;

/// The longest job name, in characters.
pub const MAX_NAME_CHARS: usize = 128;
/// The most tags a job may have.
pub const MAX_TAGS: usize = 16;
/// The longest tag key, in characters.
pub const MAX_TAG_KEY: usize = 64;
/// The longest tag value, in characters.
pub const MAX_TAG_VALUE: usize = 128;

/// A job's name: 1 to 128 characters, none of them a control character. (Leading and
/// trailing spaces are trimmed by the portal.)
pub fn name(field: &str, name: &str) -> Result<(), Invalid> {
    let n = name.trim();
    if n.is_empty() {
        return Err(Invalid::new(
            field,
            "a name must not be empty; leave it out",
        ));
    }
    let chars = n.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(Invalid::new(
            field,
            format!("the name is {chars} characters; at most {MAX_NAME_CHARS} are allowed"),
        ));
    }
    if n.chars().any(char::is_control) {
        return Err(Invalid::new(field, "the name holds a control character"));
    }
    Ok(())
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-".contains(c)
}

fn value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-:/@+%,".contains(c)
}

/// One tag: a key of 1 to 64 letters, digits, `_`, `.` and `-` (starting with a letter
/// or digit), and a value of at most 128 of those and `:/@+%,`.
pub fn tag(field: &str, key: &str, value: &str) -> Result<(), Invalid> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_TAG_KEY
        && key.chars().all(key_char)
        && key.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !key_ok {
        return Err(Invalid::new(
            field,
            format!(
                "tag key {key:?}: use 1 to {MAX_TAG_KEY} letters, digits, '_', '.' and '-', \
                 starting with a letter or digit"
            ),
        ));
    }
    if value.len() > MAX_TAG_VALUE || !value.chars().all(value_char) {
        return Err(Invalid::new(
            field,
            format!(
                "tag {key}: the value {value:?} may have at most {MAX_TAG_VALUE} letters, \
                 digits and _.-:/@+%,"
            ),
        ));
    }
    Ok(())
}

/// A job's tags: at most 16, each a valid [`tag`].
pub fn tags(tags: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if tags.len() > MAX_TAGS {
        return Err(Invalid::new(
            "tags",
            format!("{} tags; a job may have at most {MAX_TAGS}", tags.len()),
        ));
    }
    tags.iter().try_for_each(|(k, v)| tag("tags", k, v))
}

/// `key=value` (from `--tag`, `?tag=`) as a checked pair; the error names `field`.
pub fn parse_tag(field: &str, s: &str) -> Result<(String, String), Invalid> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| Invalid::new(field, format!("{s:?} is not key=value")))?;
    tag(field, k, v)?;
    Ok((k.to_string(), v.to_string()))
}

/// A name filter (`?name=`): the whole name, or with a trailing `*` its beginning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameFilter {
    Exactly(String),
    StartsWith(String),
}

impl NameFilter {
    pub fn parse(s: &str) -> Result<NameFilter, Invalid> {
        let s = s.trim();
        match s.strip_suffix('*') {
            Some("") => Err(Invalid::new("name", "name=*: give the name's beginning")),
            Some(prefix) => {
                name("name", prefix)?;
                Ok(NameFilter::StartsWith(prefix.to_string()))
            }
            None => {
                name("name", s)?;
                Ok(NameFilter::Exactly(s.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_printable_and_not_empty() {
        assert!(name("name", "sweep lr=0.01 (run 3)").is_ok());
        assert!(
            name("name", &"é".repeat(128)).is_ok(),
            "characters, not bytes"
        );
        assert_eq!(name("name", &"x".repeat(129)).unwrap_err().field, "name");
        assert!(name("name", "  ").is_err());
        assert!(name("name", "a\nb").is_err());
    }

    #[test]
    fn tags_have_plain_keys_and_values() {
        let mut t = BTreeMap::new();
        t.insert("lr".to_string(), "0.001".to_string());
        t.insert("dataset".to_string(), "imagenet-1k".to_string());
        t.insert("empty".to_string(), String::new());
        assert!(tags(&t).is_ok());
        for (k, v) in [
            ("", "x"),
            ("-k", "x"),
            ("k k", "x"),
            ("k", "a b"),
            ("k", "a\"b"),
            ("k", "a\\b"),
        ] {
            let e = tag("tags", k, v).unwrap_err();
            assert_eq!(e.field, "tags", "{k:?}={v:?}");
        }
        let many: BTreeMap<String, String> = (0..17)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(tags(&many).unwrap_err().message.contains("at most 16"));
    }

    #[test]
    fn tag_and_name_filters_parse() {
        assert_eq!(
            parse_tag("tag", "lr=0.1").unwrap(),
            ("lr".into(), "0.1".into())
        );
        assert_eq!(parse_tag("tag", "lr").unwrap_err().field, "tag");
        assert_eq!(
            NameFilter::parse("sweep-*").unwrap(),
            NameFilter::StartsWith("sweep-".into())
        );
        assert_eq!(
            NameFilter::parse("eval").unwrap(),
            NameFilter::Exactly("eval".into())
        );
        assert_eq!(NameFilter::parse("*").unwrap_err().field, "name");
    }
}
