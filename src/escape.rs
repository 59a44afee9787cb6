//! Text from outside (a destination's response body, a database server's
//! message) made safe to print on one log line or store as `last_error`.

/// `text` made safe for one log line or a stored `last_error`, whoever
/// wrote it (a destination's response body, a server's message): control
/// characters (a newline would forge a log line, an escape sequence would
/// drive the operator's terminal), Unicode line and paragraph separators,
/// bidirectional overrides and the backslash itself are escaped as Rust
/// escapes them (`\n`, `\u{1b}`, `\\`), so the escaped text reads back
/// unambiguously. At most `max_chars` characters are kept; `…` marks a cut.
pub fn printable(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars));
    let mut kept = 0usize;
    for c in text.chars() {
        let escaped = c == '\\'
            || c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        let width = if escaped { c.escape_default().count() } else { 1 };
        if kept.saturating_add(width) > max_chars {
            out.push('…');
            break;
        }
        kept += width;
        if escaped {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_has_no_line_breaks_or_escape_sequences_and_reads_back() {
        let forged = "bad\n2026-01-01T00:00:00Z  INFO outbox row delivered\r\u{1b}[2J \u{2028}\\n";
        let shown = printable(forged, usize::MAX);
        assert_eq!(shown, "bad\\n2026-01-01T00:00:00Z  INFO outbox row delivered\\r\\u{1b}[2J \\u{2028}\\\\n");
        assert!(!shown.chars().any(char::is_control));
        assert_eq!(printable("naïve \"quotes\" stay", 100), "naïve \"quotes\" stay");
    }

    #[test]
    fn printable_text_is_bounded_and_marks_the_cut() {
        assert_eq!(printable("abcdef", 4), "abcd…");
        assert_eq!(printable("ab\ncd", 3), "ab…", "an escape is never cut in half");
        assert_eq!(printable("abc", 3), "abc");
    }
}
