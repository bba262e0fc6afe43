//! The uid and gid an image's `User` means, resolved from the image's own account files.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::error::{ImageError, Result};
use crate::store::{Image, Store};

/// What a layer says about a path.
enum Found {
    File(Vec<u8>),
    /// Deleted (a whiteout, or hidden by an opaque directory): lower layers do not count.
    Gone,
    Absent,
}

fn lookup_in_layer(layer: &Path, dir: &str, file: &str) -> Result<Found> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let io = |e| ImageError::errno(format!("reading /{dir}/{file} in layer {}", layer.display()), e);
    let root = rustix::fs::open(layer, flags | OFlags::DIRECTORY, Mode::empty()).map_err(io)?;
    let kind = |fd: &OwnedFd, name: &str| -> Result<Option<(FileType, u64)>> {
        match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some((FileType::from_raw_mode(st.st_mode), st.st_rdev))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(io(e)),
        }
    };
    let d = match kind(&root, dir)? {
        None => return Ok(Found::Absent),
        Some((FileType::Directory, _)) => {
            rustix::fs::openat(&root, dir, flags | OFlags::DIRECTORY, Mode::empty()).map_err(io)?
        }
        // A whiteout, a symlink (never followed out of the image) or a file: no account file.
        Some(_) => return Ok(Found::Gone),
    };
    match kind(&d, file)? {
        Some((FileType::RegularFile, _)) => {
            let fd = rustix::fs::openat(&d, file, flags, Mode::empty()).map_err(io)?;
            let mut out = Vec::new();
            File::from(fd)
                .take(16 << 20)
                .read_to_end(&mut out)
                .map_err(|e| ImageError::io(format!("reading /{dir}/{file}"), e))?;
            Ok(Found::File(out))
        }
        Some(_) => Ok(Found::Gone),
        None => {
            let mut buf = [0u8; 8];
            let opaque = rustix::fs::fgetxattr(&d, "trusted.overlay.opaque", &mut buf).is_ok_and(|n| &buf[..n] == b"y");
            Ok(if opaque { Found::Gone } else { Found::Absent })
        }
    }
}

/// The content of `/dir/file` as the mounted image shows it: from the top-most layer that has
/// (or deletes) it.
fn image_file(image: &Image, dir: &str, file: &str) -> Result<Option<Vec<u8>>> {
    for layer in image.layers.iter().rev() {
        match lookup_in_layer(layer, dir, file)? {
            Found::File(b) => return Ok(Some(b)),
            Found::Gone => return Ok(None),
            Found::Absent => {}
        }
    }
    Ok(None)
}

/// `(name, id, gid)` of each line of a passwd (gid from field 4) or group file.
fn entries(file: &[u8]) -> Vec<(String, u32, Option<u32>)> {
    String::from_utf8_lossy(file)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let id = f.get(2)?.parse().ok()?;
            Some((f[0].to_string(), id, f.get(3).and_then(|g| g.parse().ok())))
        })
        .collect()
}

pub(crate) fn resolve_user(image: &Image) -> Result<Option<(u32, u32)>> {
    let Some(spec) = image.config.user.as_deref().map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let bad = |why: String| ImageError::Config(format!("{}: its config says User {spec:?}, but {why}", image.name));
    let passwd = entries(&image_file(image, "etc", "passwd")?.unwrap_or_default());
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (uid, passwd.iter().find(|e| e.1 == uid).and_then(|e| e.2)),
        Err(_) => match passwd.iter().find(|e| e.0 == user) {
            Some(e) => (e.1, e.2),
            None if user == "root" => (0, Some(0)),
            None => return Err(bad(format!("the image's /etc/passwd has no user {user:?}"))),
        },
    };
    let gid = match group {
        None | Some("") => primary.unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = entries(&image_file(image, "etc", "group")?.unwrap_or_default());
                match groups.iter().find(|e| e.0 == g) {
                    Some(e) => e.1,
                    None if g == "root" => 0,
                    None => return Err(bad(format!("the image's /etc/group has no group {g:?}"))),
                }
            }
        },
    };
    Ok(Some((uid, gid)))
}

impl Store {
    /// The uid and gid the image's config `User` means (`""`, `root`, `1000`, `1000:1000`,
    /// `app`, `app:grp`), names resolved from the image's own /etc/passwd and /etc/group (the
    /// top-most layer that has them); `None` when the image sets no user.
    pub fn image_user(&self, image: &Image) -> Result<Option<(u32, u32)>> {
        resolve_user(image)
    }
}
