//! How failing `accept`s are logged: at most once per [`INTERVAL`], with
//! the count of the ones left out.
//!
//! A process out of file descriptors fails every `accept` at once; the
//! accept loop backs off 50 ms between tries, and a line per try (20 a
//! second per listener) buries everything else in the log. One line a
//! second still says it is happening, and how often.

use std::time::{Duration, Instant};

/// The shortest time between two lines.
pub(super) const INTERVAL: Duration = Duration::from_secs(1);

/// The failures of one listener's accept loop.
#[derive(Debug, Default)]
pub(super) struct AcceptErrors {
    logged_at: Option<Instant>,
    left_out: u64,
}

impl AcceptErrors {
    /// Notes a failure at `now`: `Some(n)` when it is to be logged, `n`
    /// being the failures left out since the last line.
    pub(super) fn note(&mut self, now: Instant) -> Option<u64> {
        match self.logged_at {
            Some(at) if now.saturating_duration_since(at) < INTERVAL => {
                self.left_out += 1;
                None
            }
            _ => {
                self.logged_at = Some(now);
                Some(std::mem::take(&mut self.left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_with_the_count_of_those_left_out() {
        let start = Instant::now();
        let mut errors = AcceptErrors::default();
        assert_eq!(errors.note(start), Some(0), "the first is logged");
        // Every 50 ms for the rest of the second: left out, counted.
        for tick in 1..20 {
            assert_eq!(errors.note(start + Duration::from_millis(50 * tick)), None);
        }
        assert_eq!(errors.note(start + INTERVAL), Some(19));
        assert_eq!(errors.note(start + INTERVAL + Duration::from_millis(50)), None);
        assert_eq!(errors.note(start + 3 * INTERVAL), Some(1));
    }
}
