//! What the node's integration tests share: a target on loopback ports, an
//! enabled controller, and read/write helpers.
//!
//! The initiator is `trellis_testkit::initiator::Queue`: ordinary commands
//! run through the host library's engine, and raw PDUs (for malformed
//! input) are sent and read with its raw methods.
#![allow(dead_code)]

use std::net::SocketAddr;
use trellis_node::config::{BackendKind, Config, ListenerConfig, NamespaceConfig, SubsystemConfig};
use trellis_nvme::fabrics::CNTLID_DYNAMIC;
use trellis_nvme::pdu::Digests;
use trellis_nvme::{Cqe, Sqe};
#[allow(unused_imports)] // Pdu: for tests that read raw PDUs by type name
pub use trellis_testkit::initiator::{Pdu, Queue};

pub const NQN: &str = "nqn.2026-11.io.trellis:test";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

/// A target on ephemeral loopback ports with one RAM namespace (16 MiB,
/// 512-byte blocks) that only `HOST` may use.
pub fn start_target() -> trellis_node::Target {
    start_target_with(trellis_node::config::SocketEngine::Epoll)
}

pub fn start_target_with(engine: trellis_node::config::SocketEngine) -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.target.socket_engine = engine;
    trellis_node::Target::start(&cfg).unwrap()
}

/// The test target's configuration around one namespace: an ephemeral
/// loopback listener, subsystem `NQN` that only `HOST` may use, and the
/// tests' own state directory.
pub fn test_config(ns: NamespaceConfig) -> Config {
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    cfg.subsystems = vec![SubsystemConfig {
        nqn: NQN.into(),
        serial: "TEST1".into(),
        model: "Trellis test".into(),
        allow_any_host: Some(false),
        allowed_hosts: vec![HOST.into()],
        hosts: vec![],
        namespaces: vec![ns],
        listeners: None,
    }];
    cfg.target.state_dir = Some(test_state_dir());
    cfg
}

/// Get Log Page `lid` for `nsid`, `len` bytes from offset 0.
#[allow(dead_code)] // not every test file reads log pages
pub fn get_log(q: &mut Queue, lid: u8, nsid: u32, len: u64) -> (trellis_nvme::Cqe, Vec<u8>) {
    let s = trellis_nvme::log::GetLogPage {
        lid,
        lsp: 0,
        rae: false,
        len_bytes: len,
        offset_bytes: 0,
    }
    .to_sqe(0, nsid);
    q.cmd(s, &[], len as usize, 0)
}

/// Where test targets keep their node identity: one shared directory
/// under the temp dir (concurrent targets take node-id, node-id.1, ...),
/// never the user's own state directory.
pub fn test_state_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("trellis-test-state")
}

/// An enabled controller: admin queue plus `ios` connected I/O queues.
pub struct Ctrl {
    pub admin: Queue,
    pub io: Vec<Queue>,
    pub cntlid: u16,
}

pub fn controller(addr: SocketAddr, subnqn: &str, ios: u16, dg: Digests, kato_ms: u32) -> Ctrl {
    controller_as(addr, subnqn, HOST, ios, dg, kato_ms)
}

/// Admin Connect as `hostnqn`, enable, and `ios` I/O queues.
pub fn controller_as(
    addr: SocketAddr,
    subnqn: &str,
    hostnqn: &str,
    ios: u16,
    dg: Digests,
    kato_ms: u32,
) -> Ctrl {
    let mut admin = Queue::open(addr, dg);
    let c = admin.fabrics_connect(0, 31, subnqn, hostnqn, CNTLID_DYNAMIC, kato_ms);
    assert!(c.status.is_success(), "admin connect: {:?}", c.status);
    let cntlid = c.dw0 as u16;
    admin.prop_get(0, true);
    assert!(admin.prop_set(0x14, 0x0046_0001).status.is_success());
    assert_eq!(admin.prop_get(0x1c, false) & 1, 1, "CSTS.RDY after CC.EN");
    let mut io = Vec::new();
    for qid in 1..=ios {
        let mut q = Queue::open(addr, dg);
        let c = q.fabrics_connect(qid, 127, subnqn, hostnqn, cntlid, 0);
        assert!(
            c.status.is_success(),
            "I/O connect qid {qid}: {:?}",
            c.status
        );
        io.push(q);
    }
    Ctrl { admin, io, cntlid }
}

pub fn read(q: &mut Queue, slba: u64, nlb: u32) -> (Cqe, Vec<u8>) {
    q.cmd(
        Sqe::rw(trellis_nvme::sqe::io::READ, 0, 1, slba, nlb, false),
        &[],
        nlb as usize * 512,
        8192,
    )
}

pub fn write(q: &mut Queue, slba: u64, data: &[u8]) -> Cqe {
    let nlb = (data.len() / 512) as u32;
    q.cmd(
        Sqe::rw(trellis_nvme::sqe::io::WRITE, 0, 1, slba, nlb, false),
        data,
        0,
        8192,
    )
    .0
}

/// Deterministic test pattern that encodes LBA and a generation.
pub fn pattern(slba: u64, blocks: usize, gen: u64) -> Vec<u8> {
    let mut v = vec![0u8; blocks * 512];
    for (i, w) in v.chunks_mut(8).enumerate() {
        let x = (slba * 64 + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ gen;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// A TCP connection to `dst` from source address `src` (any 127.0.0.0/8
/// address is local): one machine playing peers at several addresses.
pub fn connect_from(src: std::net::Ipv4Addr, dst: std::net::SocketAddr) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(dst) = dst else {
        panic!("IPv4 only")
    };
    let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; the
    // sockaddr_in values live across the calls that read them.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let a = sin(src, 0);
        let r = libc::bind(fd, &a as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "bind {src}: {}", std::io::Error::last_os_error());
        let b = sin(*dst.ip(), dst.port());
        let r = libc::connect(fd, &b as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "connect {dst}: {}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    }
}
