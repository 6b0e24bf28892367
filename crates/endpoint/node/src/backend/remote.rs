//! `backend = "nvme-tcp"`: a namespace of a remote NVMe/TCP subsystem (a
//! JBOF, another Trellis node), reached with the workspace's own initiator
//! (`trellis-host`).
//!
//! `trellis-host` is synchronous (one thread owns a queue and polls it), so
//! each reactor's [`BackendQueue`] hands its requests to a worker thread of
//! its own through a bounded channel, and the worker's completions come back
//! through `reap`. The worker runs one command at a time on its own
//! controller: performance is secondary here, bounds and correctness first.
//!
//! Statuses: the remote's Reservation Conflict stays Reservation Conflict
//! (generic 83h), which is what makes the HA pair's device fence
//! ([`DeviceFence`], docs/target.md "HA pair: fencing at the device") visible
//! to the local host; a lost or timed-out connection is Transient Transport
//! Error (generic 22h) without DNR, so the host retries, and never success.
//!
//! The remote's own ANA state is its business: a path error from it (SCT
//! 3h) becomes Namespace Not Ready without DNR, since the local host's path
//! to this node is fine.

use super::{Backend, BackendQueue, Completion, IoReq, Op, Tag, SUBMIT_FAILED};
use anyhow::Context;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use trellis_host::resv::{self as hresv, is_conflict};
use trellis_host::{Controller, Error as HostError, HostConfig, Queue, Xfer};
use trellis_nvme::resv::{AcquireAction, RType};
use trellis_nvme::sqe::io;
use trellis_nvme::status::generic;
use trellis_nvme::{Sqe, Status};

/// Requests one reactor's queue may have at its worker (queued or running):
/// beyond it `submit` refuses with [`SUBMIT_FAILED`] (retryable).
pub const QUEUE_DEPTH: usize = 128;
/// Bytes one remote command moves: longer requests go as several commands
/// (a split write is not atomic, as NVMe never promises beyond AWUN).
pub const MAX_XFER_BYTES: usize = 128 << 10;
/// Bound of a connect (TCP, ICReq, Fabrics Connect, enable).
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Bound of one remote command.
pub const COMMAND_TIMEOUT_MS: u64 = 10_000;
/// Entries of the remote I/O queue: the worker runs one command at a time.
const REMOTE_QUEUE_ENTRIES: u16 = 4;
/// Write Zeroes covers at most 65536 blocks (NLB is 16 bits, 0-based).
const MAX_ZEROES_BLOCKS: u64 = 1 << 16;
/// Registrants a fence's Reservation Report reads (64 + 62 × 64 bytes
/// fit the control connection's 4 KiB buffers).
const REPORT_ENTRIES: usize = 62;

/// Where the remote namespace is, and who this node is to it.
#[derive(Clone, Debug)]
pub struct RemoteSpec {
    pub addr: String,
    pub subnqn: String,
    pub nsid: u32,
    pub hostnqn: String,
}

/// A controller with one I/O queue.
struct Conn {
    _ctrl: Controller,
    q: Queue,
}

impl RemoteSpec {
    /// The host ID follows the host NQN, so every connection of this node
    /// is one registrant to the remote's reservations.
    fn host_config(&self) -> HostConfig {
        HostConfig {
            hostid: trellis_host::ctrl::hostid_from(&self.hostnqn),
            hostnqn: self.hostnqn.clone(),
            // No Keep Alive: the worker is idle between commands, and a
            // connection the remote dropped is made again on the next one.
            kato_ms: 0,
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS),
            command_timeout: Duration::from_millis(COMMAND_TIMEOUT_MS),
            ..Default::default()
        }
    }

    fn connect(&self, buf_bytes: usize) -> trellis_host::Result<Conn> {
        let mut c = Controller::connect(&self.addr, &self.subnqn, &self.host_config())?;
        c.set_num_queues(1)?;
        let q = c.connect_io_queue(REMOTE_QUEUE_ENTRIES, buf_bytes)?;
        Ok(Conn { _ctrl: c, q })
    }

    fn describe(&self) -> String {
        format!(
            "nvme-tcp {} {} nsid {} as {}",
            self.addr, self.subnqn, self.nsid, self.hostnqn
        )
    }
}

pub struct RemoteBackend {
    spec: Arc<RemoteSpec>,
    size_bytes: u64,
    block_bytes: u64,
    /// The reservation commands' connection (the HA lease thread's), made
    /// again after an error.
    control: Mutex<Option<Conn>>,
}

impl RemoteBackend {
    /// Connects, reads the remote namespace's size and block size (which
    /// must be `block_size`, the one this node exports), and keeps the
    /// connection for reservation commands.
    pub fn open(spec: RemoteSpec, block_size: u32) -> anyhow::Result<RemoteBackend> {
        let what = spec.describe();
        let mut c = Controller::connect(&spec.addr, &spec.subnqn, &spec.host_config())
            .with_context(|| format!("{what}: cannot connect"))?;
        let id = c
            .identify_ns(spec.nsid)
            .with_context(|| format!("{what}: Identify Namespace"))?;
        anyhow::ensure!(
            (9..=12).contains(&id.lbads),
            "{what}: remote block size 2^{} is not supported (512 or 4096)",
            id.lbads
        );
        let block_bytes = 1u64 << id.lbads;
        anyhow::ensure!(
            block_bytes == u64::from(block_size),
            "{what}: the remote namespace has {block_bytes}-byte blocks: set block_size = {block_bytes}"
        );
        let size_bytes = id
            .nsze
            .checked_mul(block_bytes)
            .with_context(|| format!("{what}: NSZE {} overflows", id.nsze))?;
        c.set_num_queues(1)?;
        let q = c.connect_io_queue(REMOTE_QUEUE_ENTRIES, 4096)?;
        Ok(RemoteBackend {
            spec: Arc::new(spec),
            size_bytes,
            block_bytes,
            control: Mutex::new(Some(Conn { _ctrl: c, q })),
        })
    }

    /// Runs `f` on the control connection, connecting first if there is
    /// none, and drops the connection after an error that is not a status.
    fn with_control<T>(
        &self,
        f: impl FnOnce(&mut Queue, u32) -> trellis_host::Result<T>,
    ) -> anyhow::Result<T> {
        let mut g = crate::sys::lock(&self.control);
        if g.is_none() {
            *g = Some(self.spec.connect(4096)?);
        }
        let Some(c) = g.as_mut() else {
            anyhow::bail!("no control connection"); // just made: unreachable
        };
        let r = f(&mut c.q, self.spec.nsid);
        if matches!(&r, Err(e) if !matches!(e, HostError::Nvme(_))) {
            *g = None;
        }
        Ok(r?)
    }
}

impl Backend for RemoteBackend {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// Not promised: Deallocate is passed over (see `run_job`).
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        RemoteQueue::spawn(self.spec.clone(), self.block_bytes)
            .map(|q| Box::new(q) as Box<dyn BackendQueue>)
    }
    fn device_fence(&self) -> Option<&dyn DeviceFence> {
        Some(self)
    }
    fn describe(&self) -> String {
        format!("{}, {} bytes", self.spec.describe(), self.size_bytes)
    }
}

/// A backend whose device refuses the writes of a host whose reservation
/// key was preempted: the HA pair's fence at the device.
pub trait DeviceFence: Send + Sync {
    /// Registers `key` for this node (replacing any key it had): a standby
    /// stays a registrant, so it may acquire later.
    fn register(&self, key: u64) -> anyhow::Result<()>;
    /// Holds a Write Exclusive reservation with `key`: registers, acquires,
    /// or preempts (and aborts) the holder's key. Ok: this node holds it
    /// and the former holder's writes fail at the device. Says what it did.
    fn claim(&self, key: u64) -> anyhow::Result<String>;
}

impl DeviceFence for RemoteBackend {
    fn register(&self, key: u64) -> anyhow::Result<()> {
        self.with_control(|q, nsid| hresv::register_key(q, nsid, key))
    }

    fn claim(&self, key: u64) -> anyhow::Result<String> {
        self.with_control(|q, nsid| claim_on(q, nsid, key))
    }
}

/// [`DeviceFence::claim`] on queue `q`.
fn claim_on(q: &mut Queue, nsid: u32, key: u64) -> trellis_host::Result<String> {
    const WE: RType = RType::WriteExclusive;
    hresv::register_key(q, nsid, key)?;
    let (hdr, regs) = hresv::report(q, nsid, REPORT_ENTRIES)?;
    let holder = regs.iter().find(|r| r.holds);
    let did = match holder {
        Some(h) if h.rkey == key && hdr.rtype == WE as u8 => "already held".to_string(),
        Some(h) => {
            // Preempt and Abort: when it returns, the holder is no longer a
            // registrant and the remote has finished or failed everything
            // it had of the holder's, so nothing of the old owner lands after.
            let abort = AcquireAction::PreemptAndAbort;
            hresv::acquire(q, nsid, abort, WE, key, h.rkey)?;
            format!("preempted key {:#018x}", h.rkey)
        }
        None => {
            hresv::acquire(q, nsid, AcquireAction::Acquire, WE, key, 0)?;
            "acquired".to_string()
        }
    };
    // Checked, not assumed: the holder's key may equal ours (then the
    // preempt removed us too), or another node may have acquired between.
    let (hdr, regs) = hresv::report(q, nsid, REPORT_ENTRIES)?;
    let mine = regs.iter().any(|r| r.holds && r.rkey == key);
    if mine && hdr.rtype == WE as u8 {
        return Ok(did);
    }
    Err(HostError::protocol(format!(
        "after `{did}` this node does not hold the Write Exclusive reservation (type {} held: {})",
        hdr.rtype,
        if mine { "by this key" } else { "by another" }
    )))
}

/// The submitter's request buffer, carried to the worker.
struct SendPtr(*mut u8);
// SAFETY: `BackendQueue::submit`'s contract keeps the buffer valid, and
// touched by nobody else, until the request completes; only the worker
// uses it meanwhile, and it completes the request after its last use.
unsafe impl Send for SendPtr {}

struct Job {
    op: Op,
    offset_bytes: u64,
    len_bytes: u64,
    buf: SendPtr,
    fua: bool,
    tag: Tag,
}

/// One reactor's queue: a worker thread with its own remote controller.
struct RemoteQueue {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Completion>,
    in_flight: usize,
    /// Set on drop: queued jobs are completed without touching their buffers.
    cancel: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl RemoteQueue {
    fn spawn(spec: Arc<RemoteSpec>, block_bytes: u64) -> anyhow::Result<RemoteQueue> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_DEPTH);
        let (dtx, drx) = std::sync::mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let c = cancel.clone();
        let worker = std::thread::Builder::new()
            .name("nvme-tcp-backend".into())
            .spawn(move || Worker::new(spec, block_bytes).run(rx, dtx, &c))?;
        Ok(RemoteQueue {
            jobs: Some(tx),
            done: drx,
            in_flight: 0,
            cancel,
            worker: Some(worker),
        })
    }
}

impl BackendQueue for RemoteQueue {
    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        if self.in_flight >= QUEUE_DEPTH {
            return Some(SUBMIT_FAILED);
        }
        let job = Job {
            op: req.op,
            offset_bytes: req.offset_bytes,
            len_bytes: req.len_bytes,
            buf: SendPtr(req.buf),
            fua: req.fua,
            tag,
        };
        match self.jobs.as_ref().map(|j| j.try_send(job)) {
            Some(Ok(())) => {
                self.in_flight += 1;
                None
            }
            Some(Err(TrySendError::Full(_))) => Some(SUBMIT_FAILED),
            // The worker is gone (it panicked): a retry may reach another path.
            _ => Some(generic::TRANSIENT_TRANSPORT_ERROR),
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        while let Ok(c) = self.done.try_recv() {
            out.push(c);
            n += 1;
        }
        self.in_flight = self.in_flight.saturating_sub(n);
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for RemoteQueue {
    fn drop(&mut self) {
        // The buffers of requests still queued may go with the reactor:
        // the worker must not touch them. It finishes the command it runs
        // (bounded by COMMAND_TIMEOUT_MS) and stops.
        self.cancel.store(true, SeqCst);
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

struct Worker {
    spec: Arc<RemoteSpec>,
    block_bytes: u64,
    conn: Option<Conn>,
    /// Connection failures, logged rate-limited with a count: an
    /// unreachable JBOF fails every request, and each would be a line.
    log: crate::sys::loglimit::LineBucket,
}

impl Worker {
    fn new(spec: Arc<RemoteSpec>, block_bytes: u64) -> Worker {
        Worker {
            spec,
            block_bytes,
            conn: None,
            log: crate::sys::loglimit::LineBucket::new(
                crate::sys::loglimit::DEFAULT_LOG_BURST,
                crate::sys::loglimit::DEFAULT_LOG_LINES_PER_SEC,
            ),
        }
    }

    fn run(mut self, jobs: Receiver<Job>, done: Sender<Completion>, cancel: &AtomicBool) {
        while let Ok(job) = jobs.recv() {
            let st = if cancel.load(SeqCst) {
                generic::ABORTED_SQ_DELETION
            } else {
                self.run_job(&job)
            };
            if done.send(Completion::new(job.tag, st)).is_err() {
                return; // the queue is gone
            }
        }
    }

    /// One request, as one or more remote commands.
    fn run_job(&mut self, job: &Job) -> Status {
        if job.op == Op::Discard {
            // Deallocate is advisory and DLFEAT promises nothing here.
            return Status::SUCCESS;
        }
        let bb = self.block_bytes;
        if !job.offset_bytes.is_multiple_of(bb) || !job.len_bytes.is_multiple_of(bb) {
            return generic::INVALID_FIELD.dnr();
        }
        if self.conn.is_none() {
            match self.spec.connect(MAX_XFER_BYTES) {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    if let Some(left_out) = self.log.admit(crate::sys::now_ns()) {
                        tracing::warn!(left_out, "{}: connect: {e}", self.spec.describe());
                    }
                    return generic::TRANSIENT_TRANSPORT_ERROR;
                }
            }
        }
        let r = self.commands(job);
        match r {
            Ok(()) => Status::SUCCESS,
            Err(HostError::Nvme(st)) => remote_status(st),
            Err(e) => {
                if let Some(left_out) = self.log.admit(crate::sys::now_ns()) {
                    tracing::warn!(left_out, "{}: {e}: reconnecting", self.spec.describe());
                }
                self.conn = None;
                generic::TRANSIENT_TRANSPORT_ERROR
            }
        }
    }

    /// The remote commands of `job`, in pieces of at most MAX_XFER_BYTES
    /// (MAX_ZEROES_BLOCKS for Write Zeroes).
    fn commands(&mut self, job: &Job) -> trellis_host::Result<()> {
        let (bb, nsid) = (self.block_bytes, self.spec.nsid);
        let Some(c) = self.conn.as_mut() else {
            return Err(HostError::protocol("not connected"));
        };
        if job.op == Op::Flush {
            let sqe = Sqe::new(io::FLUSH, 0, nsid);
            return c.q.exec_ok(sqe, Xfer::None, &[], &mut []).map(|_| ());
        }
        let piece = match job.op {
            Op::WriteZeroes => MAX_ZEROES_BLOCKS * bb,
            _ => MAX_XFER_BYTES as u64,
        };
        let mut done = 0u64;
        while done < job.len_bytes {
            let len = (job.len_bytes - done).min(piece);
            let slba = (job.offset_bytes + done) / bb;
            let nlb = (len / bb) as u32; // ≤ 65536 by `piece`
            piece_command(&mut c.q, job, nsid, slba, nlb, done, len)?;
            done += len;
        }
        Ok(())
    }
}

/// One piece of a Read, Write or Write Zeroes: bytes `at..at + len` of
/// the job's buffer, blocks `slba..slba + nlb` of the remote namespace.
fn piece_command(
    q: &mut Queue,
    job: &Job,
    nsid: u32,
    slba: u64,
    nlb: u32,
    at: u64,
    len: u64,
) -> trellis_host::Result<()> {
    let (at, n) = (at as usize, len as usize);
    match job.op {
        Op::Read => {
            // SAFETY: submit's contract: job.buf is valid for len_bytes and
            // ours until completion; at + n ≤ len_bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(job.buf.0.add(at), n) };
            let sqe = Sqe::rw(io::READ, 0, nsid, slba, nlb, false);
            q.exec_ok(sqe, Xfer::FromCtrl(n as u32), &[], out)?;
        }
        Op::Write => {
            // SAFETY: as for Read; only read here.
            let data = unsafe { std::slice::from_raw_parts(job.buf.0.add(at), n) };
            let sqe = Sqe::rw(io::WRITE, 0, nsid, slba, nlb, job.fua);
            q.exec_ok(sqe, Xfer::ToCtrl(n as u32), data, &mut [])?;
        }
        _ => {
            let sqe = Sqe::rw(io::WRITE_ZEROES, 0, nsid, slba, nlb, job.fua);
            q.exec_ok(sqe, Xfer::None, &[], &mut [])?;
        }
    }
    Ok(())
}

/// The local status for the remote's `st` (see the module comment).
fn remote_status(st: Status) -> Status {
    if is_conflict(st) {
        // Generic 83h, with the remote's DNR bit.
        let c = generic::RESERVATION_CONFLICT;
        if st.is_dnr() {
            c.dnr()
        } else {
            c
        }
    } else if st.sct() == 3 {
        generic::NS_NOT_READY
    } else {
        st
    }
}

/// The reservation key of HA node `node` (docs/target.md, "HA pair:
/// fencing at the device"): the first 8 bytes of SHA-256 of
/// "trellis-ha-device-fence:" + the name, little-endian; never 0.
pub fn node_key(node: &str) -> u64 {
    use sha2::Digest;
    let h = sha2::Sha256::digest(format!("trellis-ha-device-fence:{node}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    u64::from_le_bytes(b).max(1)
}

/// The default host NQN of a node named `node` (its `[ha] node`, else its UUID).
pub fn default_hostnqn(node: &str) -> String {
    format!("nqn.2014-08.io.trellis:node:{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_keys_differ_and_are_stable() {
        assert_ne!(node_key("a"), node_key("b"));
        assert_eq!(node_key("a"), node_key("a"));
        assert_ne!(node_key(""), 0);
    }

    #[test]
    fn remote_statuses_map_to_local_ones() {
        let c = generic::RESERVATION_CONFLICT;
        assert_eq!(remote_status(c.dnr()), c.dnr());
        assert_eq!(remote_status(c), c);
        let ana = trellis_nvme::status::path::ANA_INACCESSIBLE;
        assert_eq!(remote_status(ana), generic::NS_NOT_READY);
        let lba = generic::LBA_OUT_OF_RANGE.dnr();
        assert_eq!(remote_status(lba), lba);
    }
}
