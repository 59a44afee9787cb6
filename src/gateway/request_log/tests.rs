use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

use super::*;

/// 2026-12-01T17:18:30.353807Z
fn moment() -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(1_796_145_510_353_807)
}

/// What tracing's formatter writes for the same event at [`moment`].
struct Fixed;

impl FormatTime for Fixed {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        w.write_str("2026-12-01T17:18:30.353807Z")
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn through_tracing(format: LineFormat, line: &Line<'_>) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let builder = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).with_timer(Fixed);
    let emit = || {
        tracing::info!(
            target: "idemgate::gateway",
            route = line.route,
            outcome = line.outcome,
            status = line.status,
            key = line.key,
            trace_id = line.trace_id,
            latency_us = line.latency_us,
            "request"
        )
    };
    match format {
        LineFormat::Text => tracing::subscriber::with_default(builder.finish(), emit),
        LineFormat::Json => tracing::subscriber::with_default(builder.json().finish(), emit),
    }
    String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
}

fn by_hand(format: LineFormat, line: &Line<'_>) -> String {
    let mut out = Vec::new();
    render(format, line, moment(), (&mut u64::MAX.clone(), &mut [0; 19]), &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn the_hand_written_line_is_the_line_tracing_writes() {
    let lines = [
        Line {
            route: "bench",
            outcome: "replayed",
            status: 201,
            key: "d61cf7016156510e",
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
            latency_us: 123_614,
        },
        Line { route: "-", outcome: "no-route", status: 404, key: "-", trace_id: "-", latency_us: 0 },
        Line {
            route: "pay/v1 a.b:c_d",
            outcome: "passthrough",
            status: 200,
            key: "-",
            trace_id: "-",
            latency_us: u64::MAX,
        },
        Line {
            route: "be\"n\\ch ü\t\u{7}",
            outcome: "conflict",
            status: 409,
            key: "0a5c",
            trace_id: "-",
            latency_us: 7,
        },
    ];
    for format in [LineFormat::Text, LineFormat::Json] {
        for line in &lines {
            assert_eq!(by_hand(format, line), through_tracing(format, line), "{format:?} {line:?}");
        }
    }
}

#[test]
fn timestamps_are_utc_calendar_time() {
    let civil = |second| String::from_utf8(civil_time(second).to_vec()).unwrap();
    assert_eq!(civil(0), "1970-01-01T00:00:00");
    assert_eq!(civil(951_782_400), "2000-02-29T00:00:00");
    assert_eq!(civil(1_798_761_599), "2026-12-31T23:59:59");
    assert_eq!(civil(4_102_444_799), "2099-12-31T23:59:59");
    assert_eq!(civil(1_764_609_545), "2025-12-01T17:19:05");
}

#[test]
fn the_cached_second_is_renewed_when_the_second_changes() {
    let line = Line { route: "r", outcome: "replayed", status: 201, key: "-", trace_id: "-", latency_us: 1 };
    let (mut second, mut stamp) = (u64::MAX, [0u8; 19]);
    let mut out = Vec::new();
    render(LineFormat::Text, &line, moment(), (&mut second, &mut stamp), &mut out);
    out.clear();
    render(LineFormat::Text, &line, moment() + Duration::from_secs(61), (&mut second, &mut stamp), &mut out);
    assert!(out.starts_with(b"2026-12-01T17:19:31.353807Z  INFO"), "{}", String::from_utf8_lossy(&out));
}
