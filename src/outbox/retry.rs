//! What one delivery attempt came to, and what happens to its row next. Pure.
//!
//! Two types, one per stage of an attempt:
//!
//! - [`Delivery`] — what a publisher reports: delivered, worth a retry,
//!   or rejected for good (with the destination's reason and `Retry-After`);
//! - [`Next`] — what [`RetryPolicy::decide`] makes of it for the row:
//!   record the delivery, try again after a backoff, or bury the row.
//!
//! (How the attempt then ended, once the database has it, is the relay's
//! `Fate`; a step's tally of those is its [`Outcome`](super::relay::Outcome).)
//!
//! An HTTP status decides as follows (DESIGN.md, "Destinations";
//! [`classify_status`]):
//!
//! | result                                   | delivery                   |
//! |------------------------------------------|----------------------------|
//! | `2xx`                                    | [`Delivery::Delivered`]    |
//! | `409`, `429`, `5xx`, timeout, reset, refused | [`Delivery::Retry`]    |
//! | `422` and every other `4xx`; `1xx`, `3xx` | [`Delivery::Reject`] (dead at once) |
//!
//! A `3xx` is a rejection, not a retry: the relay does not follow redirects
//! (the `Idempotency-Key` must reach the destination the operator named),
//! so a redirect means a misconfigured URL that only a person can fix.
//!
//! Backoff is exponential with *full jitter*: after the `n`-th attempt the
//! delay is uniform in `[0, min(backoff_max, backoff_base · 2^(n-1))]`, so
//! relays that failed together do not retry together. A `Retry-After`
//! (delta-seconds, or an HTTP-date read against the response's own `Date`
//! header, so no local clock is involved) is a floor on the delay; both are
//! capped at `backoff_max`, which keeps every wait bounded by config. So
//! the longest wait between two attempts is `backoff_max`, not the
//! backoff's own cap: [`RetryPolicy::worst_case_window`] counts it so.

use std::time::Duration;

use crate::config::DestinationConfig;

/// A destination's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first backoff.
    pub base: Duration,
    /// Cap on any one backoff and on an honoured `Retry-After`.
    pub max: Duration,
    /// Attempts (counted since the last redrive) before a row is dead.
    pub max_attempts: u32,
}

/// What one delivery attempt came to, as its publisher reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The destination confirmed the message.
    Delivered,
    /// Transient: a later attempt may succeed.
    Retry {
        /// The destination's `Retry-After`, if any: a floor on the backoff.
        retry_after: Option<Duration>,
        /// For `last_error` and logs.
        reason: String,
    },
    /// Permanent: no retry can help; the row is dead at once.
    Reject {
        /// For `last_error` and logs.
        reason: String,
    },
}

impl Delivery {
    /// A transient failure without a `Retry-After`.
    pub fn retry(reason: impl Into<String>) -> Self {
        Self::Retry { retry_after: None, reason: reason.into() }
    }

    /// A permanent failure.
    pub fn reject(reason: impl Into<String>) -> Self {
        Self::Reject { reason: reason.into() }
    }

    /// Why it failed; `None` for a delivery.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Delivered => None,
            Self::Retry { reason, .. } | Self::Reject { reason } => Some(reason),
        }
    }

    /// The same result with its reason rewritten by `rewrite` (a delivery has none).
    pub fn map_reason(self, rewrite: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::Delivered => Self::Delivered,
            Self::Retry { retry_after, reason } => Self::Retry { retry_after, reason: rewrite(reason) },
            Self::Reject { reason } => Self::Reject { reason: rewrite(reason) },
        }
    }
}

/// Whether a destination's HTTP status means it took the message: any 2xx.
pub fn is_delivered(status: u16) -> bool {
    (200..=299).contains(&status)
}

/// What an HTTP response with `status` came to: `retry_after` and
/// `reason` count only for a failure.
pub fn classify_status(status: u16, retry_after: Option<Duration>, reason: String) -> Delivery {
    match status {
        _ if is_delivered(status) => Delivery::Delivered,
        409 | 429 | 500..=599 => Delivery::Retry { retry_after, reason },
        _ => Delivery::Reject { reason },
    }
}

/// What happens to a row after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Record its delivery: it leaves the outbox.
    Complete,
    /// Make it claimable again after this long (by the database clock).
    RetryIn(Duration),
    /// Give up: mark it dead.
    Dead,
}

impl From<&DestinationConfig> for RetryPolicy {
    fn from(d: &DestinationConfig) -> Self {
        Self { base: d.backoff_base.0, max: d.backoff_max.0, max_attempts: d.max_attempts }
    }
}

impl RetryPolicy {
    /// The upper bound of the backoff after the `attempt`-th attempt (1-based).
    pub fn cap(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let base_ms = u64::try_from(self.base.as_millis()).unwrap_or(u64::MAX);
        let max_ms = u64::try_from(self.max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(base_ms.saturating_mul(factor).min(max_ms))
    }

    /// The delay after the `attempt`-th attempt failed. `unit` is a random
    /// draw in `[0, 1)`, passed in so the function stays pure.
    pub fn backoff(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.0 };
        let jittered = self.cap(attempt).mul_f64(unit);
        match retry_after {
            Some(floor) => jittered.max(floor.min(self.max)),
            None => jittered,
        }
    }

    /// Decides what an attempt means for its row: `attempt` is the number
    /// of attempts made since the last redrive, including this one; `unit`
    /// is the backoff's random draw (see [`Self::backoff`]).
    pub fn decide(&self, delivery: &Delivery, attempt: u32, unit: f64) -> Next {
        match delivery {
            Delivery::Delivered => Next::Complete,
            Delivery::Retry { retry_after, .. } if attempt < self.max_attempts => {
                Next::RetryIn(self.backoff(attempt, *retry_after, unit))
            }
            Delivery::Retry { .. } | Delivery::Reject { .. } => Next::Dead,
        }
    }

    /// The longest time from the start of a row's first attempt to the end
    /// of its last, when nothing goes right: each of the `max_attempts`
    /// attempts runs for its whole `timeout`, and each wait between two of
    /// them lasts `max` — the cap of a backoff *and* of an honoured
    /// `Retry-After`, which a destination may send on every failure — plus
    /// `pickup`, the time a relay may take to notice a due row (its poll
    /// interval: a scheduled retry sends no notification). This is the time
    /// a destination must remember the key for; relay crashes, which add a
    /// lease each, are not counted.
    pub fn worst_case_window(&self, timeout: Duration, pickup: Duration) -> Duration {
        let waits = self.max_attempts.saturating_sub(1);
        let attempts = timeout.saturating_mul(self.max_attempts);
        attempts.saturating_add(self.max.saturating_add(pickup).saturating_mul(waits))
    }
}

/// Reads a `Retry-After` value: delta-seconds, or an HTTP-date measured
/// from the response's `Date` header (without one, a date is ignored).
pub fn parse_retry_after(value: &str, date: Option<&str>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now = httpdate::parse_http_date(date?.trim()).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: RetryPolicy =
        RetryPolicy { base: Duration::from_secs(1), max: Duration::from_secs(60), max_attempts: 5 };

    #[test]
    fn statuses_fall_into_the_designed_classes() {
        let classify = |status| classify_status(status, None, format!("HTTP {status}"));
        for status in [200, 201, 202, 204, 299] {
            assert_eq!(classify(status), Delivery::Delivered, "{status}");
        }
        for status in [409, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify(status), Delivery::retry(format!("HTTP {status}")), "{status}");
        }
        for status in [400, 401, 403, 404, 410, 422, 301, 302, 100] {
            assert_eq!(classify(status), Delivery::reject(format!("HTTP {status}")), "{status}");
        }
        let later = Some(Duration::from_secs(7));
        assert_eq!(
            classify_status(503, later, "busy".into()),
            Delivery::Retry { retry_after: later, reason: "busy".into() }
        );
    }

    #[test]
    fn the_cap_doubles_until_backoff_max() {
        let caps: Vec<u64> = (1..=8).map(|a| POLICY.cap(a).as_secs()).collect();
        assert_eq!(caps, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(POLICY.cap(u32::MAX), POLICY.max);
    }

    #[test]
    fn retries_stop_at_max_attempts_and_rejections_at_once() {
        let (retry, reject) = (Delivery::retry("503"), Delivery::reject("422"));
        assert_eq!(POLICY.decide(&retry, 4, 0.0), Next::RetryIn(Duration::ZERO));
        assert_eq!(POLICY.decide(&retry, 5, 0.0), Next::Dead);
        assert_eq!(POLICY.decide(&reject, 1, 0.0), Next::Dead);
        assert_eq!(POLICY.decide(&Delivery::Delivered, 5, 0.0), Next::Complete);
    }

    #[test]
    fn a_retry_after_reaches_the_backoff_through_the_decision() {
        let slow_down = Delivery::Retry { retry_after: Some(Duration::from_secs(7)), reason: "429".into() };
        assert_eq!(POLICY.decide(&slow_down, 1, 0.5), Next::RetryIn(Duration::from_secs(7)));
    }

    #[test]
    fn retry_after_is_a_floor_capped_at_backoff_max() {
        assert_eq!(POLICY.backoff(1, Some(Duration::from_secs(7)), 0.5), Duration::from_secs(7));
        assert_eq!(POLICY.backoff(1, Some(Duration::from_secs(3600)), 0.5), POLICY.max);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_against_the_response_date() {
        assert_eq!(parse_retry_after(" 120 ", None), Some(Duration::from_secs(120)));
        let date = Some("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", date), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", date), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", None), None, "no local clock");
        assert_eq!(parse_retry_after("soon", date), None);
    }

    #[test]
    fn the_worst_case_window_counts_every_timeout_and_every_wait_at_the_retry_after_cap() {
        // Five attempts of 2 s, four waits of 60 s (a Retry-After at the cap) plus 1 s to be noticed.
        let window = POLICY.worst_case_window(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(window, Duration::from_secs(5 * 2 + 4 * (60 + 1)));
        let one = RetryPolicy { max_attempts: 1, ..POLICY };
        assert_eq!(one.worst_case_window(Duration::from_secs(2), Duration::from_secs(1)), Duration::from_secs(2));
    }

    #[test]
    fn the_worst_case_window_of_an_absurd_policy_saturates_instead_of_overflowing() {
        let absurd = RetryPolicy { base: Duration::MAX, max: Duration::MAX, max_attempts: u32::MAX };
        assert_eq!(absurd.worst_case_window(Duration::MAX, Duration::MAX), Duration::MAX);
    }

    proptest! {
        #[test]
        fn a_backoff_never_exceeds_its_cap_or_backoff_max(
            attempt in 0u32..200, unit in 0.0f64..1.0, retry_after in proptest::option::of(0u64..100_000),
        ) {
            let retry_after = retry_after.map(Duration::from_millis);
            let delay = POLICY.backoff(attempt, retry_after, unit);
            prop_assert!(delay <= POLICY.max);
            match retry_after {
                Some(floor) => prop_assert!(delay >= floor.min(POLICY.max)),
                None => prop_assert!(delay <= POLICY.cap(attempt)),
            }
        }

        #[test]
        fn caps_never_shrink_as_attempts_grow(attempt in 0u32..500) {
            prop_assert!(POLICY.cap(attempt) <= POLICY.cap(attempt + 1));
        }

        #[test]
        fn odd_draws_do_not_panic(unit in any::<f64>(), attempt in any::<u32>()) {
            prop_assert!(POLICY.backoff(attempt, None, unit) <= POLICY.max);
        }
    }
}
