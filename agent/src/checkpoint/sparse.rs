//! Sparse files in checkpoint archives: where a file's data lies ([`data_regions`], from
//! `SEEK_DATA`/`SEEK_HOLE`, never reading a hole), the GNU sparse entry that carries only
//! that data ([`header`] and [`Regions`]), and a writer that leaves holes where zeros
//! were ([`write_sparse`]).
//!
//! The format is GNU tar's "old GNU" sparse format (entry type `S`), which GNU tar and
//! the `tar` crate read: the header's size is the data's, its `realsize` the file's; the
//! first four regions sit in the header, the rest in 512-byte extension headers that
//! precede the data. A file that ends in a hole ends its list with an empty region at the
//! file's size.
//!
//! Invariants: the regions are sorted, do not overlap, lie inside the file, and every
//! region but the last has a length that is a multiple of 512 bytes (the reader insists);
//! at most [`MAX_REGIONS`] of them (holes shorter than [`MIN_HOLE`] are read as zeros),
//! so what a file's layout costs is bounded by its apparent size, which the caller has
//! already checked against the cap; [`Regions`] yields exactly the sum of the regions'
//! lengths whatever the job does to the file meanwhile (short reads are padded with
//! zeros).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

/// Tar's block.
const BLOCK: u64 = 512;
/// Holes shorter than this are archived as zeros: they save little, and each region
/// costs 24 bytes of header.
pub const MIN_HOLE: u64 = 64 * 1024;
/// The most regions one file's entry lists (about 1 MiB of headers).
pub const MAX_REGIONS: usize = 40_000;
/// Regions in the main header (each extension header holds 21 more).
const IN_HEADER: usize = 4;

/// A run of data: (offset, length).
pub type Region = (u64, u64);

fn lseek(f: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let offset = i64::try_from(offset).map_err(io::Error::other)?;
    // SAFETY: lseek on a descriptor we own; it moves only that descriptor's offset,
    // which `data_regions` puts back at the start before it returns.
    let at = unsafe { libc::lseek64(f.as_raw_fd(), offset, whence) };
    if at >= 0 {
        return Ok(Some(at as u64));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // No data (or hole) at or after `offset`.
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// Where the first `len` bytes of `f` hold data, without reading any of it. A file
/// system that cannot tell holes (`EINVAL`) gives one region, the whole file. The file's
/// offset is back at its start afterwards.
pub fn data_regions(f: &File, len: u64) -> io::Result<Vec<Region>> {
    let found = find_regions(f, len);
    lseek(f, 0, libc::SEEK_SET)?;
    found
}

fn find_regions(f: &File, len: u64) -> io::Result<Vec<Region>> {
    let whole = || vec![(0, len)];
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut raw: Vec<Region> = Vec::new();
    let mut pos = 0;
    while pos < len {
        let data = match lseek(f, pos, libc::SEEK_DATA) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(whole()),
            Err(e) => return Err(e),
        };
        if data >= len {
            break;
        }
        let hole = lseek(f, data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        if hole <= data {
            // The job changed the file under us: read it whole (bounded by `len`).
            return Ok(whole());
        }
        // Aligned to tar's blocks: only the region at the file's end may end unaligned.
        let start = data / BLOCK * BLOCK;
        let end = hole.div_ceil(BLOCK).saturating_mul(BLOCK).min(len);
        match raw.last_mut() {
            Some(last) if start <= last.0 + last.1 + MIN_HOLE => {
                last.1 = end.max(last.0 + last.1) - last.0;
            }
            _ => raw.push((start, end - start)),
        }
        if raw.len() > MAX_REGIONS {
            return Ok(whole());
        }
        pos = hole;
    }
    Ok(raw)
}

/// Whether `regions` cover the whole of a `len`-byte file (nothing to gain from a sparse
/// entry).
pub fn is_dense(regions: &[Region], len: u64) -> bool {
    matches!(regions, [(0, l)] if *l == len)
}

/// The data's length: what the entry's header gives as its size.
pub fn data_len(regions: &[Region]) -> u64 {
    regions.iter().map(|r| r.1).sum()
}

/// Makes `h` a GNU sparse entry of a `len`-byte file with these regions; returns the
/// extension headers that must precede the data (see the module's docs).
pub fn header(h: &mut tar::Header, len: u64, regions: &[Region]) -> io::Result<Vec<u8>> {
    // A file that ends in a hole (or is all hole) ends its list with an empty region.
    let mut list: Vec<Region> = regions.to_vec();
    if list.last().is_none_or(|(o, l)| o + l < len) {
        list.push((len, 0));
    }
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(data_len(regions));
    let gnu = h
        .as_gnu_mut()
        .ok_or_else(|| io::Error::other("a sparse entry needs a GNU header"))?;
    gnu.set_real_size(len);
    for (slot, (o, l)) in gnu.sparse.iter_mut().zip(&list) {
        slot.set_offset(*o);
        slot.set_length(*l);
    }
    gnu.set_is_extended(list.len() > IN_HEADER);
    let mut ext = Vec::new();
    let mut rest = list.iter().skip(IN_HEADER).peekable();
    while rest.peek().is_some() {
        let mut block = tar::GnuExtSparseHeader::new();
        for slot in block.sparse.iter_mut() {
            let Some((o, l)) = rest.next() else { break };
            slot.set_offset(*o);
            slot.set_length(*l);
        }
        block.set_is_extended(rest.peek().is_some());
        ext.extend_from_slice(block.as_bytes());
    }
    Ok(ext)
}

/// Reads the regions' data in order, each exactly as long as listed: a file that shrank
/// meanwhile gives zeros, one that grew is cut.
pub struct Regions {
    file: File,
    regions: std::vec::IntoIter<Region>,
    at: u64,
    left: u64,
}

impl Regions {
    pub fn new(file: File, regions: Vec<Region>) -> Self {
        Self {
            file,
            regions: regions.into_iter(),
            at: 0,
            left: 0,
        }
    }
}

impl Read for Regions {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.left == 0 {
            match self.regions.next() {
                Some((o, l)) => (self.at, self.left) = (o, l),
                None => return Ok(0),
            }
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let mut n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.at += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Copies `src` into the empty file `f`, leaving a hole wherever a whole chunk of it is
/// zeros (so a sparse file comes back sparse, and zeros cost no disk). Returns the bytes
/// copied; `f` ends up exactly that long.
pub fn write_sparse(src: &mut dyn Read, f: &File) -> io::Result<u64> {
    const CHUNK: usize = 64 * 1024;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    loop {
        let mut n = 0;
        while n < CHUNK {
            match src.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            f.write_all_at(&buf[..n], at)?;
        }
        at += n as u64;
    }
    f.set_len(at)?;
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn holes_are_found_without_reading_and_data_regions_are_aligned() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(b"head").unwrap();
        f.write_all_at(b"middle", 10 << 20).unwrap();
        f.set_len(100 << 20).unwrap();
        let f = File::open(&p).unwrap();
        let r = data_regions(&f, 100 << 20).unwrap();
        if r.len() == 1 && is_dense(&r, 100 << 20) {
            // A file system without holes (tmpfs has them; some overlays do not).
            return;
        }
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].0, 0);
        assert!(
            r[1].0 <= 10 << 20 && r[1].0 + r[1].1 >= (10 << 20) + 6,
            "{r:?}"
        );
        assert!(r.iter().all(|(o, l)| o % BLOCK == 0 && l % BLOCK == 0));
        let ext = {
            let mut h = tar::Header::new_gnu();
            header(&mut h, 100 << 20, &r).unwrap()
        };
        assert!(ext.is_empty(), "three regions fit in the header");
    }

    #[test]
    fn zeros_become_holes_and_the_length_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        let f = File::create(&p).unwrap();
        let mut data = vec![0u8; 4 << 20];
        data[5] = 1;
        let mut src: &[u8] = &data;
        assert_eq!(write_sparse(&mut src, &f).unwrap(), 4 << 20);
        assert_eq!(std::fs::read(&p).unwrap(), data);
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&p).unwrap().blocks();
        assert!(blocks * 512 < 1 << 20, "{blocks} blocks for 64 KiB of data");
    }
}
