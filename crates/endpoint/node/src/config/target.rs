//! `[target]`: the node's limits and tunables, their named defaults and
//! bounds, and their checks.

use super::*;

/// Daemon-wide settings and limits.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetConfig {
    /// Reactor threads (each owns its connections for their whole life).
    pub reactors: usize,
    /// CPUs to pin reactors to, in order (empty: no pinning).
    pub cpus: Vec<usize>,
    /// Largest data transfer per command (MDTS), a power of two ≥ 4 KiB.
    pub max_io_size: ByteSize,
    /// Command data buffers up to this size are kept for reuse when their
    /// command completes (no allocation per I/O); larger ones are freed. An
    /// idle queue pair thus holds at most 2 × queue depth × this, however
    /// large the transfers it served, plus its share of `large_buffer_budget`;
    /// in flight, each command holds its own.
    pub slot_buffer_keep: ByteSize,
    /// Node-wide bytes of buffers larger than `slot_buffer_keep` kept for
    /// reuse after their command. Within it, large transfers allocate
    /// nothing once warm; beyond it, their buffers are freed after use.
    pub large_buffer_budget: ByteSize,
    /// Node-wide bytes that commands transferring more than
    /// `slot_buffer_keep` may hold in flight (SPDK's shared buffer pool): a
    /// command that finds no room waits, before its buffer is allocated and
    /// its R2T sent. One connection holds at most an eighth of it
    /// (`TRANSFER_POOL_SHARE_DIV`), so one peer cannot take it all.
    pub transfer_pool: ByteSize,
    /// A command waiting for its write data (after R2T) longer than this
    /// closes its connection (C2HTermReq is not sent: the host is not
    /// wrong about a field, it is silent), which frees every buffer the
    /// connection held. Bounds what a peer that parks writes can pin.
    pub data_wait_timeout_ms: u64,
    /// In-capsule data accepted on I/O queues (IOCCSZ). Admin queues and
    /// Connect always accept 8 KiB, as hosts require.
    pub in_capsule_data: ByteSize,
    /// MAXH2CDATA: the largest H2CData PDU payload.
    pub max_h2c_data: ByteSize,
    /// Largest queue a host may create (CAP.MQES + 1).
    pub max_queue_depth: u16,
    /// I/O queues granted per controller.
    pub max_io_queues: u16,
    /// Connections accepted across all listeners.
    pub max_connections: usize,
    /// Connections one peer address may hold (None: a quarter of
    /// `max_connections`), so idle sockets from one address cannot take
    /// every slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_addr: Option<usize>,
    /// A connection must send its ICReq within this long of the channel
    /// being ready (accept, or the end of its TLS handshake).
    pub icreq_timeout_ms: u64,
    /// TCP keepalive on every accepted connection: the first probe after
    /// this long without traffic (0: no keepalive). A host that vanished
    /// (power loss, a partition) while its controller has KATO 0 never
    /// sends the FIN or the keep-alive that would end it; the probes do:
    /// the connection closes after idle + interval × probes, and with its
    /// admin queue the controller.
    pub tcp_keepalive_idle_s: u32,
    /// Between keepalive probes.
    pub tcp_keepalive_interval_s: u32,
    /// Unanswered probes before the kernel declares the peer dead. Data
    /// sent and never acknowledged is bounded the same way
    /// (TCP_USER_TIMEOUT = idle + interval × probes).
    pub tcp_keepalive_probes: u32,
    /// Live controllers per subsystem.
    pub max_controllers: usize,
    /// Most bytes one connection sends per reactor loop (0: no bound, one
    /// sendmsg of everything queued). With a bound, a connection streaming
    /// large reads takes a turn of at most this many bytes before the
    /// reactor reads and answers its other connections, so a 4 KiB read on
    /// another queue does not wait behind megabytes of someone else's data
    /// (blk-switch's and nvmet's target-side budget; i10 caravans are 64 KiB).
    /// Costs single-connection throughput (more sendmsg calls), hence off by
    /// default; docs/target.md "Send budget".
    pub send_budget: ByteSize,
    /// Write Zeroes and Deallocate go to the backend in pieces of at most
    /// this many bytes (one fallocate each), off the reactor's loop; a RAM
    /// namespace's pieces are at most 16 MiB whatever this says
    /// (docs/target.md "Write Zeroes and Deallocate").
    pub zero_chunk: ByteSize,
    /// Such pieces one reactor's queue of one namespace has at the backend
    /// at once, over all its commands (so at most `zero_chunk` × this bytes
    /// of zeroing are outstanding per queue), and the most a synchronous
    /// backend (RAM) does per reactor loop.
    pub zero_chunks_in_flight: usize,
    /// How long a reactor keeps spinning without work before it sleeps.
    pub idle_spin_us: u64,
    /// Longest sleep of an idle reactor (bounds timer latency).
    pub idle_sleep_ms: u64,
    /// Idle timeout of discovery controllers connected with KATO 0.
    pub discovery_idle_timeout_s: u64,
    /// A connection must send ICReq and Connect within this time.
    pub connect_timeout_ms: u64,
    /// A connection whose peer accepts none of its queued output for this
    /// long is closed (a peer that stopped reading: "slowloris"). Its
    /// output is bounded meanwhile (the reactor stops parsing its commands
    /// when the output queue is full).
    pub send_stall_timeout_ms: u64,
    /// A connection on a TLS listener (`secure_channel`) must finish its
    /// TLS handshake within this time, or it is closed (nvmet's
    /// `tls_handshake_timeout` is 10 s too).
    pub tls_handshake_timeout_ms: u64,
    /// Time allowed at shutdown to finish in-flight commands.
    pub shutdown_grace_ms: u64,
    /// Controller IDs this node hands out, inclusive (1..=`MAX_CNTLID`).
    /// Two nodes a host reaches as one subsystem (an HA pair) need disjoint
    /// ranges: Linux refuses a controller whose CNTLID it already has in the
    /// subsystem ("Duplicate cntlid"), which is why nvmet has cntlid_min/max.
    pub cntlid_min: u16,
    pub cntlid_max: u16,
    /// Reservation registrants per namespace (hosts registered with
    /// Reservation Register); one more is refused with Capacity Exceeded.
    pub max_registrants: usize,
    /// How long a Reservation Acquire (Preempt and Abort) waits for the
    /// commands already past their reservation check (at the backend, in
    /// a scheduler) to finish before it completes; past it the Acquire
    /// fails with Internal Error although the reservation has moved
    /// (`state::drain`, docs/target.md "Reservations").
    pub preempt_abort_timeout_ms: u64,
    /// DH-HMAC-CHAP transactions (AUTH_Negotiates) one connection may start;
    /// past it the transaction fails (AUTH_Failure1) before any exponentiation.
    pub auth_per_conn_max: u32,
    /// DH-HMAC-CHAP transactions one host NQN may start per second across
    /// the node, after its `auth_per_host_burst` (a token bucket).
    pub auth_per_host_per_sec: u32,
    /// Transactions one host NQN may start at once (the bucket's size):
    /// every queue of every controller authenticates, so a host connecting
    /// or reconnecting all its paths spends one per queue.
    pub auth_per_host_burst: u32,
    /// Threads computing DH exponentiations, off the reactors.
    pub auth_workers: usize,
    /// Exponentiations waiting for a DH worker; one more is refused.
    pub auth_queue_max: usize,
    /// Whether a host NQN with a `dhchap_secret` (in any subsystem) must
    /// authenticate its discovery controllers too. Off by default, as in
    /// Linux's nvmet (which never authenticates discovery), so `nvme
    /// discover` with a keyed host NQN and no secret keeps working; on, a
    /// peer claiming a keyed NQN learns nothing from the discovery log
    /// without the secret (docs/security.md "Who may connect").
    pub discovery_dhchap: bool,
    /// Lines of one kind a peer can trigger (refused Connects, refused
    /// connections, refused authentications, new QoS tenants) written at
    /// once; past them, `log_lines_per_sec`, each line counting those left
    /// out (`sys::loglimit`).
    pub log_burst: u32,
    /// Lines of one such kind per second once its burst is spent.
    pub log_lines_per_sec: u32,
    /// Socket I/O engine: plain syscalls with epoll, or io_uring.
    pub socket_engine: SocketEngine,
    /// Where the node identity file (`node-id`) lives. Default: the config
    /// file's directory (`trellis target --config`), else
    /// [`crate::config::default_state_dir`].
    pub state_dir: Option<std::path::PathBuf>,
}

/// How reactors do socket I/O (the same protocol code runs on both).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SocketEngine {
    /// Non-blocking recv/sendmsg, readiness from epoll (works everywhere).
    Epoll,
    /// Receives and gathered sends through one io_uring per reactor.
    Uring,
}

impl std::str::FromStr for SocketEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "epoll" => Ok(SocketEngine::Epoll),
            "uring" | "io_uring" => Ok(SocketEngine::Uring),
            _ => Err(format!("unknown socket engine {s:?} (epoll or uring)")),
        }
    }
}

/// Default of `target.max_connections`: every NVMe/TCP queue pair is a
/// connection, so 1,000 hosts with 10 I/O queues each need 11,000 of them
/// (issue 13's load case; `crates/app/cli/tests/scale.rs`). Memory follows
/// the connections actually open, not this bound (docs/target.md "Limits").
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;
/// The most `target.max_connections` may be: 2³² − 1. A connection's index on its reactor is
/// a `u32` in every backend tag it sends (`backend::tag::IoTag`), so every
/// connection admitted has an index that fits.
pub const MAX_CONNECTIONS_CEILING: usize = u32::MAX as usize;
/// Default of `target.max_controllers` (per subsystem): enough for every
/// host the default connection bound can serve; a controller costs its
/// connections, which `max_connections` bounds. Was 64, which refused the
/// 65th host (SPDK allows ~65,000 controller IDs).
pub const DEFAULT_MAX_CONTROLLERS: usize = 4_096;

/// Default of `target.send_stall_timeout_ms`: 30 s without a byte accepted
/// by the peer. Far above any healthy stall (a host's keep-alive period is
/// 5-15 s, Linux's default KATO), far below TCP's own give-up time (about
/// 15 minutes with `tcp_retries2` = 15), which never fires for a peer that
/// still ACKs with a zero window.
pub const DEFAULT_SEND_STALL_TIMEOUT_MS: u64 = 30_000;
/// Default of `target.tls_handshake_timeout_ms`.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Bounds of `target.tls_handshake_timeout_ms`.
pub const TLS_HANDSHAKE_TIMEOUT_MS_MIN: u64 = 100;
pub const TLS_HANDSHAKE_TIMEOUT_MS_MAX: u64 = 600_000;
/// Bounds of `target.send_stall_timeout_ms`.
pub const SEND_STALL_TIMEOUT_MS_MIN: u64 = 100;
pub const SEND_STALL_TIMEOUT_MS_MAX: u64 = 3_600_000;

/// Default of `target.icreq_timeout_ms`. Hosts send the ICReq as soon as
/// the connection is up (Linux and SPDK both, before anything else); a peer
/// silent for 2 s holds a connection slot for nothing.
pub const DEFAULT_ICREQ_TIMEOUT_MS: u64 = 2_000;
/// Bounds of `target.icreq_timeout_ms`.
pub const ICREQ_TIMEOUT_MS_MIN: u64 = 100;
pub const ICREQ_TIMEOUT_MS_MAX: u64 = 60_000;

/// Defaults of `target.tcp_keepalive_*`: a vanished host's connection ends
/// within 30 + 5 × 6 = 60 s (Linux's own default, 7200 + 75 × 9 s, is over
/// two hours).
pub const DEFAULT_TCP_KEEPALIVE_IDLE_S: u32 = 30;
pub const DEFAULT_TCP_KEEPALIVE_INTERVAL_S: u32 = 5;
pub const DEFAULT_TCP_KEEPALIVE_PROBES: u32 = 6;
/// Bounds of `target.tcp_keepalive_*` (Linux's TCP_KEEPIDLE and
/// TCP_KEEPINTVL take at most 32767 s, TCP_KEEPCNT at most 127).
pub const TCP_KEEPALIVE_S_MAX: u32 = 32_767;
pub const TCP_KEEPALIVE_PROBES_MAX: u32 = 127;

/// Default of `target.transfer_pool`: 256 MiB, four times SPDK's NVMe/TCP
/// default (511 shared buffers of 128 KiB, `num_shared_buffers` ×
/// `io_unit_size`), for a node that serves many hosts.
pub const DEFAULT_TRANSFER_POOL: u64 = 256 << 20;
/// One connection's share of `target.transfer_pool` is at most pool / this.
pub const TRANSFER_POOL_SHARE_DIV: u64 = 8;
/// Default of `target.data_wait_timeout_ms`. Hosts send write data right
/// after the R2T (Linux from its send path, SPDK likewise); 5 s is long
/// past any live host's delay and short against the 10 s a peer otherwise
/// needs to pin a buffer per slot.
pub const DEFAULT_DATA_WAIT_TIMEOUT_MS: u64 = 5_000;
/// Bounds of `target.data_wait_timeout_ms`.
pub const DATA_WAIT_TIMEOUT_MS_MIN: u64 = 100;
pub const DATA_WAIT_TIMEOUT_MS_MAX: u64 = 600_000;

/// Default of `target.preempt_abort_timeout_ms`: under the 10 s command
/// timeout of `trellis-host` (and far under the 30 s a Linux host waits,
/// `nvme_core.io_timeout`, before it resets the controller), so the host
/// hears the outcome rather than timing out first, and far above a healthy
/// device's latency, so only a stuck backend reaches it.
pub const DEFAULT_PREEMPT_ABORT_TIMEOUT_MS: u64 = 5_000;
/// Largest `target.idle_sleep_ms`: a sleeping reactor sees a drain request
/// (Preempt and Abort) only when it wakes, so its sleep is bounded, and at
/// most half of `preempt_abort_timeout_ms`.
pub const IDLE_SLEEP_MS_MAX: u64 = 5_000;
/// Bounds of `target.preempt_abort_timeout_ms`.
pub const PREEMPT_ABORT_TIMEOUT_MS_MIN: u64 = 10;
pub const PREEMPT_ABORT_TIMEOUT_MS_MAX: u64 = 600_000;

/// Default of `target.auth_per_conn_max`: a queue authenticates once at
/// Connect, and again only when the host re-authenticates (a new key).
pub const DEFAULT_AUTH_PER_CONN_MAX: u32 = 16;
/// Default of `target.auth_per_host_per_sec`.
pub const DEFAULT_AUTH_PER_HOST_PER_SEC: u32 = 16;
/// Default of `target.auth_per_host_burst`: a host's admin and I/O queues
/// (`max_io_queues` is 16 by default) on two paths to two subsystems,
/// 4 × 17 = 68, reconnecting at once, with room to spare.
pub const DEFAULT_AUTH_PER_HOST_BURST: u32 = 128;
/// Default of `target.auth_workers`.
pub const DEFAULT_AUTH_WORKERS: usize = 1;
/// Default of `target.auth_queue_max`.
pub const DEFAULT_AUTH_QUEUE_MAX: usize = 64;
/// Upper bound of the `target.auth_*` counts and rates.
pub const AUTH_LIMIT_MAX: u32 = 1_000_000;
/// Upper bound of `target.auth_workers`.
pub const AUTH_WORKERS_MAX: usize = 64;
/// Default of `target.zero_chunk`: 256 MiB, a 4 TiB deallocation in 16 384
/// fallocate calls (about 20 µs of kernel CPU each on a sparse ext4 file),
/// each holding the file's lock no longer than 256 MiB of extents take.
pub const DEFAULT_ZERO_CHUNK: u64 = 256 << 20;
/// Bounds of `target.zero_chunk`: one fill write, and 1 GiB.
pub const ZERO_CHUNK_MIN: u64 = 1 << 20;
pub const ZERO_CHUNK_MAX: u64 = 1 << 30;
/// Default and bounds of `target.zero_chunks_in_flight`.
pub const DEFAULT_ZERO_CHUNKS_IN_FLIGHT: usize = 4;
pub const ZERO_CHUNKS_IN_FLIGHT_MAX: usize = 64;

/// Bounds of `target.send_budget` (when not 0): one page, and far above any
/// socket buffer.
pub const SEND_BUDGET_MIN: u64 = 4 << 10;
pub const SEND_BUDGET_MAX: u64 = 64 << 20;

impl TargetConfig {
    /// The effective `max_connections_per_addr`.
    pub fn connections_per_addr(&self) -> usize {
        self.max_connections_per_addr
            .unwrap_or(self.max_connections / 4)
            .max(1)
    }
}

impl TargetConfig {
    /// Checks the DH-HMAC-CHAP bounds (`auth_*`).
    fn validate_auth(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("auth_per_conn_max", self.auth_per_conn_max),
            ("auth_per_host_per_sec", self.auth_per_host_per_sec),
            ("auth_per_host_burst", self.auth_per_host_burst),
        ] {
            anyhow::ensure!(
                (1..=AUTH_LIMIT_MAX).contains(&v),
                "target.{name} {v} is out of range: use 1..={AUTH_LIMIT_MAX}"
            );
        }
        anyhow::ensure!(
            (1..=AUTH_WORKERS_MAX).contains(&self.auth_workers),
            "target.auth_workers {} is out of range: use 1..={AUTH_WORKERS_MAX}",
            self.auth_workers
        );
        anyhow::ensure!(
            (1..=AUTH_LIMIT_MAX as usize).contains(&self.auth_queue_max),
            "target.auth_queue_max {} is out of range: use 1..={AUTH_LIMIT_MAX}",
            self.auth_queue_max
        );
        Ok(())
    }
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            reactors: 1,
            cpus: Vec::new(),
            max_io_size: ByteSize(1 << 20),
            slot_buffer_keep: ByteSize(128 << 10),
            large_buffer_budget: ByteSize(256 << 20),
            transfer_pool: ByteSize(DEFAULT_TRANSFER_POOL),
            data_wait_timeout_ms: DEFAULT_DATA_WAIT_TIMEOUT_MS,
            in_capsule_data: ByteSize(8 << 10),
            max_h2c_data: ByteSize(128 << 10),
            max_queue_depth: 128,
            max_io_queues: 16,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_addr: None,
            icreq_timeout_ms: DEFAULT_ICREQ_TIMEOUT_MS,
            tcp_keepalive_idle_s: DEFAULT_TCP_KEEPALIVE_IDLE_S,
            tcp_keepalive_interval_s: DEFAULT_TCP_KEEPALIVE_INTERVAL_S,
            tcp_keepalive_probes: DEFAULT_TCP_KEEPALIVE_PROBES,
            max_controllers: DEFAULT_MAX_CONTROLLERS,
            send_budget: ByteSize(0),
            zero_chunk: ByteSize(DEFAULT_ZERO_CHUNK),
            zero_chunks_in_flight: DEFAULT_ZERO_CHUNKS_IN_FLIGHT,
            idle_spin_us: 200,
            idle_sleep_ms: 10,
            discovery_idle_timeout_s: 120,
            connect_timeout_ms: 10_000,
            send_stall_timeout_ms: DEFAULT_SEND_STALL_TIMEOUT_MS,
            tls_handshake_timeout_ms: DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS,
            shutdown_grace_ms: 5_000,
            cntlid_min: 1,
            cntlid_max: MAX_CNTLID,
            max_registrants: crate::config::DEFAULT_MAX_REGISTRANTS,
            preempt_abort_timeout_ms: DEFAULT_PREEMPT_ABORT_TIMEOUT_MS,
            auth_per_conn_max: DEFAULT_AUTH_PER_CONN_MAX,
            auth_per_host_per_sec: DEFAULT_AUTH_PER_HOST_PER_SEC,
            auth_per_host_burst: DEFAULT_AUTH_PER_HOST_BURST,
            auth_workers: DEFAULT_AUTH_WORKERS,
            auth_queue_max: DEFAULT_AUTH_QUEUE_MAX,
            discovery_dhchap: false,
            log_burst: crate::sys::loglimit::DEFAULT_LOG_BURST,
            log_lines_per_sec: crate::sys::loglimit::DEFAULT_LOG_LINES_PER_SEC,
            socket_engine: SocketEngine::Epoll,
            state_dir: None,
        }
    }
}

impl TargetConfig {
    /// Checks every daemon-wide bound. Long (over 70 lines) on purpose: one
    /// `ensure!` per `[target]` key, in the struct's order, so a new key's
    /// check has one obvious place.
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        use anyhow::ensure;
        let t = self;
        ensure!(
            1 <= t.cntlid_min && t.cntlid_min <= t.cntlid_max && t.cntlid_max <= MAX_CNTLID,
            "target.cntlid_min = {} and cntlid_max = {}: use 1 <= cntlid_min <= cntlid_max <= {MAX_CNTLID} (65519)",
            t.cntlid_min,
            t.cntlid_max
        );
        let max_regs = crate::config::MAX_REGISTRANTS_LIMIT;
        ensure!(
            (1..=max_regs).contains(&t.max_registrants),
            "target.max_registrants = {}: use 1..={max_regs}",
            t.max_registrants
        );
        ensure!(
            t.reactors >= 1 && t.reactors <= 256,
            "target.reactors must be 1..=256"
        );
        let io = t.max_io_size.0;
        ensure!(
            io.is_power_of_two() && (4096..=MAX_IO_SIZE_LIMIT).contains(&io),
            "target.max_io_size must be a power of two in 4KiB..=8MiB"
        );
        ensure!(
            t.slot_buffer_keep.0 <= MAX_IO_SIZE_LIMIT,
            "target.slot_buffer_keep {} is above 8MiB: use at most max_io_size",
            t.slot_buffer_keep.0
        );
        ensure!(
            t.in_capsule_data.0.is_multiple_of(16) && t.in_capsule_data.0 <= 64 << 10,
            "target.in_capsule_data must be a multiple of 16 up to 64KiB"
        );
        let h2c = t.max_h2c_data.0;
        ensure!(
            h2c >= 4096 && h2c.is_multiple_of(4) && h2c <= 1 << 20,
            "target.max_h2c_data must be 4KiB..=1MiB and a multiple of 4"
        );
        ensure!(
            t.max_queue_depth >= 2 && t.max_queue_depth <= 4096,
            "target.max_queue_depth must be 2..=4096"
        );
        ensure!(
            t.max_io_queues >= 1 && t.max_io_queues <= 1024,
            "target.max_io_queues must be 1..=1024"
        );
        ensure!(
            (1..=MAX_CONNECTIONS_CEILING).contains(&t.max_connections),
            "target.max_connections {} is out of range: use 1..={MAX_CONNECTIONS_CEILING}",
            t.max_connections
        );
        let b = t.send_budget.0;
        ensure!(
            b == 0 || (SEND_BUDGET_MIN..=SEND_BUDGET_MAX).contains(&b),
            "target.send_budget {b} is out of range: 0 (no bound) or 4KiB..=64MiB, e.g. \"64KiB\""
        );
        let z = t.zero_chunk.0;
        ensure!(
            (ZERO_CHUNK_MIN..=ZERO_CHUNK_MAX).contains(&z) && z.is_multiple_of(4096),
            "target.zero_chunk {z} is out of range: a multiple of 4KiB in 1MiB..=1GiB, e.g. \"256MiB\""
        );
        ensure!(
            (1..=ZERO_CHUNKS_IN_FLIGHT_MAX).contains(&t.zero_chunks_in_flight),
            "target.zero_chunks_in_flight {} is out of range: use 1..={ZERO_CHUNKS_IN_FLIGHT_MAX}",
            t.zero_chunks_in_flight
        );
        ensure!(
            t.max_controllers >= 1 && t.max_controllers < 0xFFEF,
            "target.max_controllers out of range"
        );
        ensure!(
            (SEND_STALL_TIMEOUT_MS_MIN..=SEND_STALL_TIMEOUT_MS_MAX).contains(&t.send_stall_timeout_ms),
            "target.send_stall_timeout_ms {} is out of range: use {SEND_STALL_TIMEOUT_MS_MIN}..={SEND_STALL_TIMEOUT_MS_MAX}",
            t.send_stall_timeout_ms
        );
        ensure!(
            (TLS_HANDSHAKE_TIMEOUT_MS_MIN..=TLS_HANDSHAKE_TIMEOUT_MS_MAX).contains(&t.tls_handshake_timeout_ms),
            "target.tls_handshake_timeout_ms {} is out of range: use {TLS_HANDSHAKE_TIMEOUT_MS_MIN}..={TLS_HANDSHAKE_TIMEOUT_MS_MAX}",
            t.tls_handshake_timeout_ms
        );
        ensure!(
            (ICREQ_TIMEOUT_MS_MIN..=ICREQ_TIMEOUT_MS_MAX).contains(&t.icreq_timeout_ms),
            "target.icreq_timeout_ms {} is out of range: use {ICREQ_TIMEOUT_MS_MIN}..={ICREQ_TIMEOUT_MS_MAX}",
            t.icreq_timeout_ms
        );
        ensure!(
            t.tcp_keepalive_idle_s <= TCP_KEEPALIVE_S_MAX,
            "target.tcp_keepalive_idle_s {} is out of range: use 0 (off) ..={TCP_KEEPALIVE_S_MAX}",
            t.tcp_keepalive_idle_s
        );
        ensure!(
            (1..=TCP_KEEPALIVE_S_MAX).contains(&t.tcp_keepalive_interval_s),
            "target.tcp_keepalive_interval_s {} is out of range: use 1..={TCP_KEEPALIVE_S_MAX}",
            t.tcp_keepalive_interval_s
        );
        ensure!(
            (1..=TCP_KEEPALIVE_PROBES_MAX).contains(&t.tcp_keepalive_probes),
            "target.tcp_keepalive_probes {} is out of range: use 1..={TCP_KEEPALIVE_PROBES_MAX}",
            t.tcp_keepalive_probes
        );
        let dead_s = u64::from(t.tcp_keepalive_idle_s)
            + u64::from(t.tcp_keepalive_interval_s) * u64::from(t.tcp_keepalive_probes);
        ensure!(
            dead_s * 1000 <= i32::MAX as u64,
            "target.tcp_keepalive_idle_s + interval_s x probes is {dead_s} s: use at most {} s in all",
            i32::MAX as u64 / 1000
        );
        if let Some(n) = t.max_connections_per_addr {
            ensure!(
                n >= 1 && n <= t.max_connections,
                "target.max_connections_per_addr {n} is out of range: use 1..={} (max_connections), or leave it out for a quarter of it",
                t.max_connections
            );
        }
        ensure!(
            (DATA_WAIT_TIMEOUT_MS_MIN..=DATA_WAIT_TIMEOUT_MS_MAX).contains(&t.data_wait_timeout_ms),
            "target.data_wait_timeout_ms {} is out of range: use {DATA_WAIT_TIMEOUT_MS_MIN}..={DATA_WAIT_TIMEOUT_MS_MAX}",
            t.data_wait_timeout_ms
        );
        ensure!(
            (PREEMPT_ABORT_TIMEOUT_MS_MIN..=PREEMPT_ABORT_TIMEOUT_MS_MAX)
                .contains(&t.preempt_abort_timeout_ms),
            "target.preempt_abort_timeout_ms {} is out of range: use {PREEMPT_ABORT_TIMEOUT_MS_MIN}..={PREEMPT_ABORT_TIMEOUT_MS_MAX}",
            t.preempt_abort_timeout_ms
        );
        ensure!(
            t.idle_sleep_ms <= IDLE_SLEEP_MS_MAX
                && t.idle_sleep_ms.saturating_mul(2) <= t.preempt_abort_timeout_ms,
            "target.idle_sleep_ms {} is too long: use at most {IDLE_SLEEP_MS_MAX} and at most half of target.preempt_abort_timeout_ms ({}), or a sleeping reactor holds up every Preempt and Abort",
            t.idle_sleep_ms,
            t.preempt_abort_timeout_ms
        );
        t.validate_auth()?;
        use crate::sys::loglimit::LOG_LIMIT_MAX;
        for (name, v) in [
            ("log_burst", t.log_burst),
            ("log_lines_per_sec", t.log_lines_per_sec),
        ] {
            ensure!(
                (1..=LOG_LIMIT_MAX).contains(&v),
                "target.{name} {v} is out of range: use 1..={LOG_LIMIT_MAX}"
            );
        }
        // Every connection's share must fit the largest transfer, or a
        // command of that size would wait forever.
        let need = t.max_io_size.0.saturating_mul(TRANSFER_POOL_SHARE_DIV);
        ensure!(
            t.transfer_pool.0 >= need,
            "target.transfer_pool {} is too small: one connection may hold 1/{TRANSFER_POOL_SHARE_DIV} of it and that must fit max_io_size {}: use at least {need} bytes, e.g. \"{}MiB\"",
            t.transfer_pool.0,
            t.max_io_size.0,
            need.div_ceil(1 << 20)
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection index must fit the `u32` of a backend tag
    /// (`backend::tag::IoTag`): a bound above that is refused at load.
    #[test]
    fn max_connections_above_the_tag_s_ceiling_is_refused() {
        let mut t = TargetConfig {
            max_connections: MAX_CONNECTIONS_CEILING,
            ..TargetConfig::default()
        };
        t.validate().expect("the ceiling itself is allowed");
        t.max_connections = MAX_CONNECTIONS_CEILING + 1;
        let e = t.validate().expect_err("one above the ceiling");
        assert!(e.to_string().contains("max_connections"), "{e}");
        t.max_connections = 0;
        assert!(t.validate().is_err(), "zero connections");
    }

    #[test]
    fn an_idle_sleep_that_would_hold_up_preempt_and_abort_is_refused() {
        let mut t = TargetConfig::default();
        t.idle_sleep_ms = t.preempt_abort_timeout_ms / 2;
        t.validate().expect("half the preempt timeout is allowed");
        t.idle_sleep_ms += 1;
        let e = t.validate().expect_err("more than half");
        assert!(e.to_string().contains("target.idle_sleep_ms"), "{e}");
        t.preempt_abort_timeout_ms = PREEMPT_ABORT_TIMEOUT_MS_MAX;
        t.idle_sleep_ms = IDLE_SLEEP_MS_MAX + 1;
        assert!(t.validate().is_err(), "above the ceiling");
        // 2^31 ms and more used to wrap the epoll timeout to "forever".
        t.idle_sleep_ms = 1 << 31;
        assert!(t.validate().is_err());
    }
}
