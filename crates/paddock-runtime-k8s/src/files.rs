//! File operations as busybox-level shell scripts run in the keeper Pod.
//!
//! Paths travel as positional arguments (`sh -c SCRIPT paddock-file PATH ...`), never inside
//! the script text, so spaces, quotes and newlines in a name are inert. Each script that
//! changes something ends by printing the target's `stat` line, saving a second round trip.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use paddock_core::runtime::{FileErrorKind, FileKind, FileOp, FileStat, RuntimeError};
use tokio::io::{AsyncRead, ReadBuf};

/// The `stat -c` format every script prints: raw mode (hex), size, uid, gid, mtime (s).
const STAT: &str = "%f %s %u %g %Y";

/// Resolves a request path: absolute as given, relative from `/workspace`.
pub fn resolve(path: &str) -> Result<String, RuntimeError> {
    if path.is_empty() {
        return Err(file_err(FileErrorKind::InvalidPath, "empty path: give a path such as /workspace/file.txt".into()));
    }
    if path.contains('\0') {
        return Err(file_err(FileErrorKind::InvalidPath, format!("{path:?} contains a NUL byte")));
    }
    Ok(if path.starts_with('/') { path.to_owned() } else { format!("/workspace/{path}") })
}

/// Set-uid and set-gid bits are never set through the file API, as in the local runtime: no
/// sandbox task needs a set-id file made from outside.
fn mode_arg(mode: u32) -> String {
    format!("{:o}", mode & 0o1777)
}

fn file_err(kind: FileErrorKind, message: String) -> RuntimeError {
    RuntimeError::File { kind, message }
}

/// A script and its positional arguments, as an exec argv.
fn script(text: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec!["sh".to_owned(), "-c".to_owned(), text.to_owned(), "paddock-file".to_owned()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv
}

/// Says `No such file or directory` for a missing path the way the tools would, so one
/// classifier handles both.
const MISSING: &str =
    r#"missing() { if [ ! -e "$1" ] && [ ! -L "$1" ]; then echo "No such file or directory" >&2; exit 1; fi; }"#;

/// The argv of a file operation on resolved paths.
pub fn op_argv(op: &FileOp) -> Result<Vec<String>, RuntimeError> {
    Ok(match op {
        FileOp::Chown { .. } => {
            return Err(RuntimeError::Unsupported("changing owners is not supported on Kubernetes".into()));
        }
        FileOp::Stat { path } => {
            script(&format!("{MISSING}\nmissing \"$1\"\nstat -c '{STAT}' -- \"$1\""), &[&resolve(path)?])
        }
        FileOp::List { path } => script(
            &format!(
                r#"{MISSING}
missing "$1"
[ -d "$1" ] || {{ echo "Not a directory" >&2; exit 1; }}
[ -r "$1" ] && [ -x "$1" ] || {{ echo "Permission denied" >&2; exit 1; }}
n=0
for f in "$1"/* "$1"/.*; do
  case ${{f##*/}} in .|..) continue ;; esac
  [ -e "$f" ] || [ -L "$f" ] || continue
  n=$((n+1))
  [ "$n" -le {max} ] || {{ echo "the directory holds more than {max} entries: list a subdirectory" >&2; exit 1; }}
  stat -c '{STAT}' -- "$f" 2>/dev/null || continue
  printf '%s\0' "$f"
done"#,
                max = paddock_core::runtime::MAX_LISTED_ENTRIES
            ),
            &[&resolve(path)?],
        ),
        FileOp::Mkdir { path, mode } => script(
            &format!(
                "mkdir -p -- \"$1\" || exit 1\n[ -z \"$2\" ] || chmod \"$2\" -- \"$1\" || exit 1\nstat -c '{STAT}' -- \"$1\""
            ),
            &[&resolve(path)?, &mode.map(mode_arg).unwrap_or_default()],
        ),
        FileOp::Remove { path, recursive } => script(
            &format!(
                r#"{MISSING}
missing "$1"
if [ -d "$1" ] && [ ! -L "$1" ]; then
  if [ "$2" = 1 ]; then rm -rf -- "$1"; else rmdir -- "$1"; fi
else
  rm -f -- "$1"
fi"#
            ),
            &[&resolve(path)?, if *recursive { "1" } else { "0" }],
        ),
        FileOp::Move { from, to } => script(
            &format!(
                "{MISSING}\nmissing \"$1\"\nmkdir -p -- \"$(dirname -- \"$2\")\" || exit 1\nmv -f -T -- \"$1\" \"$2\" || exit 1\nstat -c '{STAT}' -- \"$2\""
            ),
            &[&resolve(from)?, &resolve(to)?],
        ),
        FileOp::Chmod { path, mode } => script(
            &format!("{MISSING}\nmissing \"$1\"\nchmod \"$2\" -- \"$1\" || exit 1\nstat -c '{STAT}' -- \"$1\""),
            &[&resolve(path)?, &mode_arg(*mode)],
        ),
    })
}

/// Checks that `$1` is a readable regular file, then streams it.
pub const READ_SCRIPT: &str = r#"if [ -d "$1" ]; then echo "Is a directory" >&2; exit 1; fi
if [ ! -e "$1" ]; then echo "No such file or directory" >&2; exit 1; fi
if [ ! -f "$1" ]; then echo "not a regular file (a device, FIFO or socket)" >&2; exit 1; fi
if [ ! -r "$1" ]; then echo "Permission denied" >&2; exit 1; fi
exec cat -- "$1""#;

/// Replaces `$1` with standard input, creating its parents; applies mode `$2` when given.
/// `cat` stays a child of the exec's process (never its last command, which the shell would
/// run in its place): see `exec::STAGE_SCRIPT` for the input it would lose otherwise.
pub const WRITE_SCRIPT: &str = r#"if [ -d "$1" ]; then echo "Is a directory" >&2; exit 1; fi
if [ -e "$1" ] && [ ! -f "$1" ]; then echo "not a regular file (a device, FIFO or socket)" >&2; exit 1; fi
mkdir -p -- "$(dirname -- "$1")" || exit 1
cat >"$1" || exit 1
[ -z "$2" ] || chmod "$2" -- "$1""#;

pub fn read_argv(path: &str) -> Result<Vec<String>, RuntimeError> {
    Ok(script(READ_SCRIPT, &[&resolve(path)?]))
}

pub fn write_argv(path: &str, mode: Option<u32>) -> Result<Vec<String>, RuntimeError> {
    Ok(script(WRITE_SCRIPT, &[&resolve(path)?, &mode.map(mode_arg).unwrap_or_default()]))
}

/// Reads the kind of a failure from the tools' own words (busybox and GNU say the same).
pub fn classify(stderr: &str) -> FileErrorKind {
    let s = stderr.to_ascii_lowercase();
    let table = [
        ("no such file or directory", FileErrorKind::NotFound),
        ("permission denied", FileErrorKind::PermissionDenied),
        ("read-only file system", FileErrorKind::PermissionDenied),
        ("operation not permitted", FileErrorKind::PermissionDenied),
        ("file exists", FileErrorKind::AlreadyExists),
        ("not a directory", FileErrorKind::NotADirectory),
        ("is a directory", FileErrorKind::IsADirectory),
        ("directory not empty", FileErrorKind::DirectoryNotEmpty),
        ("not a regular file", FileErrorKind::InvalidPath),
        ("file name too long", FileErrorKind::InvalidPath),
        ("invalid argument", FileErrorKind::InvalidPath),
        ("no space left on device", FileErrorKind::NoSpace),
        ("disk quota exceeded", FileErrorKind::NoSpace),
    ];
    table
        .iter()
        .filter_map(|(needle, kind)| s.find(needle).map(|at| (at, *kind)))
        .min_by_key(|(at, _)| *at)
        .map_or(FileErrorKind::Other, |(_, kind)| kind)
}

/// The error of a failed script: `op` and the tool's last words.
pub fn failure(op: &str, stderr: &[u8]) -> RuntimeError {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("failed without a message");
    // Busybox prefixes its applet name; the operation says it better.
    let line = line.split_once(": ").filter(|(a, _)| !a.contains('/') && !a.contains(' ')).map_or(line, |(_, r)| r);
    file_err(classify(&text), format!("{op}: {line}"))
}

/// Parses one `STAT` line for `path`.
pub fn parse_stat(path: &str, line: &str) -> Option<FileStat> {
    let mut f = line.split_ascii_whitespace();
    let raw = u32::from_str_radix(f.next()?, 16).ok()?;
    let size = f.next()?.parse().ok()?;
    let uid = f.next()?.parse().ok()?;
    let gid = f.next()?.parse().ok()?;
    let mtime: i64 = f.next()?.parse().ok()?;
    let kind = match raw & 0o170000 {
        0o100000 => FileKind::File,
        0o040000 => FileKind::Dir,
        0o120000 => FileKind::Symlink,
        _ => FileKind::Other,
    };
    Some(FileStat { path: path.to_owned(), kind, size, mode: raw & 0o7777, uid, gid, modified_unix_ms: mtime * 1000 })
}

/// Parses the list script's output: `STAT` line, newline, path, NUL, per entry; sorted.
pub fn parse_list(out: &[u8]) -> Vec<FileStat> {
    let mut entries: Vec<FileStat> = out
        .split(|b| *b == 0)
        .filter(|r| !r.is_empty())
        .filter_map(|record| {
            let nl = record.iter().position(|b| *b == b'\n')?;
            let line = std::str::from_utf8(&record[..nl]).ok()?;
            parse_stat(&String::from_utf8_lossy(&record[nl + 1..]), line)
        })
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries
}

/// A file's contents: what was already read, then the rest of the stream; at the end, the
/// exec's outcome turns a failed `cat` into a read error instead of a silent short file.
pub struct FileReader {
    pub head: io::Cursor<Vec<u8>>,
    pub rest: tokio::io::DuplexStream,
    pub outcome: Option<Pin<Box<dyn Future<Output = io::Result<()>> + Send>>>,
}

impl AsyncRead for FileReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.head.position() < this.head.get_ref().len() as u64 {
            return Pin::new(&mut this.head).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.rest).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before => match this.outcome.as_mut() {
                Some(f) => {
                    let r = std::task::ready!(f.as_mut().poll(cx));
                    this.outcome = None;
                    Poll::Ready(r)
                }
                None => Poll::Ready(Ok(())),
            },
            other => other,
        }
    }
}

#[cfg(test)]
#[expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_start_at_the_workspace() {
        assert_eq!(resolve("a/b").unwrap(), "/workspace/a/b");
        assert_eq!(resolve("/etc/x").unwrap(), "/etc/x");
        assert!(matches!(resolve(""), Err(RuntimeError::File { kind: FileErrorKind::InvalidPath, .. })));
        assert!(matches!(resolve("a\0b"), Err(RuntimeError::File { kind: FileErrorKind::InvalidPath, .. })));
    }

    #[test]
    fn tool_messages_are_classified() {
        let cases = [
            ("cat: can't open 'x': No such file or directory", FileErrorKind::NotFound),
            ("mkdir: can't create directory '/etc/x': Read-only file system", FileErrorKind::PermissionDenied),
            ("rm: can't remove 'x': Permission denied", FileErrorKind::PermissionDenied),
            ("rmdir: 'e': Directory not empty", FileErrorKind::DirectoryNotEmpty),
            ("mv: can't rename 'd': Directory not empty", FileErrorKind::DirectoryNotEmpty),
            ("mv: 'd' is a directory", FileErrorKind::IsADirectory),
            ("/x: Not a directory", FileErrorKind::NotADirectory),
            ("mkdir: can't create directory 'a': File exists", FileErrorKind::AlreadyExists),
            ("weird", FileErrorKind::Other),
        ];
        for (text, kind) in cases {
            assert_eq!(classify(text), kind, "{text}");
        }
        let e = failure("read /workspace/x", b"cat: can't open 'x': No such file or directory\n");
        assert_eq!(
            e,
            RuntimeError::File {
                kind: FileErrorKind::NotFound,
                message: "read /workspace/x: can't open 'x': No such file or directory".into()
            }
        );
        let e = failure("stat /a b", b"No such file or directory\n");
        assert!(
            matches!(e, RuntimeError::File { kind: FileErrorKind::NotFound, ref message } if message == "stat /a b: No such file or directory"),
            "{e:?}"
        );
    }

    #[test]
    fn stat_lines_parse() {
        let s = parse_stat("/w/f", "81a4 3 1000 1000 1700000000").unwrap();
        assert_eq!(
            s,
            FileStat {
                path: "/w/f".into(),
                kind: FileKind::File,
                size: 3,
                mode: 0o644,
                uid: 1000,
                gid: 1000,
                modified_unix_ms: 1_700_000_000_000
            }
        );
        assert_eq!(parse_stat("d", "41ed 4096 0 0 1").unwrap().kind, FileKind::Dir);
        assert_eq!(parse_stat("d", "41ed 4096 0 0 1").unwrap().mode, 0o755);
        assert_eq!(parse_stat("l", "a1ff 4 0 0 1").unwrap().kind, FileKind::Symlink);
        assert!(parse_stat("x", "zz").is_none());
    }

    #[test]
    fn list_output_parses_names_with_newlines() {
        let out = b"81a4 1 1 1 1\n/w/b\x0041ed 2 1 1 1\n/w/a\nline\x00";
        let l = parse_list(out);
        assert_eq!(l.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["/w/a\nline", "/w/b"]);
        assert_eq!(l[0].kind, FileKind::Dir);
    }

    #[test]
    fn argv_keeps_paths_out_of_the_script() {
        let argv = op_argv(&FileOp::Chmod { path: "a '$(x)\n".into(), mode: 0o600 }).unwrap();
        assert_eq!(&argv[3..], ["paddock-file", "/workspace/a '$(x)\n", "600"]);
        assert!(!argv[2].contains("$(x)"));
        let argv = write_argv("f", None).unwrap();
        assert_eq!(&argv[3..], ["paddock-file", "/workspace/f", ""]);
        let argv = write_argv("f", Some(0o6755)).unwrap();
        assert_eq!(argv[5], "755", "no set-id bits");
        let argv = op_argv(&FileOp::Chmod { path: "d".into(), mode: 0o1777 }).unwrap();
        assert_eq!(argv[5], "1777", "the sticky bit is fine");
    }

    fn busybox() -> Option<&'static str> {
        ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists())
    }

    fn run(argv: &[String], input: &[u8]) -> (i32, Vec<u8>, Vec<u8>) {
        use std::io::Write;
        let mut child = std::process::Command::new(busybox().unwrap())
            .args(argv)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
    }

    /// The scripts against the host's busybox in a temporary directory, when there is one.
    #[test]
    fn scripts_run_under_busybox() {
        if busybox().is_none() {
            eprintln!("skipped: no busybox on this host");
            return;
        }
        let dir = std::env::temp_dir().join(format!("paddock-k8s-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_str().unwrap();
        let weird = format!("{d}/sub dir/it's \"q\"\nx");
        let (c, _, e) = run(&write_argv(&weird, Some(0o600)).unwrap(), b"hello");
        assert_eq!(c, 0, "{}", String::from_utf8_lossy(&e));
        let (c, out, _) = run(&read_argv(&weird).unwrap(), b"");
        assert_eq!((c, out.as_slice()), (0, b"hello".as_slice()));
        let (c, out, _) = run(&op_argv(&FileOp::Stat { path: weird.clone() }).unwrap(), b"");
        assert_eq!(c, 0);
        let st = parse_stat(&weird, std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o600));
        let (c, out, _) = run(&op_argv(&FileOp::List { path: format!("{d}/sub dir") }).unwrap(), b"");
        assert_eq!(c, 0);
        assert_eq!(parse_list(&out).iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), [weird.as_str()]);
        let (c, _, e) = run(&read_argv(&format!("{d}/nope")).unwrap(), b"");
        assert_eq!((c, classify(&String::from_utf8_lossy(&e))), (1, FileErrorKind::NotFound));
        let (c, _, e) = run(&read_argv(&format!("{d}/sub dir")).unwrap(), b"");
        assert_eq!((c, classify(&String::from_utf8_lossy(&e))), (1, FileErrorKind::IsADirectory));
        let moved = format!("{d}/m/n/o");
        let (c, _, e) = run(&op_argv(&FileOp::Move { from: weird.clone(), to: moved.clone() }).unwrap(), b"");
        assert_eq!(c, 0, "{}", String::from_utf8_lossy(&e));
        let (c, _, e) = run(&op_argv(&FileOp::Remove { path: format!("{d}/m"), recursive: false }).unwrap(), b"");
        assert_eq!((c, classify(&String::from_utf8_lossy(&e))), (1, FileErrorKind::DirectoryNotEmpty));
        let (c, _, _) = run(&op_argv(&FileOp::Remove { path: format!("{d}/m"), recursive: true }).unwrap(), b"");
        assert_eq!(c, 0);
        let (c, out, _) = run(&op_argv(&FileOp::Mkdir { path: format!("{d}/k/l"), mode: Some(0o700) }).unwrap(), b"");
        assert_eq!(c, 0);
        assert_eq!(parse_stat("x", std::str::from_utf8(&out).unwrap()).unwrap().mode, 0o700);
        let (c, _, e) = run(&op_argv(&FileOp::Stat { path: format!("{d}/m") }).unwrap(), b"");
        assert_eq!((c, classify(&String::from_utf8_lossy(&e))), (1, FileErrorKind::NotFound));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
