//! The per-request log line, written by hand.
//!
//! One line per request is the default (`log.level = "info"`), so its cost
//! is paid by every request. Through `tracing`'s formatter that line cost
//! about 11,000 instructions, nearly all of it formatting: a field visitor
//! per value, `Debug` for each string, a `fmt::Write` call per piece, the
//! timestamp's calendar arithmetic. The write itself is one `write(2)`.
//!
//! So when the process's own subscriber is in place ([`install`], called by
//! `app::init_logging` once it has installed plain text or JSON on stderr),
//! the gateway writes the same line, byte for byte, into a reused buffer and
//! appends it to the process's log buffer ([`crate::log_sink`]), where
//! `tracing`'s events go too. Whether the
//! line is written at all is still the filter's decision (`RUST_LOG`,
//! `log.level`), asked through `tracing::enabled!`. Everywhere else — a
//! coloured terminal, a test's own subscriber — the line goes through
//! `tracing` as an event with the same fields.

use std::cell::RefCell;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// How the process's subscriber writes lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// `tracing_subscriber`'s default text format, without colour.
    Text,
    /// `tracing_subscriber`'s JSON format.
    Json,
}

static INSTALLED: OnceLock<LineFormat> = OnceLock::new();

/// Declares that the global subscriber writes uncoloured `format` lines to
/// stderr, so request lines may be written by hand. Only the first call counts.
pub fn install(format: LineFormat) {
    let _ = INSTALLED.set(format);
}

/// The fields of one request line (the target is `idemgate::gateway`, the
/// level `INFO`, the message `request`).
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    /// The route's name, or `-`.
    pub route: &'a str,
    /// The disposition's name.
    pub outcome: &'static str,
    /// The response status.
    pub status: u16,
    /// The scoped key's hash prefix, or `-`.
    pub key: &'a str,
    /// The W3C trace id of the request's `traceparent`, or `-`.
    pub trace_id: &'a str,
    /// Time from the request's head to its response head.
    pub latency_us: u64,
}

thread_local! {
    /// The line buffer, and the formatted second it starts with.
    static BUFFER: RefCell<(Vec<u8>, u64, [u8; 19])> = const { RefCell::new((Vec::new(), u64::MAX, [0; 19])) };
}

/// Writes `line`: by hand if [`install`] allowed it, through `tracing` as
/// an event with the same fields otherwise.
pub fn emit(line: &Line<'_>) {
    if !write(line) {
        tracing::info!(
            route = line.route,
            outcome = line.outcome,
            status = line.status,
            key = line.key,
            trace_id = line.trace_id,
            latency_us = line.latency_us,
            "request"
        );
    }
}

/// Writes `line` to stderr by hand if [`install`] allowed it; `false` when
/// it must go through `tracing` instead.
pub fn write(line: &Line<'_>) -> bool {
    let Some(&format) = INSTALLED.get() else { return false };
    BUFFER.with(|cell| {
        let Ok(mut guard) = cell.try_borrow_mut() else { return false };
        let (buffer, second, stamp) = &mut *guard;
        buffer.clear();
        render(format, line, SystemTime::now(), (second, stamp), buffer);
        crate::log_sink::write(buffer);
        true
    })
}

/// Renders one line, newline included, exactly as `tracing_subscriber`
/// would. `cache` keeps the last second's `YYYY-MM-DDTHH:MM:SS`.
fn render(format: LineFormat, line: &Line<'_>, now: SystemTime, cache: (&mut u64, &mut [u8; 19]), out: &mut Vec<u8>) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (second, stamp) = cache;
    if *second != since.as_secs() {
        *second = since.as_secs();
        *stamp = civil_time(*second);
    }
    let mut timestamp = [0u8; 27];
    timestamp[..19].copy_from_slice(&stamp[..]);
    timestamp[19] = b'.';
    digits(&mut timestamp[20..26], u64::from(since.subsec_micros()));
    timestamp[26] = b'Z';
    match format {
        LineFormat::Text => {
            out.extend_from_slice(&timestamp);
            out.extend_from_slice(b"  INFO idemgate::gateway: request route=");
            text_string(line.route, out);
            out.extend_from_slice(b" outcome=\"");
            out.extend_from_slice(line.outcome.as_bytes());
            out.extend_from_slice(b"\" status=");
            number(u64::from(line.status), out);
            out.extend_from_slice(b" key=");
            text_string(line.key, out);
            out.extend_from_slice(b" trace_id=");
            text_string(line.trace_id, out);
            out.extend_from_slice(b" latency_us=");
            number(line.latency_us, out);
            out.push(b'\n');
        }
        LineFormat::Json => {
            out.extend_from_slice(b"{\"timestamp\":\"");
            out.extend_from_slice(&timestamp);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\",\"route\":");
            json_string(line.route, out);
            out.extend_from_slice(b",\"outcome\":\"");
            out.extend_from_slice(line.outcome.as_bytes());
            out.extend_from_slice(b"\",\"status\":");
            number(u64::from(line.status), out);
            out.extend_from_slice(b",\"key\":");
            json_string(line.key, out);
            out.extend_from_slice(b",\"trace_id\":");
            json_string(line.trace_id, out);
            out.extend_from_slice(b",\"latency_us\":");
            number(line.latency_us, out);
            out.extend_from_slice(b"},\"target\":\"idemgate::gateway\"}\n");
        }
    }
}

/// Characters every format writes as they are inside quotes.
fn plain(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':' | b' '))
}

/// A string as `Debug` quotes it (tracing's text format).
fn text_string(text: &str, out: &mut Vec<u8>) {
    if plain(text) {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{text:?}");
    }
}

/// A string as serde_json writes it (tracing's JSON format).
fn json_string(text: &str, out: &mut Vec<u8>) {
    if plain(text) {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

fn number(mut n: u64, out: &mut Vec<u8>) {
    let mut reversed = [0u8; 20];
    let mut len = 0;
    loop {
        reversed[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(reversed[..len].iter().rev());
}

/// `n` as zero-padded decimal filling `out`.
fn digits(out: &mut [u8], mut n: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of a Unix second: Howard Hinnant's
/// days-to-civil conversion.
fn civil_time(second: u64) -> [u8; 19] {
    let days = (second / 86_400) as i64;
    let of_day = second % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = *b"0000-00-00T00:00:00";
    digits(&mut out[0..4], year.clamp(0, 9999) as u64);
    digits(&mut out[5..7], month as u64);
    digits(&mut out[8..10], day as u64);
    digits(&mut out[11..13], of_day / 3600);
    digits(&mut out[14..16], of_day / 60 % 60);
    digits(&mut out[17..19], of_day % 60);
    out
}

#[cfg(test)]
mod tests;
