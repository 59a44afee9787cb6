//! Durations (`"30s"`) and sizes (`"1MiB"`) as written in config files.
//!
//! One parser serves both: a non-negative integer followed by a unit from a
//! table. Fractions and compound forms (`"1h30m"`) are refused with a clear
//! message rather than guessed at.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const DURATION_UNITS: &[(&str, u64)] = &[("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)];
const SIZE_UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
];

/// Why a duration or a size does not parse; `what` is `"duration"` or
/// `"size"`, `text` the value as written (trimmed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// No unit, or one not in the table.
    #[error("invalid {what} {text:?}: expected a whole number followed by one of {units}")]
    Unit {
        /// `"duration"` or `"size"`.
        what: &'static str,
        /// As written.
        text: String,
        /// The units allowed, `, `-joined.
        units: String,
    },
    /// A unit, but no whole number before it (`1.5s`, `s`).
    #[error("invalid {what} {text:?}: expected a whole number before the unit")]
    Number {
        /// `"duration"` or `"size"`.
        what: &'static str,
        /// As written.
        text: String,
    },
    /// More than a `u64` of the base unit holds.
    #[error("invalid {what} {text:?}: too large")]
    TooLarge {
        /// `"duration"` or `"size"`.
        what: &'static str,
        /// As written.
        text: String,
    },
}

fn parse_with_units(text: &str, units: &[(&str, u64)], what: &'static str) -> Result<u64, UnitError> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let unit = unit.trim();
    let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
    let Some((_, scale)) = units.iter().find(|(name, _)| *name == unit) else {
        return Err(UnitError::Unit { what, text: text.to_owned(), units: names.join(", ") });
    };
    let number: u64 = number.parse().map_err(|_| UnitError::Number { what, text: text.to_owned() })?;
    number.checked_mul(*scale).ok_or_else(|| UnitError::TooLarge { what, text: text.to_owned() })
}

/// A duration written as `"<n><unit>"`, unit one of `ms s m h d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigDuration(pub Duration);

impl std::str::FromStr for ConfigDuration {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        parse_with_units(s, DURATION_UNITS, "duration").map(|ms| Self(Duration::from_millis(ms)))
    }
}

impl std::fmt::Display for ConfigDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX);
        write_largest_unit(f, ms, DURATION_UNITS, "ms")
    }
}

/// Writes `value` in the largest unit that divides it exactly.
fn write_largest_unit(
    f: &mut std::fmt::Formatter<'_>,
    value: u64,
    units: &[(&str, u64)],
    base: &str,
) -> std::fmt::Result {
    let exact = units.iter().rev().find(|(_, scale)| value > 0 && value.is_multiple_of(*scale));
    match exact {
        Some((unit, scale)) => write!(f, "{}{unit}", value / scale),
        None => write!(f, "{value}{base}"),
    }
}

/// A byte size written as `"<n><unit>"`, unit one of `B KiB MiB GiB KB MB GB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        parse_with_units(s, SIZE_UNITS, "size").map(Self)
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Printed in binary units only: the decimal ones are for input.
        write_largest_unit(f, self.0, &SIZE_UNITS[..4], "B")
    }
}

impl ByteSize {
    /// The size as `usize`, saturating on 32-bit targets.
    pub fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

macro_rules! serde_via_str {
    ($ty:ty) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}
serde_via_str!(ConfigDuration);
serde_via_str!(ByteSize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print_back() {
        assert_eq!("30s".parse::<ConfigDuration>().unwrap().0, Duration::from_secs(30));
        assert_eq!("250ms".parse::<ConfigDuration>().unwrap().0, Duration::from_millis(250));
        assert_eq!("24h".parse::<ConfigDuration>().unwrap().to_string(), "1d");
        assert_eq!("90s".parse::<ConfigDuration>().unwrap().to_string(), "90s");
        assert_eq!(ConfigDuration(Duration::ZERO).to_string(), "0ms");
    }

    #[test]
    fn sizes_parse_and_print_back() {
        assert_eq!("1MiB".parse::<ByteSize>().unwrap().0, 1 << 20);
        assert_eq!("10KB".parse::<ByteSize>().unwrap().0, 10_000);
        assert_eq!("512 B".parse::<ByteSize>().unwrap().0, 512);
        assert_eq!(ByteSize(1 << 20).to_string(), "1MiB");
        assert_eq!(ByteSize(1500).to_string(), "1500B");
    }

    #[test]
    fn bad_values_say_what_was_expected() {
        let err = "1.5s".parse::<ConfigDuration>().unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
        assert!("30".parse::<ConfigDuration>().unwrap_err().to_string().contains("ms, s, m, h, d"));
        assert!("1mib".parse::<ByteSize>().is_err());
        assert!("s".parse::<ConfigDuration>().is_err());
        assert!("99999999999999999999d".parse::<ConfigDuration>().is_err());
        assert!("18446744073709551615GiB".parse::<ByteSize>().unwrap_err().to_string().contains("too large"));
    }
}
