//! Text from outside (a destination's response body, a database server's
//! message, an error's chain of causes) made safe to print on one log line
//! or store as `last_error`.

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

/// An error followed by its sources, `: `-joined, on one line.
///
/// tokio-postgres, deadpool and hyper print only their outermost layer
/// ("db error", "error performing TLS handshake", "client error
/// (Connect)"), and the cause ("invalid peer certificate: UnknownIssuer",
/// the server's `FATAL` message, "Connection refused") is what an
/// operator needs. A source whose text an outer layer already printed is
/// not repeated. An error the server sent is printed as its severity,
/// message and SQLSTATE (with its detail and hint), in place of the
/// driver's bare "db error". The whole is [`printable`]: a server message
/// may hold a newline, and a log line must not.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut printed = String::new();
        let mut next = Some(self.0);
        while let Some(error) = next {
            next = error.source();
            let text = match error.downcast_ref::<tokio_postgres::error::DbError>() {
                Some(db) => server_error(db),
                // Its source, the server's error, says all it would.
                None if error.downcast_ref::<tokio_postgres::Error>().is_some_and(|e| e.as_db_error().is_some()) => {
                    continue;
                }
                None => error.to_string(),
            };
            if !printed.contains(&text) {
                if !printed.is_empty() {
                    printed.push_str(": ");
                }
                printed.push_str(&text);
            }
        }
        f.write_str(&printable(&printed, usize::MAX))
    }
}

/// `ERROR: permission denied for table outbox (SQLSTATE 42501)`, then the
/// detail and the hint if the server sent them.
fn server_error(db: &tokio_postgres::error::DbError) -> String {
    let mut text = format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        text.push_str("; DETAIL: ");
        text.push_str(detail);
    }
    if let Some(hint) = db.hint() {
        text.push_str("; HINT: ");
        text.push_str(hint);
    }
    text
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
