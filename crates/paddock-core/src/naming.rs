//! Thread ids and the resource names derived from them.
//!
//! A thread id comes from the agent and may contain almost anything, while
//! workspace dirs, cgroups and k8s objects need DNS-1123-label-safe names.
//! [`resource_name`] bridges the two.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// Bounded so a hostile or buggy agent cannot bloat logs, labels and state files.
pub const MAX_THREAD_ID_BYTES: usize = 512;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ThreadIdError {
    #[error("thread id is empty: pass a non-empty id such as the agent's conversation thread id")]
    Empty,
    #[error("thread id is {len} bytes, over the {max}-byte limit: pass a shorter id (e.g. a digest of the original)")]
    TooLong { len: usize, max: usize },
    #[error(
        "thread id has a control character at byte {index}: remove newlines, tabs, NUL and other control characters from the id"
    )]
    ControlChar { index: usize },
}

/// Validated raw thread id (the agent's conversation thread id).
///
/// Any printable UTF-8 is accepted; control characters (Unicode `Cc`: `\0`,
/// `\n`, `\t`, DEL, C1 controls) are rejected because the id ends up in logs
/// and labels where they would forge lines or break parsers. Length is
/// 1..=[`MAX_THREAD_ID_BYTES`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ThreadId(String);

impl ThreadId {
    pub fn new(raw: impl Into<String>) -> Result<Self, ThreadIdError> {
        let raw = raw.into();
        if raw.is_empty() {
            return Err(ThreadIdError::Empty);
        }
        if raw.len() > MAX_THREAD_ID_BYTES {
            return Err(ThreadIdError::TooLong { len: raw.len(), max: MAX_THREAD_ID_BYTES });
        }
        if let Some((index, _)) = raw.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ThreadIdError::ControlChar { index });
        }
        Ok(Self(raw))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ThreadId {
    type Error = ThreadIdError;

    fn try_from(raw: String) -> Result<Self, Self::Error> {
        Self::new(raw)
    }
}

impl From<ThreadId> for String {
    fn from(id: ThreadId) -> Self {
        id.0
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a [`ThreadId`] is turned into a resource name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NamingMode {
    /// Readable prefix plus a 64-bit hash; distinct ids never share a name.
    #[default]
    Hashed,
    /// Bit-exact names of the existing Dawn product, so its volumes can be
    /// reattached. Ids differing only in case or punctuation collide.
    DawnCompat,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown naming mode {input:?}: use \"hashed\" or \"dawn-compat\"")]
pub struct NamingModeError {
    pub input: String,
}

impl FromStr for NamingMode {
    type Err = NamingModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hashed" => Ok(Self::Hashed),
            "dawn-compat" => Ok(Self::DawnCompat),
            _ => Err(NamingModeError { input: s.to_owned() }),
        }
    }
}

/// Name used for on-disk workspace dirs, cgroups and k8s objects.
///
/// Always a DNS-1123 label: `[a-z0-9-]`, starts and ends alphanumeric, at
/// most 63 chars.
pub fn resource_name(id: &ThreadId, mode: NamingMode) -> String {
    match mode {
        NamingMode::Hashed => sanitize_hashed(id.as_str()),
        NamingMode::DawnCompat => sanitize_dawn(id.as_str()),
    }
}

const HASHED_PREFIX_MAX: usize = 40;
const HASHED_HASH_HEX: usize = 16;

/// [`NamingMode::Hashed`]: `<readable-prefix>-<16 hex of sha256(raw)>`, or
/// `x-<hash>` when nothing readable survives. At most 57 chars.
///
/// The hash covers the raw id, so ids that sanitize identically (e.g.
/// `Thread_ABC` and `thread.abc`) still get different names.
pub fn sanitize_hashed(raw: &str) -> String {
    let mut readable = String::new();
    for c in raw.to_lowercase().chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            readable.push(c);
        } else if !readable.is_empty() && !readable.ends_with('-') {
            // Skipping leading dashes and dash runs here is the trim and the collapse.
            readable.push('-');
        }
    }
    // Only ASCII was pushed, so byte truncation is char truncation.
    readable.truncate(HASHED_PREFIX_MAX);
    let readable = readable.trim_end_matches('-');
    let hash = sha256_hex_prefix(raw, HASHED_HASH_HEX);
    if readable.is_empty() { format!("x-{hash}") } else { format!("{readable}-{hash}") }
}

const DAWN_MAX_VERBATIM: usize = 40;
const DAWN_PREFIX: usize = 31;
const DAWN_HASH_HEX: usize = 8;

/// [`NamingMode::DawnCompat`]: reproduces Dawn's JavaScript sanitizer exactly.
///
/// Dawn replaces UTF-16 code units, so a non-BMP char (e.g. an emoji) becomes
/// two dashes; dash runs are not collapsed; ids up to 40 chars get no hash.
pub fn sanitize_dawn(raw: &str) -> String {
    let mut cleaned = String::with_capacity(raw.len());
    for c in raw.to_lowercase().chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
            cleaned.push(c);
        } else {
            cleaned.extend(std::iter::repeat_n('-', c.len_utf16()));
        }
    }
    let cleaned = cleaned.trim_matches('-');
    if cleaned.is_empty() {
        return "x".to_owned();
    }
    // `cleaned` is ASCII now, so byte lengths equal Dawn's UTF-16 lengths.
    if cleaned.len() <= DAWN_MAX_VERBATIM {
        return cleaned.to_owned();
    }
    let prefix = cleaned[..DAWN_PREFIX].trim_matches('-');
    format!("{prefix}-{}", sha256_hex_prefix(raw, DAWN_HASH_HEX))
}

fn sha256_hex_prefix(raw: &str, hex_chars: usize) -> String {
    hex::encode(&Sha256::digest(raw.as_bytes())[..hex_chars / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(s: &str) -> bool {
        let bytes = s.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes.iter().all(|b| alnum(b) || *b == b'-')
            && alnum(&bytes[0])
            && alnum(&bytes[bytes.len() - 1])
    }

    fn is_hex(s: &str) -> bool {
        s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    /// Deterministic pseudo-random ids mixing the cases the sanitizers branch on.
    fn generated_ids() -> Vec<String> {
        let alphabet: Vec<char> = "azQ09--_. /éİßΣ日😀\u{10FFFF}K".chars().collect();
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        let mut ids: Vec<String> = ["___", "---", "-", "😀", "İ", "a"].iter().map(|s| s.to_string()).collect();
        for _ in 0..2000 {
            let len = next() % 90;
            ids.push((0..len).map(|_| alphabet[next() % alphabet.len()]).collect());
        }
        ids
    }

    #[test]
    fn thread_id_rejects_empty() {
        assert_eq!(ThreadId::new(""), Err(ThreadIdError::Empty));
    }

    #[test]
    fn thread_id_rejects_too_long() {
        assert_eq!(ThreadId::new("a".repeat(513)), Err(ThreadIdError::TooLong { len: 513, max: 512 }));
    }

    #[test]
    fn thread_id_accepts_max_len() {
        let raw = "a".repeat(512);
        assert_eq!(ThreadId::new(raw.clone()).unwrap().as_str(), raw);
    }

    #[test]
    fn thread_id_rejects_control_chars() {
        for (raw, index) in [("a\nb", 1), ("a\0b", 1), ("\u{7f}", 0), ("tab\there", 3), ("é\u{85}", 2)] {
            assert_eq!(ThreadId::new(raw), Err(ThreadIdError::ControlChar { index }), "{raw:?}");
        }
    }

    #[test]
    fn thread_id_accepts_unicode() {
        let id = ThreadId::new("日本語 thread 😀 İ").unwrap();
        assert_eq!(id.as_str(), "日本語 thread 😀 İ");
        assert_eq!(id.to_string(), "日本語 thread 😀 İ");
        assert_eq!(String::from(id), "日本語 thread 😀 İ");
    }

    #[test]
    fn thread_id_serde_round_trip() {
        let id = ThreadId::new("conv/42 😀").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"conv/42 😀\"");
        assert_eq!(serde_json::from_str::<ThreadId>(&json).unwrap(), id);
    }

    #[test]
    fn thread_id_serde_rejects_invalid() {
        let err = serde_json::from_str::<ThreadId>("\"a\\nb\"").unwrap_err();
        assert!(err.to_string().contains("control character"), "{err}");
        assert!(serde_json::from_str::<ThreadId>("\"\"").is_err());
    }

    #[test]
    fn naming_mode_parses_and_defaults_to_hashed() {
        assert_eq!("hashed".parse(), Ok(NamingMode::Hashed));
        assert_eq!("dawn-compat".parse(), Ok(NamingMode::DawnCompat));
        assert_eq!(NamingMode::default(), NamingMode::Hashed);
        let err = "Dawn".parse::<NamingMode>().unwrap_err();
        assert!(err.to_string().contains("\"hashed\" or \"dawn-compat\""));
    }

    #[test]
    fn naming_mode_serde_is_kebab_case() {
        assert_eq!(serde_json::to_string(&NamingMode::DawnCompat).unwrap(), "\"dawn-compat\"");
        assert_eq!(serde_json::from_str::<NamingMode>("\"hashed\"").unwrap(), NamingMode::Hashed);
    }

    #[test]
    fn dawn_vectors() {
        let cases = [
            ("t1".to_owned(), "t1".to_owned()),
            ("Thread_ABC".to_owned(), "thread-abc".to_owned()),
            ("thread.abc".to_owned(), "thread-abc".to_owned()),
            ("---".to_owned(), "x".to_owned()),
            (String::new(), "x".to_owned()),
            ("ABC-".to_owned(), "abc".to_owned()),
            ("a".repeat(40), "a".repeat(40)),
            ("a".repeat(41), format!("{}-c0f8bd4d", "a".repeat(31))),
            (
                "550e8400-e29b-41d4-a716-446655440000-extra-long-suffix".to_owned(),
                "550e8400-e29b-41d4-a716-4466554-29dd18dd".to_owned(),
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(sanitize_dawn(&raw), want, "{raw:?}");
        }
    }

    #[test]
    fn dawn_counts_utf16_units_and_keeps_dash_runs() {
        assert_eq!(sanitize_dawn("a😀b"), "a--b");
        assert_eq!(sanitize_dawn("a日b"), "a-b");
        assert_eq!(sanitize_dawn("a__b"), "a--b");
        // JS and Rust both lowercase U+0130 to "i" + U+0307 (combining dot).
        assert_eq!(sanitize_dawn("İx"), "i-x");
    }

    #[test]
    fn hashed_separates_ids_that_sanitize_alike() {
        let upper = sanitize_hashed("Thread_ABC");
        let dotted = sanitize_hashed("thread.abc");
        assert_ne!(upper, dotted);
        for name in [&upper, &dotted] {
            let hash = name.strip_prefix("thread-abc-").unwrap();
            assert_eq!(hash.len(), 16);
            assert!(is_hex(hash), "{name}");
        }
    }

    #[test]
    fn hashed_collapses_and_trims_dashes() {
        let name = sanitize_hashed("__Foo..Bar--baz__");
        assert!(name.starts_with("foo-bar-baz-"), "{name}");
    }

    #[test]
    fn hashed_uses_x_when_nothing_readable_survives() {
        for raw in ["___", "😀", "日本"] {
            let name = sanitize_hashed(raw);
            let hash = name.strip_prefix("x-").unwrap();
            assert_eq!(hash.len(), 16);
            assert!(is_hex(hash));
        }
    }

    #[test]
    fn hashed_long_ids_with_shared_prefix_differ() {
        let shared = "p".repeat(60);
        let a = sanitize_hashed(&format!("{shared}-one"));
        let b = sanitize_hashed(&format!("{shared}-two"));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("{}-", "p".repeat(40))), "{a}");
        assert_eq!(a.len(), 57);
    }

    #[test]
    fn hashed_trims_dash_left_by_truncation() {
        let name = sanitize_hashed(&format!("{}_tail", "a".repeat(39)));
        assert!(name.starts_with(&format!("{}-", "a".repeat(39))), "{name}");
        assert_eq!(name.len(), 39 + 1 + 16);
    }

    #[test]
    fn hashed_is_deterministic() {
        assert_eq!(sanitize_hashed("Thread_ABC"), sanitize_hashed("Thread_ABC"));
    }

    #[test]
    fn every_name_is_a_dns_label() {
        for raw in generated_ids() {
            let hashed = sanitize_hashed(&raw);
            assert!(is_dns_label(&hashed) && hashed.len() <= 57, "{raw:?} -> {hashed:?}");
            let dawn = sanitize_dawn(&raw);
            assert!(is_dns_label(&dawn) && dawn.len() <= 40, "{raw:?} -> {dawn:?}");
        }
    }

    #[test]
    fn resource_name_dispatches_on_mode() {
        let id = ThreadId::new("Thread_ABC").unwrap();
        assert_eq!(resource_name(&id, NamingMode::DawnCompat), "thread-abc");
        assert_eq!(resource_name(&id, NamingMode::Hashed), sanitize_hashed("Thread_ABC"));
    }
}
