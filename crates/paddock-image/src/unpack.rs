//! Unpacking one layer tarball into a directory that overlayfs can use as a lower layer.
//!
//! Every entry is created relative to a directory file descriptor reached one component at a
//! time with `O_NOFOLLOW`, so no entry can be written through a symlink an earlier entry (or
//! anyone) put in the tree, and `..` or absolute names are refused outright: a layer is
//! untrusted input unpacked as root.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dev, FileType, Mode, OFlags, Timestamps, XattrFlags};
use rustix::io::Errno;
use rustix::time::Timespec;
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};
use crate::limits::{Counted, Limits, Meter};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// Both namespaces: `trusted.` for overlay mounted by real root, `user.` for overlay mounted
/// with `userxattr` inside a user namespace (where `trusted.` is invisible).
const OPAQUE_XATTRS: [&str; 2] = ["trusted.overlay.opaque", "user.overlay.opaque"];

/// A reader that hashes (sha256) and counts everything read through it.
pub(crate) struct HashReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashReader<R> {
    pub fn new(inner: R) -> Self {
        HashReader { inner, hasher: Sha256::new(), count: 0 }
    }

    /// Reads the rest of the stream (tar archives end before their padding does) and returns
    /// the digest and byte count of everything.
    pub fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((format!("sha256:{}", hex::encode(self.hasher.finalize())), self.count))
    }
}

impl<R: Read> Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// sha256 digest and length of a whole stream.
pub(crate) fn digest_of(r: impl Read) -> io::Result<(String, u64)> {
    HashReader::new(r).finish()
}

/// Wraps a possibly compressed layer in the matching decompressor, chosen by magic bytes
/// rather than by media type: `docker save` and some registries label layers loosely.
pub(crate) fn decompress<'a>(r: impl Read + 'a) -> io::Result<Box<dyn Read + 'a>> {
    let mut buf = BufReader::with_capacity(256 * 1024, r);
    let magic = buf.fill_buf()?;
    Ok(if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(buf))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(buf)?)
    } else {
        Box::new(buf)
    })
}

/// What unpacking a layer found.
#[derive(Debug, Clone)]
pub(crate) struct Unpacked {
    /// Digest of the uncompressed tarball: the layer's `diff_id`.
    pub diff_id: String,
    /// Bytes of regular file content written (hard links counted once).
    pub size: u64,
}

struct DirMeta {
    path: Vec<OsString>,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
}

/// Where a layer is unpacked within what bounds: the image's other layers and the store's
/// contents count against `limits` too.
pub(crate) struct Bounds<'a> {
    pub limits: &'a Limits,
    /// The store's directory, whose filesystem must keep `limits.min_free` free.
    pub store: &'a Path,
    pub image_before: u64,
    pub store_before: u64,
}

/// Unpacks the (possibly compressed) layer `blob` into the existing empty directory `dest`,
/// within `bounds`.
pub(crate) fn unpack(blob: impl Read, dest: &Path, bounds: &Bounds<'_>) -> Result<Unpacked> {
    let io_err = |e: io::Error| corrupt_tar(dest, e);
    let (counted, compressed) = Counted::new(blob);
    let hashed = HashReader::new(decompress(counted).map_err(io_err)?);
    let mut archive = tar::Archive::new(hashed);
    let root = rustix::fs::open(dest, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| ImageError::errno(format!("opening {}", dest.display()), e))?;
    let mut meter = Meter::new(bounds.limits, bounds.store, bounds.image_before, bounds.store_before, compressed)?;
    let mut dirs: Vec<DirMeta> = Vec::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let entries = archive.entries().map_err(|e| corrupt_tar(dest, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| corrupt_tar(dest, e))?;
        meter.entry()?;
        unpack_entry(&root, &mut entry, &mut dirs, &mut meter, &mut buf)?;
    }
    let size = meter.written;
    // Directory times and modes last: creating entries inside a directory changes its mtime,
    // and a read-only mode must not stop later entries.
    for d in dirs.iter().rev() {
        let fd = open_dir(&root, &d.path, false)?;
        let what = || format!("setting the metadata of directory {}", show(&d.path));
        rustix::fs::fchown(&fd, Some(uid(d.uid)), Some(gid(d.gid))).map_err(|e| ImageError::errno(what(), e))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(strip_mode(d.mode))).map_err(|e| ImageError::errno(what(), e))?;
        rustix::fs::futimens(&fd, &times(d.mtime)).map_err(|e| ImageError::errno(what(), e))?;
    }
    let hashed = archive.into_inner();
    let (diff_id, _) = hashed.finish().map_err(io_err)?;
    Ok(Unpacked { diff_id, size })
}

fn corrupt_tar(dest: &Path, e: io::Error) -> ImageError {
    match e.kind() {
        // flate2 reports a corrupt stream as InvalidInput, tar and zstd as Other.
        io::ErrorKind::InvalidData
        | io::ErrorKind::InvalidInput
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::Other
            if e.raw_os_error().is_none() =>
        {
            ImageError::Corrupt(format!(
                "the layer is not a valid (compressed) tar archive: {e}; pull or import it again"
            ))
        }
        _ => ImageError::io(format!("unpacking a layer into {}", dest.display()), e),
    }
}

fn uid(raw: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw_unchecked(raw)
}

fn gid(raw: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw_unchecked(raw)
}

/// Set-uid and set-gid bits are dropped: a sandbox runs unprivileged, and a set-id binary from
/// an image is only a way up should it ever run with more privilege than intended.
fn strip_mode(mode: u32) -> u32 {
    mode & 0o1777
}

fn times(mtime: i64) -> Timestamps {
    let t = Timespec { tv_sec: mtime, tv_nsec: 0 };
    Timestamps { last_access: t, last_modification: t }
}

fn show(path: &[OsString]) -> String {
    let joined: Vec<_> = path.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    format!("/{}", joined.join("/"))
}

/// Splits an entry name into plain components, refusing absolute names and `..`.
fn components(raw: &[u8]) -> Result<Vec<OsString>> {
    if raw.first() == Some(&b'/') {
        return Err(ImageError::Corrupt(format!(
            "layer entry {:?} has an absolute path; a layer may only name paths inside itself",
            String::from_utf8_lossy(raw)
        )));
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(ImageError::Corrupt(format!(
                    "layer entry {:?} contains '..'; a layer may only name paths inside itself",
                    String::from_utf8_lossy(raw)
                )));
            }
            _ => out.push(OsStr::from_bytes(c).to_os_string()),
        }
    }
    Ok(out)
}

/// Opens the directory at `path` below `root`, one component at a time and never following a
/// symlink; missing directories are created (0755, root) when `create` is set.
fn open_dir(root: &OwnedFd, path: &[OsString], create: bool) -> Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut cur = rustix::fs::openat(root, ".", flags, Mode::empty())
        .map_err(|e| ImageError::errno("opening a layer directory", e))?;
    for (i, c) in path.iter().enumerate() {
        let next = match rustix::fs::openat(&cur, c.as_os_str(), flags, Mode::empty()) {
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&cur, c.as_os_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(ImageError::errno(format!("creating {}", show(&path[..=i])), e)),
                }
                let fd = rustix::fs::openat(&cur, c.as_os_str(), flags, Mode::empty());
                // mkdir's mode passes through the umask; a parent the layer does not list must
                // still be traversable by the sandbox user.
                if let Ok(fd) = &fd {
                    rustix::fs::fchmod(fd, Mode::from_raw_mode(0o755))
                        .map_err(|e| ImageError::errno(format!("creating {}", show(&path[..=i])), e))?;
                }
                fd
            }
            r => r,
        };
        cur = match next {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(ImageError::Corrupt(format!(
                    "layer entry path {} goes through {}, which is a symlink or not a directory; \
                     such a layer could write outside itself and is refused",
                    show(path),
                    show(&path[..=i])
                )));
            }
            Err(e) => return Err(ImageError::errno(format!("opening {}", show(&path[..=i])), e)),
        };
    }
    Ok(cur)
}

/// Removes whatever is at `name` in `dir` (recursively for a directory) unless it is a
/// directory and `keep_dir` is set; returns whether a directory was kept.
fn clear(dir: &OwnedFd, name: &OsStr, keep_dir: bool) -> Result<bool> {
    let what = || format!("replacing {}", name.to_string_lossy());
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(ImageError::errno(what(), e)),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            if keep_dir {
                return Ok(true);
            }
            remove_tree(dir, name)?;
            Ok(false)
        }
        Ok(_) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(|e| ImageError::errno(what(), e))?;
            Ok(false)
        }
    }
}

fn remove_tree(parent: &OwnedFd, name: &OsStr) -> Result<()> {
    let what = || format!("removing directory {}", name.to_string_lossy());
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ImageError::errno(what(), e))?;
    let mut children = Vec::new();
    let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| ImageError::errno(what(), e))?;
    while let Some(ent) = dir.read() {
        let ent = ent.map_err(|e| ImageError::errno(what(), e))?;
        let n = ent.file_name().to_bytes();
        if n != b"." && n != b".." {
            children.push((OsStr::from_bytes(n).to_os_string(), ent.file_type() == FileType::Directory));
        }
    }
    for (child, is_dir) in children {
        if is_dir {
            remove_tree(&fd, &child)?;
        } else {
            rustix::fs::unlinkat(&fd, child.as_os_str(), AtFlags::empty()).map_err(|e| ImageError::errno(what(), e))?;
        }
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(|e| ImageError::errno(what(), e))
}

/// Owner, mode and mtime of an entry, with PAX records (large ids, precise times) applied.
fn entry_meta<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<(u32, u32, u32, i64)> {
    let h = entry.header();
    let bad =
        |what: &str| ImageError::Corrupt(format!("a layer entry has an unreadable {what}; pull or import it again"));
    let mut uid_v = h.uid().map_err(|_| bad("uid"))?;
    let mut gid_v = h.gid().map_err(|_| bad("gid"))?;
    let mode = h.mode().map_err(|_| bad("mode"))?;
    let mut mtime = h.mtime().map_err(|_| bad("mtime"))?.cast_signed();
    if let Ok(Some(pax)) = entry.pax_extensions() {
        for ext in pax.flatten() {
            let Ok(v) = ext.value() else { continue };
            match ext.key() {
                Ok("uid") => uid_v = v.parse().map_err(|_| bad("uid"))?,
                Ok("gid") => gid_v = v.parse().map_err(|_| bad("gid"))?,
                Ok("mtime") => {
                    let secs = v.split('.').next().unwrap_or(v);
                    mtime = secs.parse().map_err(|_| bad("mtime"))?;
                }
                _ => {}
            }
        }
    }
    let to32 = |v: u64, what: &str| u32::try_from(v).map_err(|_| bad(what));
    Ok((to32(uid_v, "uid")?, to32(gid_v, "gid")?, mode, mtime))
}

fn unpack_entry<R: Read>(
    root: &OwnedFd,
    entry: &mut tar::Entry<'_, R>,
    dirs: &mut Vec<DirMeta>,
    meter: &mut Meter<'_>,
    buf: &mut [u8],
) -> Result<()> {
    let path = components(&entry.path_bytes())?;
    let (uid_v, gid_v, mode, mtime) = entry_meta(entry)?;
    let kind = entry.header().entry_type();
    let Some((name, parent_path)) = path.split_last() else {
        // The layer's own root ("./"): only its metadata, applied at the end.
        if kind.is_dir() {
            dirs.push(DirMeta { path: Vec::new(), mode, uid: uid_v, gid: gid_v, mtime });
        }
        return Ok(());
    };
    let parent = open_dir(root, parent_path, true)?;
    let what = || format!("unpacking {}", show(&path));
    let name_bytes = name.as_bytes();
    if name_bytes == OPAQUE_MARKER.as_bytes() {
        for attr in OPAQUE_XATTRS {
            rustix::fs::fsetxattr(&parent, attr, b"y", XattrFlags::empty()).map_err(|e| {
                ImageError::errno(
                    format!(
                        "marking {} opaque (xattr {attr}); the image store needs a filesystem with \
                         trusted and user xattrs, such as ext4 or xfs",
                        show(parent_path)
                    ),
                    e,
                )
            })?;
        }
        return Ok(());
    }
    if let Some(hidden) = name_bytes.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(ImageError::Corrupt(format!("layer entry {} is a whiteout of nothing", show(&path))));
        }
        let hidden = OsStr::from_bytes(hidden);
        clear(&parent, hidden, false)?;
        // overlayfs' own whiteout: a 0/0 character device.
        rustix::fs::mknodat(&parent, hidden, FileType::CharacterDevice, Mode::empty(), rustix::fs::makedev(0, 0))
            .map_err(|e| ImageError::errno(what(), e))?;
        return Ok(());
    }
    match kind {
        tar::EntryType::Directory => {
            if !clear(&parent, name, true)? {
                rustix::fs::mkdirat(&parent, name.as_os_str(), Mode::from_raw_mode(0o755))
                    .map_err(|e| ImageError::errno(what(), e))?;
            }
            dirs.push(DirMeta { path: path.clone(), mode, uid: uid_v, gid: gid_v, mtime });
            Ok(())
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            clear(&parent, name, false)?;
            let fd = rustix::fs::openat(
                &parent,
                name.as_os_str(),
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| ImageError::errno(what(), e))?;
            let mut file = File::from(fd);
            copy_sparse(entry, &mut file, meter, buf).map_err(|e| match e {
                Copy::Read(e) => {
                    ImageError::Corrupt(format!("the layer is truncated or unreadable at {}: {e}", show(&path)))
                }
                Copy::Write(e) => ImageError::io(what(), e),
                Copy::Bound(e) => e,
            })?;
            // Owner before mode: chown clears set-id bits anyway, and the mode is final.
            rustix::fs::fchown(&file, Some(uid(uid_v)), Some(gid(gid_v))).map_err(|e| ImageError::errno(what(), e))?;
            rustix::fs::fchmod(&file, Mode::from_raw_mode(strip_mode(mode)))
                .map_err(|e| ImageError::errno(what(), e))?;
            rustix::fs::futimens(&file, &times(mtime)).map_err(|e| ImageError::errno(what(), e))?;
            Ok(())
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| ImageError::Corrupt(format!("symlink {} has no target", show(&path))))?
                .into_owned();
            clear(&parent, name, false)?;
            // The target is stored as is: it is only ever resolved inside the mounted root.
            rustix::fs::symlinkat(OsStr::from_bytes(&target), &parent, name.as_os_str())
                .map_err(|e| ImageError::errno(what(), e))?;
            rustix::fs::chownat(
                &parent,
                name.as_os_str(),
                Some(uid(uid_v)),
                Some(gid(gid_v)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| ImageError::errno(what(), e))?;
            rustix::fs::utimensat(&parent, name.as_os_str(), &times(mtime), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| ImageError::errno(what(), e))?;
            Ok(())
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| ImageError::Corrupt(format!("hard link {} has no target", show(&path))))?
                .into_owned();
            let target = components(&target)?;
            let Some((tname, tparent)) = target.split_last() else {
                return Err(ImageError::Corrupt(format!("hard link {} points at the layer root", show(&path))));
            };
            let tparent = open_dir(root, tparent, false)?;
            clear(&parent, name, false)?;
            // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink, never what it names.
            rustix::fs::linkat(&tparent, tname.as_os_str(), &parent, name.as_os_str(), AtFlags::empty()).map_err(
                |e| match e {
                    Errno::NOENT | Errno::PERM | Errno::XDEV => ImageError::Corrupt(format!(
                        "hard link {} points at {}, which is not a file earlier in the same layer",
                        show(&path),
                        show(&target)
                    )),
                    e => ImageError::errno(what(), e),
                },
            )?;
            Ok(())
        }
        tar::EntryType::Fifo => {
            clear(&parent, name, false)?;
            rustix::fs::mknodat(
                &parent,
                name.as_os_str(),
                FileType::Fifo,
                Mode::from_raw_mode(strip_mode(mode)),
                Dev::default(),
            )
            .map_err(|e| ImageError::errno(what(), e))?;
            rustix::fs::chownat(
                &parent,
                name.as_os_str(),
                Some(uid(uid_v)),
                Some(gid(gid_v)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| ImageError::errno(what(), e))?;
            // After chown (which may clear mode bits), and past the umask mknod applied.
            rustix::fs::chmodat(&parent, name.as_os_str(), Mode::from_raw_mode(strip_mode(mode)), AtFlags::empty())
                .map_err(|e| ImageError::errno(what(), e))?;
            Ok(())
        }
        // Device nodes are skipped: a sandbox gets its own /dev, and a device file in a lower
        // layer is only a way to reach hardware.
        _ => Ok(()),
    }
}

/// Bytes read and written at once while copying a file.
const COPY_CHUNK: usize = 256 * 1024;
/// The unit of holes: a zero run this long (and aligned) is skipped rather than written.
const HOLE_BLOCK: usize = 4096;

enum Copy {
    Read(io::Error),
    Write(io::Error),
    Bound(ImageError),
}

/// Copies a file's content, each chunk counted against the bounds before it is written, and
/// every aligned block of zeros left a hole: a sparse file (declared by the tar format, or
/// zeros in a plain entry) takes no more disk than its data. The tar crate reads a GNU sparse
/// entry's holes back as zeros and keeps its map private, so zeros are what holes look like
/// here, as they do to `cp --sparse=always`.
fn copy_sparse(from: &mut impl Read, to: &mut File, meter: &mut Meter<'_>, buf: &mut [u8]) -> Result<(), Copy> {
    use std::io::{Seek, SeekFrom, Write};
    let mut len = 0u64;
    let mut ends_in_hole = false;
    loop {
        // Whole chunks keep blocks aligned with the file's offsets.
        let mut n = 0;
        while n < buf.len() {
            match from.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Copy::Read(e)),
            }
        }
        if n == 0 {
            break;
        }
        meter.add(n as u64).map_err(Copy::Bound)?;
        // Runs of data are written and runs of zero blocks skipped, each with one call.
        let mut flush = |from: usize, to_: usize, zero: bool| -> Result<(), Copy> {
            if zero {
                to.seek(SeekFrom::Current(i64::try_from(to_ - from).unwrap_or(i64::MAX))).map(drop).map_err(Copy::Write)
            } else {
                to.write_all(&buf[from..to_]).map_err(Copy::Write)
            }
        };
        let (mut run_start, mut run_zero) = (0, None);
        let mut at = 0;
        while at < n {
            let end = (at + HOLE_BLOCK).min(n);
            // Most data blocks end the test at their first byte; a whole one folds vectorized.
            let zero = buf[at] == 0 && buf[at..end].iter().fold(0u8, |acc, b| acc | b) == 0;
            if run_zero != Some(zero) {
                if let Some(z) = run_zero {
                    flush(run_start, at, z)?;
                }
                (run_start, run_zero) = (at, Some(zero));
            }
            at = end;
        }
        if let Some(z) = run_zero {
            flush(run_start, n, z)?;
            ends_in_hole = z;
        }
        len += n as u64;
    }
    if ends_in_hole {
        to.set_len(len).map_err(Copy::Write)?;
    }
    Ok(())
}
