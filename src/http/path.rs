//! One spelling of a request path.
//!
//! Upstreams do not agree on what a path means: Tomcat, Jetty, Go's
//! `ServeMux`, nginx (`merge_slashes`) and Python's `http.server` send
//! `//v1/charges`, `/./v1/charges`, `/x/../v1/charges` and `/%761/charges`
//! to the handler of `/v1/charges`, while a proxy that routes on the raw
//! path sees four other paths. A guard in front of them must see what they
//! see, so every path is normalised once, before routing, and the upstream
//! receives the normalised path (as Envoy's `normalize_path` and
//! `merge_slashes` do):
//! - percent-escapes of unreserved characters (RFC 3986 §2.3) are decoded
//!   and the hex digits of every other escape upper-cased (§6.2.2);
//! - repeated slashes are merged;
//! - dot segments are removed (§5.2.4), escaped ones (`%2e`) included.
//!
//! What upstreams disagree about is refused rather than guessed: an encoded
//! slash (`%2F`), a backslash (literal or `%5C`), a `..` that climbs above
//! the root, and a `%` that starts no escape.
//!
//! [`lenient_view`] is how the most forgiving upstreams read the path:
//! `;` parameters stripped from each segment (Tomcat, Jetty), then
//! normalised again. The gateway refuses a path whose route would change
//! under it. Pure functions over strings, no I/O.

/// Why a path has no one spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%2F`: some upstreams decode it into a separator, others do not.
    #[error("the path has an encoded slash (%2F)")]
    EncodedSlash,
    /// `\` or `%5C`: Windows servers and some frameworks read it as `/`.
    #[error("the path has a backslash")]
    Backslash,
    /// `..` with no segment left to remove.
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    /// A `%` not followed by two hex digits.
    #[error("the path has a '%' that starts no percent-escape")]
    BadEscape,
}

/// The normalised form of an origin-form `path`, or `None` when it is
/// normal already (the common case: one pass over the bytes, no
/// allocation). A path that does not start with `/` (`*`) is left alone.
pub fn normalize(path: &str) -> Result<Option<String>, PathError> {
    if !path.starts_with('/') || is_normal(path.as_bytes()) {
        return Ok(None);
    }
    let decoded = decode_unreserved(path)?;
    let normal = remove_dots_and_merge(&decoded)?;
    Ok((normal != path).then_some(normal))
}

/// The path as an upstream that strips `;` parameters from each segment
/// reads it, normalised; `None` when it has no `;` (the same path).
pub fn lenient_view(path: &str) -> Result<Option<String>, PathError> {
    if !path.contains(';') {
        return Ok(None);
    }
    let stripped: Vec<&str> = path.split('/').map(|segment| segment.split(';').next().unwrap_or("")).collect();
    let stripped = stripped.join("/");
    Ok(Some(normalize(&stripped)?.unwrap_or(stripped)))
}

/// `true` when nothing in `path` needs normalising: no `%`, no `\`, no
/// empty segment and no dot segment.
fn is_normal(path: &[u8]) -> bool {
    let mut segment_start = 0;
    for (i, &byte) in path.iter().enumerate() {
        match byte {
            b'%' | b'\\' => return false,
            b'/' => {
                if i > 0 && is_empty_or_dots(&path[segment_start..i]) {
                    return false;
                }
                segment_start = i + 1;
            }
            _ => {}
        }
    }
    // A trailing empty segment is a trailing slash, which is kept.
    let last = &path[segment_start..];
    last.is_empty() || !is_empty_or_dots(last)
}

fn is_empty_or_dots(segment: &[u8]) -> bool {
    matches!(segment, b"" | b"." | b"..")
}

/// Decodes escapes of unreserved characters; upper-cases the rest.
fn decode_unreserved(path: &str) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => return Err(PathError::Backslash),
            b'%' => {
                match escape_at(&bytes[i..]).ok_or(PathError::BadEscape)? {
                    b'/' => return Err(PathError::EncodedSlash),
                    b'\\' => return Err(PathError::Backslash),
                    byte if is_unreserved(byte) => out.push(char::from(byte)),
                    byte => push_escape(&mut out, byte),
                }
                i += 3;
            }
            _ => {
                // Copy the run up to the next special byte at once (a path
                // is ASCII, but copy as text all the same).
                let end = bytes[i..].iter().position(|&b| b == b'%' || b == b'\\').map_or(bytes.len(), |n| i + n);
                out.push_str(&path[i..end]);
                i = end;
            }
        }
    }
    Ok(out)
}

/// RFC 3986 §5.2.4's dot-segment removal, with empty segments merged; a
/// trailing slash (or a trailing `.` or `..`, which stand for one) is kept.
fn remove_dots_and_merge(path: &str) -> Result<String, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut trailing_slash = false;
    for (n, segment) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        match *segment {
            "" => trailing_slash = last,
            "." => trailing_slash = last,
            ".." => {
                kept.pop().ok_or(PathError::AboveRoot)?;
                trailing_slash = last;
            }
            segment => {
                kept.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if kept.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(out)
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3: `ALPHA / DIGIT / "-" / "." / "_" / "~"`.
pub(crate) fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// `byte` as an upper-case percent-escape.
pub(crate) fn push_escape(out: &mut String, byte: u8) {
    out.push('%');
    out.push(char::from(HEX_UPPER[usize::from(byte >> 4)]));
    out.push(char::from(HEX_UPPER[usize::from(byte & 0xf)]));
}

/// The value of the escape at the start of `bytes` (`%` and two hex digits).
pub(crate) fn escape_at(bytes: &[u8]) -> Option<u8> {
    match bytes {
        [b'%', high, low, ..] => Some(hex(*high)? << 4 | hex(*low)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalize(path).map(|n| n.unwrap_or_else(|| path.to_owned()))
    }

    #[test]
    fn the_spellings_upstreams_route_alike_become_one() {
        for spelling in [
            "/v1/charges",
            "//v1/charges",
            "/v1//charges",
            "/./v1/charges",
            "/x/../v1/charges",
            "/%2e/v1/charges",
            "/a/%2E%2E/v1/charges",
            "/v1/x/..%2f",
            "/%761/charges",
            "/v1/./charges",
            "/v1/x/y/../../charges",
        ] {
            let expected =
                if spelling.contains("%2f") { Err(PathError::EncodedSlash) } else { Ok("/v1/charges".into()) };
            assert_eq!(norm(spelling), expected, "{spelling}");
        }
    }

    #[test]
    fn trailing_slashes_and_the_root_are_kept() {
        assert_eq!(norm("/v1/").unwrap(), "/v1/");
        assert_eq!(norm("/v1//").unwrap(), "/v1/");
        assert_eq!(norm("/v1/.").unwrap(), "/v1/");
        assert_eq!(norm("/v1/x/..").unwrap(), "/v1/");
        assert_eq!(norm("/").unwrap(), "/");
        assert_eq!(norm("//").unwrap(), "/");
        assert_eq!(norm("/.").unwrap(), "/");
        assert_eq!(norm("/a/..").unwrap(), "/");
        assert_eq!(norm("*").unwrap(), "*");
    }

    #[test]
    fn other_escapes_stay_escaped_in_upper_case() {
        assert_eq!(norm("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(norm("/a%20b").unwrap(), "/a%20b");
        assert_eq!(norm("/a%3Bb").unwrap(), "/a%3Bb");
        assert_eq!(norm("/%7e%2D%5f").unwrap(), "/~-_");
    }

    #[test]
    fn what_upstreams_disagree_about_is_refused() {
        assert_eq!(norm("/v1%2Fcharges"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/v1%2fcharges"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/v1\\charges"), Err(PathError::Backslash));
        assert_eq!(norm("/v1%5ccharges"), Err(PathError::Backslash));
        assert_eq!(norm("/.."), Err(PathError::AboveRoot));
        assert_eq!(norm("/a/../../v1"), Err(PathError::AboveRoot));
        assert_eq!(norm("/%2e%2e/v1"), Err(PathError::AboveRoot));
        assert_eq!(norm("/a%zzb"), Err(PathError::BadEscape));
        assert_eq!(norm("/a%4"), Err(PathError::BadEscape));
    }

    #[test]
    fn a_normal_path_is_not_copied() {
        for path in ["/", "/v1/charges", "/v1/charges/", "/a.b/..c/.d", "/v1;x=1/charges", "/a-b_c~d"] {
            assert_eq!(normalize(path), Ok(None), "{path}");
        }
    }

    #[test]
    fn the_lenient_view_strips_path_parameters() {
        assert_eq!(lenient_view("/v1;jsessionid=x/charges").unwrap().as_deref(), Some("/v1/charges"));
        assert_eq!(lenient_view("/x/..;/v1/charges").unwrap().as_deref(), Some("/v1/charges"));
        assert_eq!(lenient_view("/v1/charges").unwrap(), None);
        assert_eq!(lenient_view("/..;/v1"), Err(PathError::AboveRoot));
    }

    proptest! {
        #[test]
        fn normalising_is_idempotent_and_never_panics(path in "/[a-c./%25fF;\\\\]{0,24}") {
            if let Ok(once) = norm(&path) {
                prop_assert_eq!(normalize(&once), Ok(None), "{} -> {}", path, once);
                prop_assert!(!once.contains("//") && !once.contains("/./") && !once.contains("/../"));
            }
            let _ = lenient_view(&path);
        }
    }
}
