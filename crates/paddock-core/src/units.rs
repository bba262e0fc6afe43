//! Human-friendly limits ("512M", "1m30s", "0.5"), parsed strictly.
//!
//! Numbers are plain decimals (`12`, `1.5`, `.5`); signs, exponents, `_`
//! separators, inner whitespace, `NaN` and `inf` are rejected. Surrounding
//! whitespace is ignored. Fractions are scaled exactly, without floats, and
//! rounded down to the base unit (byte, nanosecond, millicpu).

use std::fmt;
use std::time::Duration;

/// What was being parsed; it picks the wording and the example in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    Bytes,
    Duration,
    Cpus,
}

impl Quantity {
    fn syntax(self) -> &'static str {
        match self {
            Self::Bytes => {
                "a number with an optional unit: Ki, Mi, Gi, Ti, Pi (2^10-based) or k, M, G, T, P (10^3-based)"
            }
            Self::Duration => "numbers with units ms, s, m, h, or plain seconds",
            Self::Cpus => "a decimal number of CPUs, or millicpus with an m",
        }
    }

    fn example(self) -> &'static str {
        match self {
            Self::Bytes => "512Mi",
            Self::Duration => "1m30s",
            Self::Cpus => "0.5",
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bytes => "byte size",
            Self::Duration => "duration",
            Self::Cpus => "cpu count",
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("{quantity} is empty: write {}, e.g. {}", .quantity.syntax(), .quantity.example())]
    Empty { quantity: Quantity },
    #[error("{quantity} {input:?} is not valid: write {}, e.g. {}", .quantity.syntax(), .quantity.example())]
    Invalid { quantity: Quantity, input: String },
    #[error("{quantity} {input:?} has unknown unit {unit:?}: write {}, e.g. {}", .quantity.syntax(), .quantity.example())]
    UnknownUnit { quantity: Quantity, input: String, unit: String },
    #[error("{quantity} {input:?} is negative: it must be > 0, e.g. {}", .quantity.example())]
    Negative { quantity: Quantity, input: String },
    #[error("{quantity} {input:?} is zero or rounds down to zero: it must be > 0, e.g. {}", .quantity.example())]
    Zero { quantity: Quantity, input: String },
    #[error("{quantity} {input:?} is too large to represent: pass a smaller value, e.g. {}", .quantity.example())]
    Overflow { quantity: Quantity, input: String },
    #[error(
        "byte size {input:?} is ambiguous: Kubernetes reads a lowercase m as milli, Docker as MiB; \
         write {number}Mi (2^20-based) or {number}M (10^6-based), likewise Gi/G, Ti/T, Pi/P"
    )]
    Ambiguous { input: String, number: String },
    #[error("cpu count {input:?} is outside 0.01..=1024: pass a value in that range, e.g. 0.5")]
    CpusOutOfRange { input: String },
}

/// Parses a byte size as Kubernetes writes quantities, the same in the API and on the command
/// line: `"512Mi"` (2²⁰-based), `"1G"` (10⁹), `"1.5GiB"`, `"100k"`, `"1048576"` (bytes).
///
/// - Binary units, any case, with or without a final `B`: `Ki`, `Mi`, `Gi`, `Ti`, `Pi` are
///   2¹⁰ … 2⁵⁰ (`KiB`, `mib`, `GI` too).
/// - Decimal units: `k` or `K`, `M`, `G`, `T`, `P` are 10³ … 10¹⁵, with or without a final `B`
///   (`MB`, `kB`), as in Kubernetes and SI.
/// - `B` or nothing is bytes.
/// - A lone lowercase `m`, `g`, `t` or `p` (`512m`, `1gb`) is refused with both readings
///   spelled out: Kubernetes reads `m` as milli and Docker as MiB, so either guess would
///   surprise someone by a factor of 2²⁰ or 1.05.
///
/// Exabytes are left out because `1e9`-style input would otherwise parse as 1 EB.
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    const QUANTITY: Quantity = Quantity::Bytes;
    let (number, unit) = split_number(QUANTITY, s)?;
    let stem = unit.strip_suffix(['B', 'b']).filter(|u| !u.is_empty()).unwrap_or(unit);
    let scale: u64 = match stem {
        "" | "B" | "b" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "m" | "g" | "t" | "p" => {
            return Err(UnitError::Ambiguous {
                input: s.to_owned(),
                number: s.trim()[..s.trim().len() - unit.len()].to_owned(),
            });
        }
        binary => match binary.to_ascii_lowercase().as_str() {
            "ki" => 1 << 10,
            "mi" => 1 << 20,
            "gi" => 1 << 30,
            "ti" => 1 << 40,
            "pi" => 1 << 50,
            _ => return Err(unknown_unit(QUANTITY, s, unit)),
        },
    };
    let bytes = number.scale(scale).ok_or_else(|| UnitError::Overflow { quantity: QUANTITY, input: s.to_owned() })?;
    nonzero(QUANTITY, s, bytes)
}

/// Parses a duration such as `"30s"`, `"1m"`, `"1h"`, `"500ms"`, `"1m30s"`
/// or `"90"` (plain seconds, only when it is the whole input).
///
/// Units are `ms`, `s`, `m`, `h`, lowercase only so `M` cannot be misread as
/// months; components may be fractional (`1.5h`) and are summed.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    const QUANTITY: Quantity = Quantity::Duration;
    let overflow = || UnitError::Overflow { quantity: QUANTITY, input: s.to_owned() };
    let (first, rest) = split_number(QUANTITY, s)?;
    if rest.is_empty() {
        let nanos = first.scale(1_000_000_000).ok_or_else(overflow)?;
        return nonzero(QUANTITY, s, nanos).map(Duration::from_nanos);
    }
    let (mut number, mut rest) = (first, rest);
    let mut total: u64 = 0;
    loop {
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let (unit, tail) = rest.split_at(unit_len);
        let nanos_per_unit = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            // A later number without a unit, e.g. "1m30": plain seconds only stand alone.
            "" => return Err(invalid(QUANTITY, s)),
            _ => return Err(unknown_unit(QUANTITY, s, unit)),
        };
        let nanos = number.scale(nanos_per_unit).ok_or_else(overflow)?;
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        if tail.is_empty() {
            return nonzero(QUANTITY, s, total).map(Duration::from_nanos);
        }
        (number, rest) = Decimal::split(tail).ok_or_else(|| invalid(QUANTITY, s))?;
    }
}

/// Parses a CPU count into millicpus: a decimal number of CPUs as `docker --cpus` writes it
/// (`"1"`, `"0.5"`, `"2.25"`) or millicpus as Kubernetes does (`"500m"`). Accepts
/// 0.01..=1024 CPUs; finer precision than a millicpu is rounded down.
pub fn parse_cpus(s: &str) -> Result<u32, UnitError> {
    const QUANTITY: Quantity = Quantity::Cpus;
    // The kernel's smallest CFS quota is 1ms per default 100ms period.
    const MIN_MILLIS: u32 = 10;
    const MAX_MILLIS: u32 = 1024 * 1000;
    let (number, unit) = split_number(QUANTITY, s)?;
    let scale = match unit {
        "" => 1000,
        "m" => 1,
        _ => return Err(invalid(QUANTITY, s)),
    };
    if number.is_zero() {
        return Err(UnitError::Zero { quantity: QUANTITY, input: s.to_owned() });
    }
    match number.scale(scale).and_then(|m| u32::try_from(m).ok()) {
        Some(millis @ MIN_MILLIS..=MAX_MILLIS) => Ok(millis),
        _ => Err(UnitError::CpusOutOfRange { input: s.to_owned() }),
    }
}

const BYTE_UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// Formats bytes with the largest fitting binary unit and up to two
/// decimals (rounded): `268435456` → `"256MiB"`, `1536` → `"1.5KiB"`.
/// The output is accepted by [`parse_bytes`], though rounding may make it
/// differ from `n` by a fraction of the unit.
pub fn format_bytes(n: u64) -> String {
    let mut exp = (BYTE_UNITS.len() - 1).min((n.max(1).ilog2() / 10) as usize);
    let mut hundredths = round_div(u128::from(n) * 100, 1u128 << (10 * exp));
    // Rounding can carry into the next unit, e.g. 1023.999KiB → 1024KiB.
    if hundredths >= 1024 * 100 && exp + 1 < BYTE_UNITS.len() {
        exp += 1;
        hundredths = round_div(u128::from(n) * 100, 1u128 << (10 * exp));
    }
    let (whole, frac) = (hundredths / 100, hundredths % 100);
    let unit = BYTE_UNITS[exp];
    match frac {
        0 => format!("{whole}{unit}"),
        _ if frac % 10 == 0 => format!("{whole}.{}{unit}", frac / 10),
        _ => format!("{whole}.{frac:02}{unit}"),
    }
}

/// Formats a duration as `1h2m3s4ms`, skipping zero components: 90s →
/// `"1m30s"`. Sub-millisecond parts are dropped; zero is `"0s"`. The output
/// is accepted by [`parse_duration`].
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [(secs / 3600, "h"), (secs / 60 % 60, "m"), (secs % 60, "s"), (u64::from(d.subsec_millis()), "ms")];
    let out: String =
        parts.iter().filter(|(value, _)| *value > 0).map(|(value, unit)| format!("{value}{unit}")).collect();
    if out.is_empty() { "0s".to_owned() } else { out }
}

/// A non-negative decimal kept as digit strings so scaling stays exact.
struct Decimal<'a> {
    int: &'a str,
    frac: &'a str,
}

impl<'a> Decimal<'a> {
    /// Splits a leading decimal off `s`; `None` if `s` does not start with one.
    fn split(s: &'a str) -> Option<(Self, &'a str)> {
        let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, rest) = s.split_at(end);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
            return None;
        }
        Some((Self { int, frac }, rest))
    }

    fn is_zero(&self) -> bool {
        self.int.bytes().chain(self.frac.bytes()).all(|b| b == b'0')
    }

    /// `floor(self * scale)`, or `None` if it does not fit in a u64.
    fn scale(&self, scale: u64) -> Option<u64> {
        let int: u64 = if self.int.is_empty() { 0 } else { self.int.parse().ok()? };
        // Folding fraction digits right to left is exact for any digit count,
        // since floor((floor(x) + a) / 10) == floor((x + a) / 10) for integer
        // a, and the accumulator stays below 10 * scale.
        let frac = self.frac.bytes().rev().fold(0, |acc, digit| (acc + u64::from(digit - b'0') * scale) / 10);
        int.checked_mul(scale)?.checked_add(frac)
    }
}

/// Trims `s` and splits it into a leading number and the unit after it.
fn split_number(quantity: Quantity, s: &str) -> Result<(Decimal<'_>, &str), UnitError> {
    let trimmed = s.trim();
    if trimmed.is_empty() {
        return Err(UnitError::Empty { quantity });
    }
    if let Some(rest) = trimmed.strip_prefix('-')
        && rest.starts_with(|c: char| c.is_ascii_digit() || c == '.')
    {
        return Err(UnitError::Negative { quantity, input: s.to_owned() });
    }
    Decimal::split(trimmed).ok_or_else(|| invalid(quantity, s))
}

fn nonzero(quantity: Quantity, input: &str, value: u64) -> Result<u64, UnitError> {
    if value == 0 { Err(UnitError::Zero { quantity, input: input.to_owned() }) } else { Ok(value) }
}

fn invalid(quantity: Quantity, input: &str) -> UnitError {
    UnitError::Invalid { quantity, input: input.to_owned() }
}

fn unknown_unit(quantity: Quantity, input: &str, unit: &str) -> UnitError {
    UnitError::UnknownUnit { quantity, input: input.to_owned(), unit: unit.to_owned() }
}

fn round_div(numerator: u128, denominator: u128) -> u128 {
    (numerator + denominator / 2) / denominator
}

/// Milliseconds since the Unix epoch now (0 on a clock set before it): the one clock every
/// crate stamps records and deadlines with.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, millis)
}

/// `d` in whole milliseconds, saturating: a `Duration` holds up to 2⁶⁴ s, more milliseconds
/// than a `u64` does, and a deadline that far out is "never" either way.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds as the store's signed timestamps count them, saturating at
/// `i64::MAX / 2` so that adding it to a timestamp cannot overflow.
pub fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).map_or(i64::MAX / 2, |ms| ms.min(i64::MAX / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn bytes_accepts_documented_forms() {
        let cases = [
            ("512Mi", 512 * MIB),
            ("512M", 512_000_000),
            ("1G", 1_000_000_000),
            ("1Gi", GIB),
            ("1.5GiB", GIB + GIB / 2),
            ("1048576", MIB),
            ("100k", 100_000),
            ("100K", 100_000),
            ("2Gi", 2 * GIB),
            ("1MB", 1_000_000),
            ("1kB", 1_000),
            ("1mib", MIB),
            ("3KI", 3 * 1024),
            ("1Ti", 1 << 40),
            ("1T", 1_000_000_000_000),
            ("2PiB", 2 << 50),
            ("512B", 512),
            (" 1Gi\n", GIB),
            (".5Ki", 512),
            ("0.1Ki", 102),
            ("1.5", 1),
            ("0000000000000000000000001Ki", 1024),
            ("15.99999999999999999999999999999999Pi", 16 * (1 << 50) - 1),
        ];
        for (input, want) in cases {
            assert_eq!(parse_bytes(input), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn bytes_refuses_a_lowercase_m_naming_both_readings() {
        for input in ["64m", "1g", "2t", "1p", "64mb", "1gb"] {
            let err = parse_bytes(input).unwrap_err();
            assert!(matches!(err, UnitError::Ambiguous { .. }), "{input:?}: {err}");
        }
        let msg = parse_bytes("512m").unwrap_err().to_string();
        assert!(msg.contains("512Mi") && msg.contains("512M ") && msg.contains("milli"), "{msg}");
    }

    #[test]
    fn bytes_accepts_u64_max_exactly() {
        assert_eq!(parse_bytes(&u64::MAX.to_string()), Ok(u64::MAX));
    }

    #[test]
    fn bytes_rejects_empty_and_whitespace() {
        for input in ["", "   ", "\t\n"] {
            assert_eq!(parse_bytes(input), Err(UnitError::Empty { quantity: Quantity::Bytes }), "{input:?}");
        }
    }

    #[test]
    fn bytes_rejects_negative() {
        assert!(matches!(parse_bytes("-1M"), Err(UnitError::Negative { .. })));
    }

    #[test]
    fn bytes_rejects_zero_and_fractions_rounding_to_zero() {
        for input in ["0", "0M", "0.0G", "0.5", "0.9b"] {
            assert!(matches!(parse_bytes(input), Err(UnitError::Zero { .. })), "{input:?}");
        }
    }

    #[test]
    fn bytes_rejects_overflow() {
        for input in ["16384Pi", "18446744073709551616", "99999999999999999999999G"] {
            assert!(matches!(parse_bytes(input), Err(UnitError::Overflow { .. })), "{input:?}");
        }
    }

    #[test]
    fn bytes_rejects_unknown_suffix() {
        assert_eq!(
            parse_bytes("5X"),
            Err(UnitError::UnknownUnit { quantity: Quantity::Bytes, input: "5X".to_owned(), unit: "X".to_owned() })
        );
        for input in ["1e9", "1E", "5 M", "1kk", "1_000", "1Mb5", "1iB"] {
            assert!(matches!(parse_bytes(input), Err(UnitError::UnknownUnit { .. })), "{input:?}");
        }
    }

    #[test]
    fn bytes_rejects_non_numbers() {
        for input in ["NaN", "inf", "-inf", "M", "+1M", ".", "1.5.5M", "abc"] {
            assert!(matches!(parse_bytes(input), Err(UnitError::Invalid { .. })), "{input:?}");
        }
    }

    #[test]
    fn error_messages_name_input_and_show_example() {
        let msg = parse_bytes("5X").unwrap_err().to_string();
        assert!(msg.contains("\"5X\"") && msg.contains("e.g. 512Mi"), "{msg}");
        let msg = parse_bytes("0M").unwrap_err().to_string();
        assert!(msg.contains("must be > 0"), "{msg}");
        let msg = parse_duration("").unwrap_err().to_string();
        assert!(msg.contains("duration is empty") && msg.contains("1m30s"), "{msg}");
        let msg = parse_cpus("2000").unwrap_err().to_string();
        assert!(msg.contains("\"2000\"") && msg.contains("0.01..=1024"), "{msg}");
    }

    #[test]
    fn duration_accepts_documented_forms() {
        let cases = [
            ("30s", Duration::from_secs(30)),
            ("1m", Duration::from_secs(60)),
            ("1h", Duration::from_secs(3600)),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("90", Duration::from_secs(90)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            ("1.5h", Duration::from_secs(5400)),
            ("0.5", Duration::from_millis(500)),
            ("0.5ms", Duration::from_micros(500)),
            (" 10s ", Duration::from_secs(10)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn duration_rejects_empty() {
        for input in ["", "  "] {
            assert_eq!(parse_duration(input), Err(UnitError::Empty { quantity: Quantity::Duration }));
        }
    }

    #[test]
    fn duration_rejects_zero() {
        for input in ["0", "0s", "0m0s", "0.0000000001s"] {
            assert!(matches!(parse_duration(input), Err(UnitError::Zero { .. })), "{input:?}");
        }
    }

    #[test]
    fn duration_rejects_negative() {
        assert!(matches!(parse_duration("-1s"), Err(UnitError::Negative { .. })));
    }

    #[test]
    fn duration_rejects_unknown_unit() {
        for (input, unit) in [("5d", "d"), ("1M", "M"), ("1H", "H"), ("10 s", " s"), ("1m-30s", "m-")] {
            assert_eq!(
                parse_duration(input),
                Err(UnitError::UnknownUnit {
                    quantity: Quantity::Duration,
                    input: input.to_owned(),
                    unit: unit.to_owned(),
                }),
                "{input:?}"
            );
        }
    }

    #[test]
    fn duration_rejects_non_numbers() {
        for input in ["s", "NaN", "inf", "1m30", "1ms.", "1s.5.5s"] {
            assert!(matches!(parse_duration(input), Err(UnitError::Invalid { .. })), "{input:?}");
        }
    }

    #[test]
    fn duration_rejects_overflow() {
        for input in ["99999999999999999999", "10000000h", "5000000h5000000h"] {
            assert!(matches!(parse_duration(input), Err(UnitError::Overflow { .. })), "{input:?}");
        }
    }

    #[test]
    fn cpus_accepts_documented_forms() {
        for (input, want) in [
            ("1", 1000),
            ("0.5", 500),
            ("2.25", 2250),
            ("0.01", 10),
            ("1024", 1_024_000),
            ("0.0125", 12),
            (" 4 ", 4000),
            ("500m", 500),
            ("10m", 10),
            ("2500m", 2500),
        ] {
            assert_eq!(parse_cpus(input), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn cpus_rejects_zero_and_negative() {
        assert!(matches!(parse_cpus("0"), Err(UnitError::Zero { .. })));
        assert!(matches!(parse_cpus("0.000"), Err(UnitError::Zero { .. })));
        assert!(matches!(parse_cpus("-1"), Err(UnitError::Negative { .. })));
        assert!(matches!(parse_cpus("-0.5"), Err(UnitError::Negative { .. })));
    }

    #[test]
    fn cpus_rejects_out_of_range() {
        for input in ["0.009", "0.0001", "1024.001", "2000", "99999999999999999999999", "9m", "1m", "1024001m"] {
            assert_eq!(parse_cpus(input), Err(UnitError::CpusOutOfRange { input: input.to_owned() }), "{input:?}");
        }
    }

    #[test]
    fn cpus_rejects_garbage() {
        assert!(matches!(parse_cpus(""), Err(UnitError::Empty { .. })));
        for input in ["NaN", "inf", "abc", "500M", "500mm", "1.5.5", "1e3", "."] {
            assert!(matches!(parse_cpus(input), Err(UnitError::Invalid { .. })), "{input:?}");
        }
    }

    #[test]
    fn format_bytes_picks_largest_unit() {
        for (n, want) in [
            (0, "0B"),
            (1, "1B"),
            (1023, "1023B"),
            (1024, "1KiB"),
            (1536, "1.5KiB"),
            (1024 + 1024 / 3, "1.33KiB"),
            (268_435_456, "256MiB"),
            (MIB - 1, "1MiB"),
            (GIB + 10 * MIB, "1.01GiB"),
            (u64::MAX, "16384PiB"),
        ] {
            assert_eq!(format_bytes(n), want, "{n}");
        }
    }

    #[test]
    fn format_bytes_output_parses_back() {
        for n in [1, 1536, 268_435_456, 5 * GIB, u64::MAX >> 1] {
            let text = format_bytes(n);
            assert!(parse_bytes(&text).is_ok(), "{text}");
        }
        assert_eq!(parse_bytes(&format_bytes(268_435_456)), Ok(268_435_456));
    }

    #[test]
    fn format_duration_skips_zero_parts() {
        for (d, want) in [
            (Duration::from_secs(90), "1m30s"),
            (Duration::ZERO, "0s"),
            (Duration::from_micros(999), "0s"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_millis(3_600_500), "1h500ms"),
            (Duration::from_secs(100 * 3600 + 5), "100h5s"),
        ] {
            assert_eq!(format_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn format_duration_output_parses_back() {
        for d in [Duration::from_secs(90), Duration::from_millis(3_723_004), Duration::from_millis(1)] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn millis_truncates_to_whole_milliseconds_and_saturates() {
        assert_eq!(millis(Duration::from_micros(1_999)), 1);
        assert_eq!(millis(Duration::from_secs(90)), 90_000);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(millis_i64(Duration::from_secs(90)), 90_000);
        assert_eq!(millis_i64(Duration::MAX), i64::MAX / 2);
        assert_eq!(millis_i64(Duration::from_millis(u64::MAX)), i64::MAX / 2);
        // Half the range is a deadline's: a timestamp plus it does not overflow.
        assert!(1_800_000_000_000_i64.checked_add(millis_i64(Duration::MAX)).is_some());
    }
}
