//! W3C Trace Context (`traceparent`, `tracestate`): reading a trace id,
//! and the child context a new hop sends.
//!
//! The gateway forwards both headers unchanged and only reads the trace id
//! for its request log ([`trace_id`]). The outbox relay is a hop of its
//! own: a row carries the context it was enqueued under, and every publish
//! attempt is a new span of that trace ([`TraceContext::child`]).
//!
//! Validity is the Recommendation's: `version-traceid-parentid-flags` in
//! lower-case hex, version `ff` invalid, version `00` exactly 55 bytes
//! (later versions may append `-…`), trace and parent ids not all zeros.
//! An invalid `traceparent` is ignored, never repaired, and a `tracestate`
//! goes only with a valid `traceparent`. The SQL side
//! (`idemgate.trace_context`, migration 7) applies the same rules at
//! enqueue.

/// The most bytes of `tracestate` kept: the Recommendation's 512, beyond
/// which a vendor may drop it.
pub const MAX_TRACESTATE: usize = 512;

/// The trace id of a valid `traceparent`, as its 32 hex digits.
pub fn trace_id(traceparent: &[u8]) -> Option<&str> {
    let hex = |b: &[u8]| b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |b: &[u8]| b.iter().any(|&c| c != b'0');
    // Later versions may append fields after the flags; version 00 may not.
    let fits = traceparent.len() == 55
        || (traceparent.len() > 55 && traceparent[55] == b'-' && traceparent[56..].iter().all(u8::is_ascii_graphic));
    let (version, id, parent, flags) =
        (traceparent.get(..2)?, traceparent.get(3..35)?, traceparent.get(36..52)?, traceparent.get(53..55)?);
    let dashes = [2, 35, 52].iter().all(|&i| traceparent[i] == b'-');
    let valid = fits
        && dashes
        && hex(version)
        && version != b"ff"
        && (version != b"00" || traceparent.len() == 55)
        && hex(id)
        && nonzero(id)
        && hex(parent)
        && nonzero(parent)
        && hex(flags);
    valid.then(|| std::str::from_utf8(id).ok()).flatten()
}

/// Whether `tracestate` may be sent as it is: printable ASCII (no control
/// character could end the header), at most [`MAX_TRACESTATE`] bytes.
pub fn sendable_tracestate(tracestate: &str) -> bool {
    tracestate.len() <= MAX_TRACESTATE && tracestate.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// A valid trace context: the trace, the flags, and the state to pass on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: String,
    flags: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// The context of `traceparent` and `tracestate`; `None` when the
    /// `traceparent` is absent or invalid. A `tracestate` that could not be
    /// sent as it is ([`sendable_tracestate`]) is dropped.
    pub fn parse(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = traceparent?;
        let trace_id = trace_id(traceparent.as_bytes())?.to_string();
        Some(Self {
            trace_id,
            flags: traceparent[53..55].to_string(),
            tracestate: tracestate.filter(|s| !s.is_empty() && sendable_tracestate(s)).map(str::to_string),
        })
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The `tracestate` to pass on, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// A `traceparent` for a new span of this trace: version `00`, the same
    /// trace id and flags, a fresh random non-zero span id.
    pub fn child(&self) -> String {
        let span = rand::random::<u64>().max(1);
        format!("00-{}-{span:016x}-{}", self.trace_id, self.flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_trace_id_is_read_only_from_a_valid_traceparent() {
        assert_eq!(trace_id(VALID.as_bytes()), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        let later = format!("01{}-what-comes-next", &VALID[2..]);
        assert_eq!(trace_id(later.as_bytes()), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-a\r\nx: y",
        ] {
            assert_eq!(trace_id(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_with_a_new_span_each_time() {
        let context = TraceContext::parse(Some(VALID), Some("congo=t61rcWkgMzE")).unwrap();
        let (a, b) = (context.child(), context.child());
        assert_ne!(a, b);
        for child in [&a, &b] {
            assert_eq!(trace_id(child.as_bytes()), Some(context.trace_id()), "{child}");
            assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && child.ends_with("-01"), "{child}");
            assert_ne!(&child[36..52], "00f067aa0ba902b7");
        }
        assert_eq!(context.tracestate(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn an_invalid_traceparent_means_no_context_and_an_unsendable_tracestate_is_dropped() {
        assert_eq!(TraceContext::parse(None, Some("a=b")), None);
        assert_eq!(TraceContext::parse(Some("00-zz"), Some("a=b")), None);
        for unsendable in
            ["a=b\r\nx-injected: 1".to_string(), "a=".to_string() + &"x".repeat(MAX_TRACESTATE), "".into()]
        {
            let context = TraceContext::parse(Some(VALID), Some(&unsendable)).unwrap();
            assert_eq!(context.tracestate(), None, "{unsendable:?}");
        }
    }
}
