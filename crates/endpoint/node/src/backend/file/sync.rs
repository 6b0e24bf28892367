//! The queue without io_uring: reads and writes done synchronously, zero
//! and deallocate pieces on a worker thread.

use super::*;

/// Synchronous fallback queue. Reads, writes and flushes run inline, as
/// before io_uring; Write Zeroes and Deallocate pieces go to a zero worker
/// thread (started at the first), so fallocate's time, and a fill's, is
/// never the reactor's.
pub(super) struct SyncQueue {
    pub(super) file: Arc<File>,
    pub(super) zero: Arc<ZeroSupport>,
    pub(super) worker: Option<ZeroWorker>,
}

/// The thread one [`SyncQueue`] hands zeroing pieces to. Its channels hold
/// at most `ZERO_CHUNKS_IN_FLIGHT_MAX` pieces, the most the chunking queue
/// above may send at once; it exits when the queue drops its sender.
pub(super) struct ZeroWorker {
    pub(super) tx: std::sync::mpsc::SyncSender<Piece>,
    pub(super) rx: std::sync::mpsc::Receiver<Completion>,
    pub(super) in_flight: usize,
}

/// IoReq holds a raw pointer; the pieces sent to the worker carry none
/// (Write Zeroes and Discard have no buffer).
pub(super) struct Piece(Tag, IoReq);
// SAFETY: a zeroing piece's buf is null; nothing is shared through it.
unsafe impl Send for Piece {}

impl ZeroWorker {
    pub(super) fn start(file: Arc<File>, zero: Arc<ZeroSupport>) -> std::io::Result<ZeroWorker> {
        let n = crate::config::ZERO_CHUNKS_IN_FLIGHT_MAX;
        let (tx, work) = std::sync::mpsc::sync_channel::<Piece>(n);
        let (done_tx, rx) = std::sync::mpsc::sync_channel(n);
        std::thread::Builder::new()
            .name("trellis-zero".into())
            .spawn(move || {
                while let Ok(Piece(tag, req)) = work.recv() {
                    if done_tx
                        .send(Completion::new(tag, zero_piece(&file, &zero, &req)))
                        .is_err()
                    {
                        return;
                    }
                }
            })?;
        Ok(ZeroWorker {
            tx,
            rx,
            in_flight: 0,
        })
    }
}

impl SyncQueue {
    pub(super) fn new(file: Arc<File>, zero: Arc<ZeroSupport>) -> SyncQueue {
        SyncQueue {
            file,
            zero,
            worker: None,
        }
    }

    /// Hands a zeroing piece to the worker; Some(status) if it cannot.
    pub(super) fn zero_to_worker(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        if self.worker.is_none() {
            match ZeroWorker::start(self.file.clone(), self.zero.clone()) {
                Ok(w) => self.worker = Some(w),
                Err(e) => {
                    tracing::error!("cannot start a zero worker thread: {e}");
                    return Some(crate::backend::SUBMIT_FAILED);
                }
            }
        }
        let w = self.worker.as_mut()?;
        match w.tx.try_send(Piece(tag, *req)) {
            Ok(()) => {
                w.in_flight += 1;
                None
            }
            // More pieces than the chunking queue sends at once: a bug
            // elsewhere; fail the piece rather than block the reactor.
            Err(_) => Some(crate::backend::SUBMIT_FAILED),
        }
    }
}

impl BackendQueue for SyncQueue {
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let Some(w) = self.worker.as_mut() else {
            return 0;
        };
        let before = out.len();
        while let Ok(done) = w.rx.try_recv() {
            w.in_flight = w.in_flight.saturating_sub(1);
            out.push(done);
        }
        out.len() - before
    }

    fn in_flight(&self) -> usize {
        self.worker.as_ref().map_or(0, |w| w.in_flight)
    }

    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        if matches!(req.op, Op::WriteZeroes | Op::Discard) {
            return self.zero_to_worker(req, tag);
        }
        let fd = self.file.as_raw_fd();
        let mut done = 0u64;
        let mut errno = None;
        // SAFETY (the calls below): by this function's contract req.buf is
        // valid for len_bytes bytes and ours alone during the call; pread and
        // pwritev2 are synchronous and stay within [buf + done, buf + len).
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
                        errno = (rc < 0)
                            .then(|| std::io::Error::last_os_error().raw_os_error())
                            .flatten();
                        break;
                    }
                    done += rc as u64;
                }
                done == req.len_bytes
            }
            Op::Flush => {
                let ok = libc::fdatasync(fd) == 0;
                if !ok {
                    errno = std::io::Error::last_os_error().raw_os_error();
                }
                ok
            }
            Op::WriteZeroes | Op::Discard => return Some(generic::INTERNAL_ERROR), // above
        };
        Some(if ok {
            Status::SUCCESS
        } else {
            io_error_status(req.op, errno)
        })
    }
}
