//! DH-HMAC-CHAP work off the reactor thread, and the bounds on how much of
//! it a peer can ask for (issue 32).
//!
//! An FFDHE exponentiation costs milliseconds (about 7 ms for ffdhe8192 on
//! the 2-vCPU test VM), and a reactor serves every connection it owns from
//! one thread: run there, each Challenge stalled every other host of that
//! reactor. So the Authentication Receive handler hands the exponentiation
//! to a node-wide pool of `target.auth_workers` threads through a queue of
//! at most `target.auth_queue_max` jobs, parks its command (as an AER is
//! parked), and returns to the loop. The worker posts the result to the
//! reactor's [`Mailbox`] and wakes the reactor through its eventfd; the
//! reactor hands it to the connection, which completes the command. A
//! full queue refuses the transaction (AUTH_Failure1) without computing.
//!
//! The workers run at a lower priority (nice [`WORKER_NICE`]) and off the
//! CPUs reactors are pinned to, so a flood of exponentiations yields the
//! CPU to reactors and hosts rather than competing with them.
//!
//! Before any of that, a transaction must be admitted: at most
//! `target.auth_per_conn_max` per connection (counted by the session) and,
//! node-wide per host NQN, a token bucket of `target.auth_per_host_burst`
//! transactions refilled at `target.auth_per_host_per_sec`. Refusals are
//! logged rate-limited (`target.log_burst`, `sys::loglimit`), each line
//! with the count left out.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8).
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::config::TargetConfig;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use trellis_nvme::dhchap::{BadPublicValue, DhGroup, DhKey, PRIVATE_KEY_LEN};

/// The nice value of the DH workers: below every reactor and host thread
/// (nice 0), so the scheduler runs those first when both are runnable.
pub const WORKER_NICE: i32 = 10;
/// At most this many (host NQN, source address) token buckets.
pub const MAX_AUTH_BUCKETS: usize = 4096;

/// One exponentiation (with what goes around it).
pub enum Work {
    /// A new ephemeral key and its public value g^x mod p (the Challenge).
    Keygen {
        group: DhGroup,
        random: zeroize::Zeroizing<[u8; PRIVATE_KEY_LEN]>,
    },
    /// The shared secret y^x mod p from the host's public value (the Reply).
    Shared { key: DhKey, peer: Vec<u8> },
}

/// What [`Work::run`] computed.
pub enum Output {
    Keygen {
        key: Option<DhKey>,
        public: Vec<u8>,
    },
    Shared(Result<zeroize::Zeroizing<Vec<u8>>, BadPublicValue>),
    /// The computation panicked (a bug): the transaction fails.
    Lost,
}

impl Work {
    /// Computes it, on whatever thread calls.
    pub fn run(self) -> Output {
        match self {
            Work::Keygen { group, random } => {
                let key = DhKey::new(group, &random);
                let public = key.as_ref().map_or(Vec::new(), |k| k.public_value());
                Output::Keygen { key, public }
            }
            Work::Shared { key, peer } => {
                Output::Shared(key.shared_secret(&peer).map(zeroize::Zeroizing::new))
            }
        }
    }
}

/// A result on its way back to the connection that asked.
pub struct Done {
    /// The connection's index in its reactor.
    pub conn: u32,
    pub job: u64,
    pub out: Output,
}

/// Where a reactor's results arrive: the workers push and write the
/// reactor's eventfd (a dup of it, so it outlives neither side's use).
pub struct Mailbox {
    ready: AtomicBool,
    done: Mutex<Vec<Done>>,
    wake: OwnedFd,
}

impl Mailbox {
    pub fn new(wake_fd: RawFd) -> std::io::Result<Mailbox> {
        // SAFETY: dup takes no pointers; the result is checked.
        let fd = unsafe { libc::fcntl(wake_fd, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mailbox {
            ready: AtomicBool::new(false),
            done: Mutex::new(Vec::new()),
            // SAFETY: fd was just created by dup and is owned by nothing else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn post(&self, d: Done) {
        crate::sys::lock(&self.done).push(d);
        self.ready.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local u64 to our own eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }

    /// Moves the results that arrived into `into`: one atomic load when
    /// none did, so the reactor can look every loop.
    pub fn take(&self, into: &mut Vec<Done>) -> bool {
        if !self.ready.load(Ordering::Acquire) {
            return false;
        }
        self.ready.store(false, Ordering::Relaxed);
        into.append(&mut crate::sys::lock(&self.done));
        !into.is_empty()
    }
}

struct Job {
    id: u64,
    conn: u32,
    work: Work,
    to: Arc<Mailbox>,
}

/// A host NQN's token bucket, in thousandths of a transaction.
struct Bucket {
    milli: u64,
    at_ns: u64,
}

/// The node's DH workers and transaction bounds (one per target).
pub struct AuthPool {
    tx: Mutex<Option<SyncSender<Job>>>,
    next_job: AtomicU64,
    computed: Arc<AtomicU64>,
    refused: AtomicU64,
    /// Per (host NQN, source address): see [`AuthPool::admit_host`].
    buckets: Mutex<HashMap<(String, std::net::IpAddr), Bucket>>,
    per_host_per_sec: u64,
    per_host_burst: u64,
    /// Refusal warnings (`target.log_burst`, `sys::loglimit`).
    refusal_log: crate::sys::loglimit::LogLimit,
}

/// The workers' queue holds `target.auth_queue_max` jobs (or the pool is
/// stopped): nothing was queued.
#[derive(Debug)]
pub struct QueueFull;

/// A reactor's way to the pool: the pool and where its results arrive.
pub struct AuthPort {
    pub pool: Arc<AuthPool>,
    pub mailbox: Arc<Mailbox>,
}

impl AuthPort {
    /// Queues `work` for connection `conn`: its job ID, or [`QueueFull`]
    /// (the work is dropped; the caller refuses the transaction).
    pub fn submit(&self, conn: u32, work: Work) -> Result<u64, QueueFull> {
        let id = self.pool.next_job.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            id,
            conn,
            work,
            to: self.mailbox.clone(),
        };
        let tx = crate::sys::lock(&self.pool.tx);
        let Some(tx) = tx.as_ref() else {
            return Err(QueueFull);
        };
        match tx.try_send(job) {
            Ok(()) => Ok(id),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(QueueFull),
        }
    }
}

impl AuthPool {
    /// Starts `limits.auth_workers` threads.
    pub fn start(limits: &TargetConfig) -> std::io::Result<Arc<AuthPool>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(limits.auth_queue_max);
        let rx = Arc::new(Mutex::new(rx));
        let computed = Arc::new(AtomicU64::new(0));
        for i in 0..limits.auth_workers {
            let (rx, computed, cpus) = (rx.clone(), computed.clone(), limits.cpus.clone());
            std::thread::Builder::new()
                .name(format!("dh-worker-{i}"))
                .spawn(move || worker(&rx, &computed, &cpus))?;
        }
        Ok(Arc::new(AuthPool {
            tx: Mutex::new(Some(tx)),
            next_job: AtomicU64::new(1),
            computed,
            refused: AtomicU64::new(0),
            buckets: Mutex::new(HashMap::new()),
            per_host_per_sec: limits.auth_per_host_per_sec as u64,
            per_host_burst: limits.auth_per_host_burst as u64,
            refusal_log: crate::sys::loglimit::LogLimit::new(
                limits.log_burst,
                limits.log_lines_per_sec,
            ),
        }))
    }

    /// Stops the workers once they finish the jobs already queued.
    pub fn stop(&self) {
        crate::sys::lock(&self.tx).take();
    }

    /// Exponentiations the workers have done (for tests and metrics).
    pub fn computed(&self) -> u64 {
        self.computed.load(Ordering::Relaxed)
    }

    /// Transactions refused by a bound or a full queue.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Takes one transaction from the bucket of `hostnqn` connecting from
    /// `src`; false when empty. Keyed by the source address too: the NQN is
    /// only claimed until the transaction succeeds, so a flood in a host's
    /// name from another address must not empty the real host's bucket and
    /// lock it out. Only host NQNs with a key here have a session, and at
    /// most [`MAX_AUTH_BUCKETS`] pairs are kept (full, idle ones are dropped
    /// first; past that a new pair is refused).
    pub fn admit_host(&self, hostnqn: &str, src: std::net::IpAddr, now_ns: u64) -> bool {
        let cap = self.per_host_burst * 1000;
        let mut m = crate::sys::lock(&self.buckets);
        let key = (hostnqn.to_string(), src);
        if !m.contains_key(&key) && m.len() >= MAX_AUTH_BUCKETS {
            m.retain(|_, b| self.refill(b, now_ns, cap) < cap);
            if m.len() >= MAX_AUTH_BUCKETS {
                return false;
            }
        }
        let b = m.entry(key).or_insert(Bucket {
            milli: cap,
            at_ns: now_ns,
        });
        if self.refill(b, now_ns, cap) < 1000 {
            return false;
        }
        b.milli -= 1000;
        true
    }

    /// Adds what `b` earned since it was last touched; its level (milli-
    /// transactions).
    fn refill(&self, b: &mut Bucket, now_ns: u64, cap: u64) -> u64 {
        let dt = now_ns.saturating_sub(b.at_ns) as u128;
        let add = dt * self.per_host_per_sec as u128 / 1_000_000;
        // At most cap, so the conversion cannot fail.
        b.milli = u64::try_from((b.milli as u128 + add).min(cap as u128)).unwrap_or(cap);
        b.at_ns = now_ns.max(b.at_ns);
        b.milli
    }

    /// Counts a refusal and warns about it, rate-limited
    /// (`sys::loglimit`): each line counts the refusals not logged since
    /// the last.
    pub fn note_refusal(&self, host: &str, peer: std::net::SocketAddr, why: &str, now_ns: u64) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = self.refusal_log.admit_at(now_ns) {
            tracing::warn!(%host, %peer, left_out, "refusing an authentication transaction: {why}");
        }
    }
}

/// A worker: lowers its priority, keeps off the reactors' CPUs, and runs
/// jobs until the pool is stopped or dropped.
fn worker(rx: &Mutex<Receiver<Job>>, computed: &AtomicU64, cpus: &[usize]) {
    crate::sys::avoid_reactor_cpus(cpus);
    // SAFETY: gettid and setpriority take no pointers; on Linux a thread
    // ID names only this thread, whose nice value alone changes.
    let r = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            WORKER_NICE,
        )
    };
    if r != 0 {
        tracing::debug!("could not lower the DH worker's priority");
    }
    loop {
        let job = match crate::sys::lock(rx).recv() {
            Ok(j) => j,
            Err(_) => return, // the pool is gone
        };
        let work = job.work;
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.run()))
            .unwrap_or(Output::Lost);
        computed.fetch_add(1, Ordering::Relaxed);
        job.to.post(Done {
            conn: job.conn,
            job: job.id,
            out,
        });
    }
}
