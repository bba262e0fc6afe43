//! Checks a tar a run's driver uploads (or a caller gives as inputs) before it is kept: safe
//! paths only, no device nodes, links that stay inside, and bounds on entries and bytes, so a
//! result can be unpacked anywhere by whoever fetches it.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// What a tar may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_entries: usize,
    /// Bytes of file contents, counted as the headers declare them.
    pub max_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TarError(pub String);

/// Whether `p` is a relative path that stays where it is unpacked.
fn safe(p: &Path) -> bool {
    !p.as_os_str().is_empty() && p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Where `target` leads from a link at `at`, if it stays inside the archive's root.
fn stays_inside(at: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: Vec<PathBuf> =
        at.parent().map(|p| p.components().map(|c| PathBuf::from(c.as_os_str())).collect()).unwrap_or_default();
    for c in target.components() {
        match c {
            Component::Normal(n) => depth.push(PathBuf::from(n)),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Reads the whole archive and checks every entry; answers how many it holds.
pub fn check(reader: impl Read, limits: Limits) -> Result<usize, TarError> {
    let mut archive = tar::Archive::new(reader);
    let mut count = 0usize;
    let mut bytes = 0u64;
    let entries = archive.entries().map_err(|e| TarError(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| TarError(format!("not a valid tar archive: {e}")))?;
        count += 1;
        if count > limits.max_entries {
            return Err(TarError(format!("the archive holds more than {} entries", limits.max_entries)));
        }
        let path = entry.path().map_err(|e| TarError(format!("entry {count}: unreadable path: {e}")))?.into_owned();
        if !safe(&path) {
            return Err(TarError(format!(
                "entry {:?} has an unsafe path: paths must be relative, without ..",
                path.display()
            )));
        }
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::Directory => {}
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| TarError(format!("entry {:?}: unreadable link target: {e}", path.display())))?
                    .ok_or_else(|| TarError(format!("link {:?} has no target", path.display())))?
                    .into_owned();
                let inside = if kind == tar::EntryType::Link { safe(&target) } else { stays_inside(&path, &target) };
                if !inside {
                    return Err(TarError(format!(
                        "link {:?} points outside the archive ({:?})",
                        path.display(),
                        target.display()
                    )));
                }
            }
            other => {
                return Err(TarError(format!(
                    "entry {:?} is a {:?}: only files, directories and links are accepted",
                    path.display(),
                    other
                )));
            }
        }
        let size = entry.header().size().unwrap_or(0);
        bytes = bytes.saturating_add(size);
        if bytes > limits.max_bytes {
            return Err(TarError(format!("the archive's files hold more than {} bytes", limits.max_bytes)));
        }
        // Reading the contents checks that the archive really holds what its headers say.
        std::io::copy(&mut entry, &mut std::io::sink())
            .map_err(|e| TarError(format!("entry {:?} is cut short: {e}", path.display())))?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_entries: 10, max_bytes: 1 << 20 };

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // Written raw, so a test can put paths `append_data` itself would refuse.
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, body).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(kind);
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        let t = target.as_bytes();
        h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    #[test]
    fn plain_archives_pass() {
        let t = tar_of(|b| {
            file(b, "out/report.json", b"{}");
            link(b, tar::EntryType::Symlink, "out/latest", "report.json");
            link(b, tar::EntryType::Symlink, "out/up", "../out/report.json");
        });
        assert_eq!(check(&t[..], LIMITS), Ok(3));
    }

    #[test]
    fn hostile_archives_are_refused_and_say_why() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (tar_of(|b| file(b, "/etc/marker", b"x")), "unsafe path"),
            (tar_of(|b| file(b, "a/../../marker", b"x")), "unsafe path"),
            (tar_of(|b| link(b, tar::EntryType::Symlink, "l", "/etc")), "outside"),
            (tar_of(|b| link(b, tar::EntryType::Symlink, "a/l", "../../x")), "outside"),
            (tar_of(|b| link(b, tar::EntryType::Link, "l", "../x")), "outside"),
            (
                tar_of(|b| {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_size(0);
                    h.set_path("dev").unwrap();
                    h.set_cksum();
                    b.append(&h, &[][..]).unwrap();
                }),
                "only files",
            ),
            (tar_of(|b| (0..11).for_each(|i| file(b, &format!("f{i}"), b"x"))), "more than 10 entries"),
            (tar_of(|b| file(b, "big", &vec![0u8; (1 << 20) + 1])), "more than"),
            (b"not a tar at all, just some text that is long enough".repeat(20), "tar"),
        ];
        for (bytes, want) in cases {
            let e = check(&bytes[..], LIMITS).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should say {want:?}");
        }
    }
}
