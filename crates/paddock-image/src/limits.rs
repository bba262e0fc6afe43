//! Bounds on what unpacking an image may write. A layer is untrusted input (whoever may create
//! a sandbox names the registry), and a few hundred compressed bytes can declare terabytes: a
//! GNU sparse entry declares its size, and a stream of zeros compresses a thousandfold.

use std::cell::Cell;
use std::io::{self, Read};
use std::path::Path;
use std::rc::Rc;

use crate::error::{ImageError, Result};

/// What one layer, one image and the whole store may unpack to, and the space that must stay
/// free on the store's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes one layer may unpack to, holes of sparse files included.
    pub layer_bytes: u64,
    /// Bytes all layers of one image may unpack to, holes included.
    pub image_bytes: u64,
    /// Entries (files, directories, links, whiteouts) of one layer.
    pub layer_entries: u64,
    /// How many times its compressed size a layer may unpack to, past its first
    /// [`RATIO_FLOOR`] bytes (real layers stay under 20; zeros compress a thousandfold).
    pub ratio: u64,
    /// What all stored layers together may unpack to; `None`: no bound but `min_free`.
    pub store_bytes: Option<u64>,
    /// Bytes that must stay free on the store's filesystem while a layer unpacks.
    pub min_free: u64,
}

/// Bytes a layer may unpack to before the compression ratio is checked: a small layer of
/// repetitive text is no bomb.
pub const RATIO_FLOOR: u64 = 64 << 20;
/// Inodes that must stay free on the store's filesystem, beside `min_free` bytes.
pub const MIN_FREE_INODES: u64 = 10_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            layer_bytes: 16 << 30,
            image_bytes: 32 << 30,
            layer_entries: 1_000_000,
            ratio: 100,
            store_bytes: None,
            min_free: 1 << 30,
        }
    }
}

fn gib(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}

/// Counts the compressed bytes a layer's decompressor has read.
pub(crate) struct Counted<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Counted<R> {
    pub fn new(inner: R) -> (Self, Rc<Cell<u64>>) {
        let count = Rc::new(Cell::new(0));
        (Counted { inner, count: count.clone() }, count)
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// What one layer's unpacking has used so far, checked before each write.
pub(crate) struct Meter<'a> {
    limits: &'a Limits,
    /// The filesystem whose free space is watched.
    store: &'a Path,
    /// Bytes of the image's layers before this one, and of the whole store.
    image_before: u64,
    store_before: u64,
    compressed: Rc<Cell<u64>>,
    pub written: u64,
    entries: u64,
    checked_at: u64,
}

/// How often (in bytes written) the store's free space is looked at again.
const FREE_CHECK_EVERY: u64 = 8 << 20;

impl<'a> Meter<'a> {
    pub fn new(
        limits: &'a Limits,
        store: &'a Path,
        image_before: u64,
        store_before: u64,
        compressed: Rc<Cell<u64>>,
    ) -> Result<Self> {
        let meter =
            Meter { limits, store, image_before, store_before, compressed, written: 0, entries: 0, checked_at: 0 };
        meter.check_free()?;
        Ok(meter)
    }

    /// One more entry of the layer.
    pub fn entry(&mut self) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.layer_entries {
            return Err(ImageError::TooLarge(format!(
                "a layer has more than {} entries, the limit of one layer (--image-max-entries)",
                self.limits.layer_entries
            )));
        }
        if self.entries.is_multiple_of(4096) { self.check_free() } else { Ok(()) }
    }

    /// `n` more bytes of file content (a hole counts as what it reads back as), before they are
    /// written.
    pub fn add(&mut self, n: u64) -> Result<()> {
        self.written += n;
        let l = self.limits;
        if self.written > l.layer_bytes {
            return Err(ImageError::TooLarge(format!(
                "a layer unpacks to more than {} (holes of sparse files included), the limit of one layer (--image-max-layer)",
                gib(l.layer_bytes)
            )));
        }
        if self.image_before + self.written > l.image_bytes {
            return Err(ImageError::TooLarge(format!(
                "the image unpacks to more than {} (holes of sparse files included), the limit of one image (--image-max)",
                gib(l.image_bytes)
            )));
        }
        if let Some(max) = l.store_bytes
            && self.store_before + self.written > max
        {
            return Err(ImageError::TooLarge(format!(
                "the image store would hold more than {}, its limit (--image-store-max): remove images (`paddock image prune`) or raise it",
                gib(max)
            )));
        }
        let compressed = self.compressed.get().max(1);
        if self.written > RATIO_FLOOR && self.written / compressed > l.ratio {
            return Err(ImageError::TooLarge(format!(
                "a layer of {compressed} compressed bytes unpacks to more than {} ({}x), past the limit of {}x its compressed size (--image-max-ratio): a decompression bomb",
                gib(self.written),
                self.written / compressed,
                l.ratio
            )));
        }
        if self.written - self.checked_at >= FREE_CHECK_EVERY {
            self.checked_at = self.written;
            self.check_free()?;
        }
        Ok(())
    }

    fn check_free(&self) -> Result<()> {
        let s = rustix::fs::statvfs(self.store)
            .map_err(|e| ImageError::errno(format!("reading the free space of {}", self.store.display()), e))?;
        let free = s.f_bavail.saturating_mul(s.f_frsize);
        if free < self.limits.min_free {
            return Err(ImageError::NoSpace(format!(
                "only {} is free on the filesystem of {}, under the floor of {} the image store keeps (--min-free)",
                gib(free),
                self.store.display(),
                gib(self.limits.min_free)
            )));
        }
        // A filesystem without inode counts (btrfs, some overlays) reports zero of them.
        if s.f_files > 0 && s.f_favail < MIN_FREE_INODES {
            return Err(ImageError::NoSpace(format!(
                "only {} inodes are free on the filesystem of {}, under the {MIN_FREE_INODES} the image store keeps",
                s.f_favail,
                self.store.display()
            )));
        }
        Ok(())
    }
}
