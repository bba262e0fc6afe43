//! The pure parts of the execd API: query strings, output line splitting, stream events, byte
//! ranges, octal modes, name globs and the bounded command log.

use std::collections::VecDeque;

use bytes::Bytes;
use serde::Serialize;

/// `a=1&b=2&b=3` as ordered pairs; execd reads repeated keys (`path=a&path=b`) as lists.
pub fn parse_query(raw: Option<&str>) -> Vec<(String, String)> {
    raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// The first non-empty value of `key`.
pub fn query_one<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, v)| k == key && !v.is_empty()).map(|(_, v)| v.as_str())
}

/// Every non-empty value of `key`, in order.
pub fn query_all<'a>(q: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    q.iter().filter(|(k, v)| k == key && !v.is_empty()).map(|(_, v)| v.as_str()).collect()
}

/// A line longer than this is cut, so a program that never ends a line cannot grow the buffer
/// without bound.
const MAX_LINE: usize = 1 << 20;

/// Splits streamed output into lines the way execd reports them: `\n` and `\r` both end a line,
/// terminators are dropped, empty lines are dropped, and an unterminated tail waits for more
/// bytes (or for [`LineSplitter::finish`]).
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, mut data: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(i) = data.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.pending.extend_from_slice(&data[..i]);
            self.take_line(&mut lines);
            data = &data[i + 1..];
        }
        self.pending.extend_from_slice(data);
        while self.pending.len() >= MAX_LINE {
            let cut = utf8_boundary(&self.pending, MAX_LINE);
            let rest = self.pending.split_off(cut);
            self.take_line(&mut lines);
            self.pending = rest;
        }
        lines
    }

    /// The unterminated tail, once the stream ended.
    pub fn finish(&mut self) -> Option<String> {
        let mut lines = Vec::new();
        self.take_line(&mut lines);
        lines.pop()
    }

    fn take_line(&mut self, lines: &mut Vec<String>) {
        if !self.pending.is_empty() {
            lines.push(String::from_utf8_lossy(&self.pending).into_owned());
            self.pending.clear();
        }
    }
}

/// The largest cut at or before `at` that does not split a UTF-8 sequence (for valid text).
fn utf8_boundary(b: &[u8], at: usize) -> usize {
    let mut cut = at.min(b.len());
    // Continuation bytes are 0b10xxxxxx; a character is at most four bytes long.
    for _ in 0..3 {
        if cut > 0 && cut < b.len() && b[cut] & 0xC0 == 0x80 {
            cut -= 1;
        }
    }
    if cut == 0 { at.min(b.len()) } else { cut }
}

/// The `error` object of an event.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EventError {
    pub ename: String,
    pub evalue: String,
    pub traceback: Vec<String>,
}

/// One event of a command stream, as SDK 1.1.1's `EventNode` parses it (`timestamp` is required
/// there: events without it are dropped silently).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_time: Option<u64>,
    pub timestamp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<EventError>,
}

impl Event {
    fn new(kind: &'static str, timestamp: i64) -> Self {
        Self { kind, text: None, execution_time: None, timestamp, error: None }
    }
    pub fn text(kind: &'static str, text: String, timestamp: i64) -> Self {
        Self { text: Some(text), ..Self::new(kind, timestamp) }
    }
    pub fn init(id: &str, timestamp: i64) -> Self {
        Self::text("init", id.to_owned(), timestamp)
    }
    pub fn ping(timestamp: i64) -> Self {
        Self::text("ping", "pong".to_owned(), timestamp)
    }
    pub fn complete(execution_ms: u64, timestamp: i64) -> Self {
        Self { execution_time: Some(execution_ms), ..Self::new("execution_complete", timestamp) }
    }
    /// A failed command; the SDK reads `evalue` as the exit code.
    pub fn exec_error(evalue: String, timestamp: i64) -> Self {
        let error = EventError { ename: "CommandExecError".into(), evalue, traceback: Vec::new() };
        Self { error: Some(error), ..Self::new("error", timestamp) }
    }

    /// Standard SSE framing (`data: {json}\n\n`), which the SDK prefers over execd's bare JSON.
    /// JSON never contains a raw newline, so one `data:` line always suffices.
    pub fn frame(&self) -> Bytes {
        let mut out = b"data: ".to_vec();
        // Serializing a struct of strings and integers cannot fail.
        out.extend(serde_json::to_vec(self).unwrap_or_default());
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

/// A satisfiable byte range: `start` and `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub len: u64,
}

/// Why a `Range` header cannot be served (416).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRange;

/// The first range of a `Range: bytes=…` header against a file of `size` bytes, as execd does:
/// `a-b`, `a-` and `-n` (suffix); ranges past the end are skipped; a malformed header or no
/// satisfiable range is a [`BadRange`].
///
/// Written here rather than on `http-range-header` (what tower-http's file service uses): its
/// `validate` refuses a whole header when one range is past the end (`bytes=20-30,2-3` of a
/// 10-byte file), and its parser refuses whitespace execd accepts (`bytes= 0-4`, a trailing
/// space), where execd serves the first range it can. Matching execd is the point; the OpenSandbox SDK's downloads depend on it.
pub fn parse_range(header: &str, size: u64) -> Result<ByteRange, BadRange> {
    let spec = header.trim().strip_prefix("bytes=").ok_or(BadRange)?;
    let mut first = None;
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').ok_or(BadRange)?;
        let (a, b) = (a.trim(), b.trim());
        let num = |s: &str| {
            if s.bytes().all(|c| c.is_ascii_digit()) { s.parse::<u64>().map_err(|_| BadRange) } else { Err(BadRange) }
        };
        let r = if a.is_empty() {
            let n = num(b)?.min(size);
            ByteRange { start: size - n, len: n }
        } else {
            let start = num(a)?;
            let end = if b.is_empty() { size.saturating_sub(1) } else { num(b)? };
            if end < start && !b.is_empty() {
                return Err(BadRange);
            }
            ByteRange { start, len: end.min(size.saturating_sub(1)).saturating_sub(start) + 1 }
        };
        if r.start >= size || r.len == 0 {
            continue;
        }
        first.get_or_insert(r);
    }
    first.ok_or(BadRange)
}

/// An execd mode (`755` means `0o755`: octal digits written as a decimal integer) → the bits.
/// `0` means "leave the mode alone", as in execd.
pub fn parse_mode(mode: i64) -> Result<Option<u32>, String> {
    if mode == 0 {
        return Ok(None);
    }
    let digits = mode.to_string();
    match u32::from_str_radix(&digits, 8) {
        Ok(bits) if mode > 0 && bits <= 0o7777 => Ok(Some(bits)),
        _ => Err(format!("mode {mode} is not a permission mode: write it with octal digits, such as 644 or 755")),
    }
}

/// Mode bits → execd's integer with octal digits (`0o755` → `755`).
pub fn format_mode(bits: u32) -> u32 {
    format!("{:o}", bits & 0o7777).parse().unwrap_or(0)
}

/// An execd search pattern, matched against a file's name only (as execd does), so leading
/// `**/` segments match any directory and `**` is `*`. Supports what globset does: `*`, `?`,
/// `[abc]`, `[a-z]`, `[!a]`/`[^a]`, `{a,b}` and `\` escapes. A pattern globset cannot read (an
/// unclosed `[` or `{`) matches itself literally, as a shell's glob does.
pub enum NameGlob {
    Glob(globset::GlobMatcher),
    Literal(String),
}

impl NameGlob {
    pub fn new(pattern: &str) -> Self {
        let mut p = pattern;
        while let Some(rest) = p.strip_prefix("**/") {
            p = rest;
        }
        let glob =
            globset::GlobBuilder::new(p).literal_separator(false).backslash_escape(true).empty_alternates(true).build();
        match glob {
            Ok(g) => Self::Glob(g.compile_matcher()),
            Err(_) => Self::Literal(p.to_owned()),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Glob(g) => g.is_match(name),
            Self::Literal(l) => l == name,
        }
    }
}

/// The `KEY=VALUE` entries of an env file as `commands.set_env` writes them: `KEY='value'`
/// (literal, may span lines), `KEY="value"` (with `\\ \" \n \r \t \$` escapes) or
/// `KEY=value` (to the end of the line, trimmed), optionally after `export `. Later entries win.
/// Blank lines, `#` comments and anything malformed (no `=`, an invalid name, an unclosed
/// quote, a NUL) are skipped: the file is written by code in the sandbox and must never stop
/// a command from starting.
pub fn parse_env_file(text: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let line_end = rest.find('\n').unwrap_or(rest.len());
        let line = rest[..line_end].trim_start();
        let after_line = rest.get(line_end + 1..).unwrap_or("");
        let Some((key, value_start)) = line.split_once('=') else {
            rest = after_line;
            continue;
        };
        let key = key.trim();
        let key = key.strip_prefix("export ").map_or(key, str::trim_start);
        let valid_key = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if line.starts_with('#') || !valid_key {
            rest = after_line;
            continue;
        }
        // Offset of the value in `rest`, so a quoted value may run past this line.
        let offset = value_start.as_ptr() as usize - rest.as_ptr() as usize;
        let value_text = &rest[offset..];
        let (value, consumed) = match value_text.chars().next() {
            Some('\'') => match value_text[1..].find('\'') {
                Some(end) => (Some(value_text[1..1 + end].to_owned()), 1 + end + 1),
                None => (None, value_start.len()),
            },
            Some('"') => {
                let mut v = String::new();
                let mut chars = value_text[1..].char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '"' => {
                            end = Some(1 + i + 1);
                            break;
                        }
                        '\\' => match chars.next().map(|(_, e)| e) {
                            Some('n') => v.push('\n'),
                            Some('r') => v.push('\r'),
                            Some('t') => v.push('\t'),
                            Some(other) => v.push(other),
                            None => break,
                        },
                        c => v.push(c),
                    }
                }
                match end {
                    Some(end) => (Some(v), end),
                    None => (None, value_start.len()),
                }
            }
            _ => (Some(value_start.trim().to_owned()), value_start.len()),
        };
        if let Some(v) = value.filter(|v| !v.contains('\0')) {
            out.insert(key.to_owned(), v);
        }
        // Whatever follows a closing quote on its line is ignored.
        let consumed_to = offset + consumed;
        rest = match rest[consumed_to.min(rest.len())..].find('\n') {
            Some(nl) => &rest[consumed_to + nl + 1..],
            None => "",
        };
    }
    out
}

/// The combined output of a background command: the newest `cap` bytes, addressed by absolute
/// offsets so a reader's cursor stays valid while old bytes are dropped.
#[derive(Debug)]
pub struct TailLog {
    buf: VecDeque<u8>,
    dropped: u64,
    cap: usize,
}

impl TailLog {
    pub fn new(cap: usize) -> Self {
        Self { buf: VecDeque::new(), dropped: 0, cap }
    }
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend(data);
        let excess = self.buf.len().saturating_sub(self.cap);
        if excess > 0 {
            self.buf.drain(..excess);
            self.dropped += excess as u64;
        }
    }
    /// Bytes written so far, dropped ones included: the next cursor.
    pub fn end(&self) -> u64 {
        self.dropped + self.buf.len() as u64
    }
    /// What was written from `cursor` on (from the oldest kept byte if that was dropped).
    pub fn read_from(&self, cursor: u64) -> Vec<u8> {
        let skip =
            usize::try_from(cursor.saturating_sub(self.dropped)).map_or(self.buf.len(), |s| s.min(self.buf.len()));
        self.buf.iter().skip(skip).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_keep_repeated_keys() {
        let q = parse_query(Some("path=%2Fa%20b&path=c&depth=2&path=&x"));
        assert_eq!(query_all(&q, "path"), ["/a b", "c"]);
        assert_eq!(query_one(&q, "depth"), Some("2"));
        assert_eq!(query_one(&q, "x"), None);
        assert_eq!(query_one(&q, "nope"), None);
        assert!(parse_query(None).is_empty());
        assert_eq!(query_one(&parse_query(Some("pattern=*.py+x")), "pattern"), Some("*.py x"));
    }

    #[test]
    fn lines_split_on_newline_and_carriage_return() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"hel"), Vec::<String>::new());
        assert_eq!(s.push(b"lo\nworld\r\n\n\nprog 1\rprog 2\rtail"), ["hello", "world", "prog 1", "prog 2"]);
        assert_eq!(s.finish().as_deref(), Some("tail"));
        assert_eq!(s.finish(), None);
        assert_eq!(s.push(b"\r\n"), Vec::<String>::new());
    }

    #[test]
    fn split_utf8_sequences_are_rejoined() {
        let mut s = LineSplitter::default();
        let text = "héllo\n".as_bytes();
        assert!(s.push(&text[..2]).is_empty());
        assert_eq!(s.push(&text[2..]), ["héllo"]);
    }

    #[test]
    fn endless_lines_are_cut() {
        let mut s = LineSplitter::default();
        let lines = s.push(&vec![b'a'; MAX_LINE + 10]);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), MAX_LINE);
        assert_eq!(s.finish().map(|t| t.len()), Some(10));
        // A cut never splits a character.
        let mut s = LineSplitter::default();
        let mut data = vec![b'a'; MAX_LINE - 1];
        data.extend("é".as_bytes());
        let lines = s.push(&data);
        assert_eq!(lines[0].len(), MAX_LINE - 1);
        assert_eq!(s.finish().as_deref(), Some("é"));
    }

    #[test]
    fn events_have_the_sdk_shape() {
        let frame = Event::init("abc", 7).frame();
        assert_eq!(
            &frame[..],
            br#"data: {"type":"init","text":"abc","timestamp":7}"#.iter().chain(b"\n\n").copied().collect::<Vec<_>>()
        );
        let v: serde_json::Value = serde_json::from_slice(&Event::complete(12, 9).frame()[6..]).unwrap();
        assert_eq!(v, serde_json::json!({"type": "execution_complete", "execution_time": 12, "timestamp": 9}));
        let v: serde_json::Value = serde_json::from_slice(&Event::exec_error("3".into(), 9).frame()[6..]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "timestamp": 9, "error": {"ename": "CommandExecError", "evalue": "3", "traceback": []}})
        );
        let v: serde_json::Value = serde_json::from_slice(&Event::ping(1).frame()[6..]).unwrap();
        assert_eq!(v, serde_json::json!({"type": "ping", "text": "pong", "timestamp": 1}));
        // Text with newlines stays on one data line.
        let f = Event::text("stdout", "a\nb".into(), 1).frame();
        assert_eq!(f.iter().filter(|&&b| b == b'\n').count(), 2);
    }

    #[test]
    fn ranges_follow_execd() {
        assert_eq!(parse_range("bytes=0-4", 10), Ok(ByteRange { start: 0, len: 5 }));
        assert_eq!(parse_range("bytes=5-", 10), Ok(ByteRange { start: 5, len: 5 }));
        assert_eq!(parse_range("bytes=-3", 10), Ok(ByteRange { start: 7, len: 3 }));
        assert_eq!(parse_range("bytes=-30", 10), Ok(ByteRange { start: 0, len: 10 }));
        assert_eq!(parse_range("bytes=8-100", 10), Ok(ByteRange { start: 8, len: 2 }));
        assert_eq!(parse_range("bytes=20-30, 2-3", 10), Ok(ByteRange { start: 2, len: 2 }));
        for bad in ["bytes=20-30", "bytes=5-2", "items=0-1", "bytes=a-b", "bytes=0", "bytes=", "bytes=-0", "bytes=+1-2"]
        {
            assert_eq!(parse_range(bad, 10), Err(BadRange), "{bad}");
        }
        assert_eq!(parse_range("bytes=0-0", 0), Err(BadRange));
    }

    #[test]
    fn modes_are_octal_digits() {
        assert_eq!(parse_mode(755), Ok(Some(0o755)));
        assert_eq!(parse_mode(644), Ok(Some(0o644)));
        assert_eq!(parse_mode(4755), Ok(Some(0o4755)));
        assert_eq!(parse_mode(0), Ok(None));
        for bad in [789, -1, 77777, 8] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
        assert_eq!(format_mode(0o755), 755);
        assert_eq!(format_mode(0o100644), 644);
        assert_eq!(format_mode(0), 0);
    }

    #[test]
    fn globs_match_names() {
        for (p, n) in [
            ("**", "x.py"),
            ("*", "x"),
            ("*.py", "a.py"),
            ("**/*.py", "a.py"),
            ("**/**/*.py", "a.py"),
            ("a?c", "abc"),
            ("[ab]*", "bz"),
            ("[a-c]x", "bx"),
            ("[!a]x", "bx"),
            ("*.{py,rs}", "m.rs"),
            ("{foo,bar}.txt", "bar.txt"),
            ("\\*", "*"),
            ("*a*b*", "xaybz"),
            ("", ""),
        ] {
            assert!(NameGlob::new(p).matches(n), "{p} should match {n}");
        }
        for (p, n) in [
            ("*.py", "a.rs"),
            ("a?c", "ac"),
            ("[ab]*", "cz"),
            ("[!a]x", "ax"),
            ("*.{py,rs}", "m.go"),
            ("\\*", "a"),
            ("\\a", "\\a"),
            ("src/*.py", "a.py"),
            ("a", "ab"),
            ("[unclosed", "u"),
        ] {
            assert!(!NameGlob::new(p).matches(n), "{p} should not match {n}");
        }
        assert!(NameGlob::new("[unclosed").matches("[unclosed"));
    }

    #[test]
    fn the_log_keeps_its_tail_and_offsets() {
        let mut log = TailLog::new(4);
        log.push(b"ab");
        assert_eq!(log.read_from(0), b"ab");
        assert_eq!(log.end(), 2);
        log.push(b"cdef");
        assert_eq!(log.end(), 6);
        assert_eq!(log.read_from(0), b"cdef");
        assert_eq!(log.read_from(4), b"ef");
        assert_eq!(log.read_from(6), b"");
        assert_eq!(log.read_from(60), b"");
    }

    #[test]
    fn env_files_parse_as_set_env_writes_them() {
        let text = "A='plain value'\nB=\"it's \\\"q\\\" \\$HOME\\n2\"\n# comment\nC='multi\nline'\n\nexport D=bare  \nbad line\n1X=no\nA='later wins'\nF=\nE='unclosed\n";
        let env = parse_env_file(text);
        assert_eq!(env.get("A").map(String::as_str), Some("later wins"));
        assert_eq!(env.get("B").map(String::as_str), Some("it's \"q\" $HOME\n2"));
        assert_eq!(env.get("C").map(String::as_str), Some("multi\nline"));
        assert_eq!(env.get("D").map(String::as_str), Some("bare"));
        assert_eq!(env.get("F").map(String::as_str), Some(""));
        assert!(!env.contains_key("1X") && !env.contains_key("E"), "{env:?}");
        assert_eq!(env.len(), 5, "{env:?}");
        assert!(parse_env_file("").is_empty());
        assert!(parse_env_file("N='a\0b'\n").is_empty(), "a NUL cannot be passed to a program");
    }
}
