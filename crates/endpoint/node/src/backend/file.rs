//! File and block-device backend: real I/O through a per-reactor io_uring,
//! with O_DIRECT where the filesystem or device accepts it.
//!
//! Durability: Flush is an fdatasync, FUA writes carry RWF_DSYNC, so a
//! completion for either is sent only once the data is on stable storage.
//! When io_uring is unavailable (seccomp, `kernel.io_uring_disabled`) the
//! queue falls back to synchronous pread/pwrite with the same semantics.

use super::{Backend, BackendQueue, IoReq, Op};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::Arc;
use trellis_nvme::status::{generic, media};
use trellis_nvme::Status;

pub struct FileBackend {
    file: Arc<File>,
    size_bytes: u64,
    path: String,
    direct: bool,
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

impl FileBackend {
    pub fn open(
        path: &str,
        create_size: Option<u64>,
        block_size: u32,
        read_only: bool,
        want_direct: bool,
    ) -> anyhow::Result<FileBackend> {
        use anyhow::Context;
        let exists = std::path::Path::new(path).exists();
        if !exists {
            let size = create_size.with_context(|| {
                format!("{path} does not exist and no size was given to create it")
            })?;
            let f = File::create(path).with_context(|| format!("creating {path}"))?;
            f.set_len(size)?;
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!read_only);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let mut direct = want_direct;
        let file = match open(direct) {
            Ok(f) if direct && !direct_io_works(&f, block_size) => {
                direct = false;
                open(false)?
            }
            Ok(f) => f,
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                open(false)?
            }
            Err(e) => return Err(e).with_context(|| format!("opening {path}")),
        };
        let meta = file.metadata()?;
        let size_bytes = if meta.file_type().is_block_device() {
            let mut sz: u64 = 0;
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut sz) };
            anyhow::ensure!(
                rc == 0,
                "BLKGETSIZE64 on {path}: {}",
                std::io::Error::last_os_error()
            );
            sz
        } else {
            meta.len()
        };
        let size_bytes = size_bytes / block_size as u64 * block_size as u64;
        anyhow::ensure!(size_bytes > 0, "{path} is smaller than one block");
        Ok(FileBackend {
            file: Arc::new(file),
            size_bytes,
            path: path.into(),
            direct,
        })
    }
}

/// O_DIRECT needs offsets and lengths aligned to the device's logical block;
/// probe with one block-sized read at an odd block offset.
fn direct_io_works(f: &File, block_size: u32) -> bool {
    let layout = std::alloc::Layout::from_size_align(block_size as usize, 4096).unwrap();
    unsafe {
        let p = std::alloc::alloc(layout);
        let rc = libc::pread(
            f.as_raw_fd(),
            p as *mut _,
            block_size as usize,
            block_size as i64,
        );
        std::alloc::dealloc(p, layout);
        rc >= 0
    }
}

impl Backend for FileBackend {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        match UringQueue::new(self.file.clone(), 256) {
            Ok(q) => Ok(Box::new(q)),
            Err(e) => {
                tracing::warn!(
                    "io_uring unavailable ({e}); {} uses synchronous I/O",
                    self.path
                );
                Ok(Box::new(SyncQueue {
                    file: self.file.clone(),
                }))
            }
        }
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.file.sync_all()
    }
    fn describe(&self) -> String {
        format!(
            "file {} ({} bytes{})",
            self.path,
            self.size_bytes,
            if self.direct { ", O_DIRECT" } else { "" }
        )
    }
}

/// Write Zeroes and Deallocate are rare and not latency critical: both are
/// done synchronously with fallocate, falling back to writing zeroes.
fn zero_range(file: &File, off: u64, len: u64, punch: bool, fua: bool) -> Status {
    let s = zero_range_inner(file, off, len, punch);
    if s.is_success() && fua && unsafe { libc::fdatasync(file.as_raw_fd()) } != 0 {
        return media::WRITE_FAULT;
    }
    s
}

fn zero_range_inner(file: &File, off: u64, len: u64, punch: bool) -> Status {
    let fd = file.as_raw_fd();
    let mode = if punch {
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
    } else {
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
    };
    if unsafe { libc::fallocate(fd, mode, off as i64, len as i64) } == 0 {
        return Status::SUCCESS;
    }
    // Not supported here (some filesystems, some devices): write zeroes.
    const CHUNK: usize = 1 << 20;
    let layout = std::alloc::Layout::from_size_align(CHUNK, 4096).unwrap();
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    let mut done = 0u64;
    let mut status = Status::SUCCESS;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        let rc = unsafe { libc::pwrite(fd, buf as *const _, n, (off + done) as i64) };
        if rc <= 0 {
            status = media::WRITE_FAULT;
            break;
        }
        done += rc as u64;
    }
    unsafe { std::alloc::dealloc(buf, layout) };
    status
}

/// Write Zeroes and Deallocate, done synchronously by both queue kinds;
/// `None` for every other operation.
fn zero_or_discard(file: &File, req: &IoReq) -> Option<Status> {
    match req.op {
        Op::WriteZeroes => Some(zero_range(
            file,
            req.offset_bytes,
            req.len_bytes,
            false,
            req.fua,
        )),
        Op::Discard => Some(zero_range(
            file,
            req.offset_bytes,
            req.len_bytes,
            true,
            req.fua,
        )),
        _ => None,
    }
}

fn io_error_status(op: Op) -> Status {
    match op {
        Op::Read => media::UNRECOVERED_READ_ERROR,
        Op::Write | Op::WriteZeroes => media::WRITE_FAULT,
        Op::Flush | Op::Discard => generic::INTERNAL_ERROR,
    }
}

/// Synchronous fallback queue.
struct SyncQueue {
    file: Arc<File>,
}

impl BackendQueue for SyncQueue {
    unsafe fn submit(&mut self, req: &IoReq, _tag: u64) -> Option<Status> {
        let fd = self.file.as_raw_fd();
        let mut done = 0u64;
        let ok = match req.op {
            Op::Read | Op::Write => {
                while done < req.len_bytes {
                    let p = req.buf.add(done as usize);
                    let n = (req.len_bytes - done) as usize;
                    let off = (req.offset_bytes + done) as i64;
                    let rc = if req.op == Op::Read {
                        libc::pread(fd, p as *mut _, n, off)
                    } else {
                        let iov = libc::iovec {
                            iov_base: p as *mut _,
                            iov_len: n,
                        };
                        libc::pwritev2(fd, &iov, 1, off, if req.fua { libc::RWF_DSYNC } else { 0 })
                    };
                    if rc <= 0 {
                        break;
                    }
                    done += rc as u64;
                }
                done == req.len_bytes
            }
            Op::Flush => libc::fdatasync(fd) == 0,
            Op::WriteZeroes | Op::Discard => return zero_or_discard(&self.file, req),
        };
        Some(if ok {
            Status::SUCCESS
        } else {
            io_error_status(req.op)
        })
    }
}

/// One in-flight io_uring request; partial transfers are resubmitted.
#[derive(Clone, Copy)]
struct Pending {
    tag: u64,
    req: IoReq,
    done_bytes: u64,
}

struct UringQueue {
    file: Arc<File>,
    ring: io_uring::IoUring,
    slots: Vec<Option<Pending>>,
    free: Vec<u32>,
    unsubmitted: usize,
    /// Reused between reaps so the hot path does not allocate.
    scratch: Vec<(u32, i32)>,
}

impl UringQueue {
    fn new(file: Arc<File>, entries: u32) -> std::io::Result<UringQueue> {
        let ring = io_uring::IoUring::builder()
            .setup_single_issuer()
            .build(entries)?;
        let n = entries as usize * 2;
        Ok(UringQueue {
            file,
            ring,
            slots: vec![None; n],
            free: (0..n as u32).rev().collect(),
            unsubmitted: 0,
            scratch: Vec::with_capacity(n),
        })
    }

    fn push(&mut self, idx: u32) {
        use io_uring::{opcode, types};
        let p = self.slots[idx as usize].expect("pending slot");
        let fd = types::Fd(self.file.as_raw_fd());
        let r = p.req;
        let rest = (r.len_bytes - p.done_bytes) as u32;
        let off = r.offset_bytes + p.done_bytes;
        let buf = unsafe { r.buf.add(p.done_bytes as usize) };
        let e = match r.op {
            Op::Read => opcode::Read::new(fd, buf, rest).offset(off).build(),
            Op::Write => opcode::Write::new(fd, buf, rest)
                .offset(off)
                .rw_flags(if r.fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            Op::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::WriteZeroes | Op::Discard => unreachable!("done synchronously"),
        };
        let e = e.user_data(idx as u64);
        // The ring has as many entries as we allow in flight, but a full SQ
        // can still happen between kicks: submit and retry once.
        unsafe {
            if self.ring.submission().push(&e).is_err() {
                let _ = self.ring.submit();
                self.unsubmitted = 0;
                self.ring
                    .submission()
                    .push(&e)
                    .expect("SQ has room after submit");
            }
        }
        self.unsubmitted += 1;
    }
}

impl BackendQueue for UringQueue {
    unsafe fn submit(&mut self, req: &IoReq, tag: u64) -> Option<Status> {
        if let Some(st) = zero_or_discard(&self.file, req) {
            return Some(st);
        }
        let Some(idx) = self.free.pop() else {
            // More requests than slots: the reactor bounds queue depth, so
            // this means a bug elsewhere; fail the command rather than block.
            return Some(generic::INTERNAL_ERROR);
        };
        self.slots[idx as usize] = Some(Pending {
            tag,
            req: *req,
            done_bytes: 0,
        });
        self.push(idx);
        None
    }

    fn kick(&mut self) {
        if self.unsubmitted > 0 {
            let _ = self.ring.submit();
            self.unsubmitted = 0;
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, Status)>) -> usize {
        let mut n = 0;
        let mut again = std::mem::take(&mut self.scratch);
        again.clear();
        {
            let cq = self.ring.completion();
            for c in cq {
                again.push((c.user_data() as u32, c.result()));
            }
        }
        for &(idx, res) in &again {
            let slot = &mut self.slots[idx as usize];
            let mut p = slot.expect("completion for a live slot");
            let status = if res < 0 {
                tracing::warn!(
                    "{:?} at {} failed: {}",
                    p.req.op,
                    p.req.offset_bytes,
                    std::io::Error::from_raw_os_error(-res)
                );
                Some(io_error_status(p.req.op))
            } else if p.req.op == Op::Flush {
                Some(Status::SUCCESS)
            } else if res == 0 {
                Some(io_error_status(p.req.op)) // EOF inside the namespace
            } else {
                p.done_bytes += res as u64;
                if p.done_bytes < p.req.len_bytes {
                    *slot = Some(p);
                    self.push(idx);
                    None
                } else {
                    Some(Status::SUCCESS)
                }
            };
            if let Some(s) = status {
                self.slots[idx as usize] = None;
                self.free.push(idx);
                out.push((p.tag, s));
                n += 1;
            }
        }
        self.scratch = again;
        n
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}
