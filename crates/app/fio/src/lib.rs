//! A fio ioengine on the Trellis host library, like SPDK's fio plugin: fio job
//! files run over Trellis's user-space NVMe/TCP initiator instead of the
//! kernel's.
//!
//! Two halves (docs/fio.md):
//! - this crate: [`Device`], one controller and one I/O queue pair, and a C
//!   ABI over it (`trellis_fio_*`, declared in `c/trellis_fio.h`);
//! - `c/engine.c`: fio's `struct ioengine_ops`, built against the headers of
//!   the fio that will load it (an external engine must match its fio's
//!   structure layouts) and linked with this crate's static library by
//!   `scripts/build-fio-engine.sh`.
//!
//! One [`Device`] per fio file per job: fio runs each job in its own thread
//! or process, and a queue pair belongs to the thread that polls it. Nothing
//! is allocated per I/O: reads land in the queue's slot buffer and are copied
//! to fio's buffer at completion, writes are copied into it at submission
//! (the host library's buffers are registered per slot, as SPDK's are).

// No unwrap/expect outside tests: a peer or a caller must never panic fio.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod ffi;
mod spec;

pub use spec::Spec;

use std::time::{Duration, Instant};
use trellis_host::engine::{rw_sqe, Xfer};
use trellis_host::{Controller, Queue};
use trellis_nvme::sqe::{io, Sqe};

/// Largest queue depth a fio job may ask for: the host library's slot table.
pub const MAX_DEPTH: u32 = trellis_host::engine::MAX_QUEUE_SIZE as u32;
/// Largest transfer per command (fio's `bs`): the target's MDTS may be smaller
/// and is checked at open; this bounds the slot buffers (depth × this).
pub const MAX_TRANSFER_BYTES: u32 = 8 << 20;
/// `commit` sends when a 1/this share of the queue depth waits unsent.
pub const COMMIT_BATCH_DIV: u32 = 4;
/// How often the reap loop lets the controller send a Keep Alive (it sends one
/// only when KATO/2 has passed).
const KEEP_ALIVE_CHECK: Duration = Duration::from_millis(100);

/// What fio asks of one I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    /// fio's `fsync`/`fdatasync`: an NVMe Flush.
    Flush,
}

/// One command's owner, by slot: fio's cookie (its `io_u`) and, for a read,
/// where its data goes.
#[derive(Clone, Copy)]
struct Row {
    cookie: u64,
    read_dst: *mut u8,
    len: usize,
}

const NO_ROW: Row = Row {
    cookie: 0,
    read_dst: std::ptr::null_mut(),
    len: 0,
};

/// A finished I/O: fio's cookie and 0, or the NVMe status (SCT << 8 | SC) as
/// a positive number, or a negative errno when the connection failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    pub cookie: u64,
    pub result: i32,
}

/// One namespace over one controller connection and one I/O queue.
pub struct Device {
    ctrl: Controller,
    q: Queue,
    nsid: u32,
    block_bytes: u32,
    size_bytes: u64,
    max_transfer_bytes: u32,
    rows: Vec<Row>,
    inflight: u32,
    /// Submitted since the last send (they are in `inflight` too).
    unsent: u32,
    /// `commit` sends once this many wait (depth / COMMIT_BATCH_DIV, at least 1).
    commit_batch: u32,
    last_keep_alive_check: Instant,
}

/// Why an I/O was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// Every slot is in flight: reap first (fio's FIO_Q_BUSY).
    Busy,
    /// The I/O itself is wrong (alignment, range, size): errno EINVAL.
    Invalid(String),
    /// The queue pair failed: errno EIO.
    Failed(String),
}

impl Device {
    /// Connects to `spec`'s controller, identifies the namespace and opens one
    /// I/O queue of `depth` commands whose transfers reach `max_transfer_bytes`.
    pub fn open(spec: &Spec, depth: u32, max_transfer_bytes: u32) -> Result<Device, String> {
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(format!(
                "iodepth {depth} out of range: use 1 to {MAX_DEPTH}"
            ));
        }
        if !(1..=MAX_TRANSFER_BYTES).contains(&max_transfer_bytes) {
            return Err(format!(
                "block size {max_transfer_bytes} out of range: use at most {MAX_TRANSFER_BYTES} bytes"
            ));
        }
        let cfg = spec.host_config();
        let mut ctrl = Controller::connect(&spec.addr, &spec.subnqn, &cfg)
            .map_err(|e| format!("connect to {} ({}): {e}", spec.addr, spec.subnqn))?;
        if let Some(mdts) = ctrl
            .id
            .max_transfer_bytes()
            .filter(|&m| max_transfer_bytes as u64 > m)
        {
            return Err(format!(
                "block size {max_transfer_bytes} exceeds the controller's largest transfer ({mdts} bytes): lower bs"
            ));
        }
        let ns = ctrl
            .identify_ns(spec.nsid)
            .map_err(|e| format!("identify namespace {}: {e}", spec.nsid))?;
        let block_bytes = ns.block_size();
        ctrl.set_num_queues(1)
            .map_err(|e| format!("set number of queues: {e}"))?;
        let q = ctrl
            .connect_io_queue(depth as u16, max_transfer_bytes as usize)
            .map_err(|e| format!("connect an I/O queue: {e}"))?;
        let granted = q.engine().queue_size() as u32;
        if granted < depth {
            return Err(format!(
                "iodepth {depth} needs {depth} commands on one queue, but the target allows {granted}: use iodepth={granted} or less"
            ));
        }
        Ok(Device {
            ctrl,
            rows: vec![NO_ROW; granted as usize],
            q,
            nsid: spec.nsid,
            block_bytes,
            size_bytes: ns.nsze * block_bytes as u64,
            max_transfer_bytes,
            inflight: 0,
            unsent: 0,
            commit_batch: (granted / COMMIT_BATCH_DIV).max(1),
            last_keep_alive_check: Instant::now(),
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Queues one I/O (sent at the next [`Device::send`] or poll).
    ///
    /// # Safety
    /// For Read and Write, `buf` must be valid for `len` bytes (reads: for
    /// writing) until this I/O's [`Done`] is returned by [`Device::reap`].
    pub unsafe fn submit(
        &mut self,
        kind: IoKind,
        offset: u64,
        len: u64,
        buf: *mut u8,
        cookie: u64,
    ) -> Result<(), SubmitError> {
        let (sqe, xfer, len) = self.command(kind, offset, len)?;
        let Some(slot) = self.q.alloc() else {
            return Err(SubmitError::Busy);
        };
        if kind == IoKind::Write {
            // SAFETY: the caller promised `buf` is valid for `len` bytes; the
            // slot buffer holds max_transfer_bytes ≥ len (checked in command).
            let src = unsafe { std::slice::from_raw_parts(buf, len) };
            self.q.buf_mut(slot)[..len].copy_from_slice(src);
        }
        if let Err(e) = self.q.submit(slot, sqe, xfer, Instant::now()) {
            self.q.free(slot);
            return Err(SubmitError::Failed(e.to_string()));
        }
        self.rows[slot as usize] = Row {
            cookie,
            read_dst: if kind == IoKind::Read {
                buf
            } else {
                std::ptr::null_mut()
            },
            len,
        };
        self.inflight += 1;
        self.unsent += 1;
        Ok(())
    }

    /// The SQE and transfer of one I/O, after checking it against the namespace.
    fn command(
        &self,
        kind: IoKind,
        offset: u64,
        len: u64,
    ) -> Result<(Sqe, Xfer, usize), SubmitError> {
        if kind == IoKind::Flush {
            return Ok((Sqe::new(io::FLUSH, 0, self.nsid), Xfer::None, 0));
        }
        let b = self.block_bytes as u64;
        let bad = |why: String| Err(SubmitError::Invalid(why));
        if len == 0 || !len.is_multiple_of(b) || !offset.is_multiple_of(b) {
            return bad(format!(
                "{len} bytes at offset {offset}: I/O must be whole {b}-byte blocks"
            ));
        }
        if len > self.max_transfer_bytes as u64 {
            return bad(format!(
                "{len} bytes exceeds the queue's largest transfer {}",
                self.max_transfer_bytes
            ));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.size_bytes)
        {
            return bad(format!(
                "{len} bytes at offset {offset} runs past the namespace's {} bytes",
                self.size_bytes
            ));
        }
        let (opc, xfer) = match kind {
            IoKind::Read => (io::READ, Xfer::FromCtrl(len as u32)),
            _ => (io::WRITE, Xfer::ToCtrl(len as u32)),
        };
        let sqe = rw_sqe(opc, self.nsid, offset / b, (len / b) as u32);
        Ok((sqe, xfer, len as usize))
    }

    /// Sends what is queued now.
    pub fn send(&mut self) -> Result<(), String> {
        self.unsent = 0;
        self.q.flush().map(|_| ()).map_err(|e| e.to_string())
    }

    /// fio's `commit`, which fio calls after every queued I/O by default
    /// (`iodepth_batch=1`). Sends at once when nothing else of ours is on the
    /// wire (QD1, or the first I/O after idle: waiting would only add
    /// latency) or when [`COMMIT_BATCH_DIV`] of the depth is waiting;
    /// otherwise leaves the commands for the next reap's poll, which sends
    /// everything waiting in one `sendmsg` before it receives. fio reaps
    /// whenever its queue is full and quiesces before any sleep (rate limits,
    /// think time), so nothing waits behind an idle job. One `sendmsg` per
    /// I/O cost 5.7× the IOPS of `trellis bench` at 4 KiB QD32 (docs/fio.md).
    pub fn commit(&mut self) -> Result<(), String> {
        let wire_idle = self.inflight == self.unsent;
        if self.unsent > 0 && (wire_idle || self.unsent >= self.commit_batch) {
            return self.send();
        }
        Ok(())
    }

    /// Polls the queue once and appends at most `max` finished I/Os to `out`;
    /// any others wait for the next call. `out` should have room for `max`
    /// (then nothing is allocated).
    pub fn reap(&mut self, out: &mut Vec<Done>, max: usize) -> Result<usize, String> {
        let before = out.len();
        if self.last_keep_alive_check.elapsed() >= KEEP_ALIVE_CHECK {
            self.last_keep_alive_check = Instant::now();
            self.ctrl.tick().map_err(|e| format!("keep alive: {e}"))?;
        }
        // The poll sends everything queued before it receives.
        self.unsent = 0;
        self.q.poll(Instant::now()).map_err(|e| e.to_string())?;
        while out.len() - before < max {
            let Some(c) = self.q.next_completion() else {
                break;
            };
            let row = std::mem::replace(&mut self.rows[c.slot as usize], NO_ROW);
            let ok = c.status.is_success();
            if ok && !row.read_dst.is_null() {
                // SAFETY: `submit`'s caller keeps read_dst valid for len bytes
                // until this Done is returned; the slot holds the read data.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.q.buf(c.slot).as_ptr(),
                        row.read_dst,
                        row.len,
                    )
                };
            }
            self.q.free(c.slot);
            self.inflight -= 1;
            let result = if ok { 0 } else { status_code(c.status) };
            out.push(Done {
                cookie: row.cookie,
                result,
            });
        }
        Ok(out.len() - before)
    }

    /// Waits (polling) for every I/O in flight, then disconnects cleanly.
    pub fn close(mut self) -> Result<(), String> {
        let mut sink = Vec::with_capacity(self.rows.len());
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.inflight > 0 && Instant::now() < deadline {
            sink.clear();
            self.reap(&mut sink, self.rows.len())?;
        }
        self.ctrl.shutdown().map_err(|e| e.to_string())
    }
}

/// A failed completion as one positive number: SCT << 8 | SC, never 0.
fn status_code(s: trellis_nvme::Status) -> i32 {
    let v = ((s.sct() as i32) << 8) | s.sc() as i32;
    v.max(1)
}

#[cfg(test)]
mod tests;
