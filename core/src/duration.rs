//! Human durations as operators write them (`12h`, `30m`, `1h30m`, `90s`, `2d`), in config, role
//! options and CLI flags.

use std::fmt;
use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {reason} (write it like 30s, 15m, 8h, 1h30m or 7d)")]
pub struct DurationError {
    pub input: String,
    pub reason: &'static str,
}

/// Parses `1h30m`-style durations. A bare number is refused: units are always explicit.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            let n = num.unwrap_or(0);
            num = Some(
                n.checked_mul(10)
                    .and_then(|n| n.checked_add(u64::from(d)))
                    .ok_or_else(|| err("too large"))?,
            );
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(err("unknown unit")),
        };
        let n = num.take().ok_or_else(|| err("unit without a number"))?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| err("too large"))?;
    }
    if num.is_some() {
        return Err(err("number without a unit"));
    }
    Ok(Duration::from_secs(total))
}

/// Formats whole seconds back as `1h30m` (the inverse of [`parse`] for display).
pub fn format(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, name) in [(86_400, 'd'), (3600, 'h'), (60, 'm'), (1, 's')] {
        if s >= unit {
            out.push_str(&format!("{}{}", s / unit, name));
            s %= unit;
        }
    }
    out
}

/// A duration that (de)serializes as its human form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format(self.0))
    }
}

impl serde::Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(self.0))
    }
}

impl<'de> serde::Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        let cases = [
            ("30s", Some(30)),
            ("15m", Some(900)),
            ("8h", Some(28_800)),
            ("1h30m", Some(5400)),
            ("7d", Some(604_800)),
            ("", None),
            ("10", None),
            ("h", None),
            ("5x", None),
            ("99999999999999999999h", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input).ok().map(|d| d.as_secs()), want, "{input}");
        }
        assert_eq!(format(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format(Duration::from_secs(0)), "0s");
    }
}
