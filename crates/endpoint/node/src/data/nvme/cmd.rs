//! The command table: everything the target knows about an opcode, in one
//! row (in the spirit of Linux nvmet's `req->execute`).
//!
//! A command is parsed once, when its capsule arrives and before any R2T:
//! [`parse`] finds its row, checks where it may run, its data direction and
//! length, its namespace and read-only access, and prepares the backend
//! request. After the data has arrived, the transport calls the row's
//! handler with a transport-independent [`Request`]; handlers never validate
//! the same thing again. The Commands Supported and Effects log is generated
//! from these tables ([`effects_log`]), so what we advertise is what we serve.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item 8):
//! the tables are built at compile time, so their casts and indexing are
//! checked by the compiler (a panic in a `const` is a build error).
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::data::nvme::exec::{
    effect, on, Access, Check, Command, Dir, Handler, Len, Queue, QueueKind, Request,
};
use crate::data::nvme::io;
use trellis_nvme::fabrics::fctype;
use trellis_nvme::sqe::{admin as aop, io as iop};
use trellis_nvme::status::generic;
use trellis_nvme::{Sqe, Status};

const INVALID_OPCODE: Status = generic::INVALID_OPCODE.dnr();

/// A constant data length as a `u32`; only the tables below call it, in
/// `static` initialisers, so a length that does not fit fails the build.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the assert above the cast; evaluated at compile time (statics)"
)]
const fn len_u32(n: usize) -> u32 {
    assert!(
        n <= u32::MAX as usize,
        "a command's data length must fit a u32"
    );
    n as u32
}
const SEQUENCE: Status = generic::COMMAND_SEQUENCE_ERROR.dnr();

/// Fabrics commands (opcode 7Fh), by command type.
pub static FABRICS: &[Command] = &[
    Command {
        name: "Connect",
        opcode: aop::FABRICS,
        fctype: fctype::CONNECT,
        on: on::UNCONNECTED,
        misplaced: SEQUENCE,
        dir: Dir::ToCtrl,
        len: Len::Exact(len_u32(trellis_nvme::fabrics::CONNECT_DATA_LEN)),
        exec: Queue::connect,
        ..Command::NONE
    },
    Command {
        name: "Property Get",
        opcode: aop::FABRICS,
        fctype: fctype::PROPERTY_GET,
        on: on::ADMIN | on::DISCOVERY,
        misplaced: INVALID_OPCODE,
        exec: Queue::property_get,
        ..Command::NONE
    },
    Command {
        name: "Property Set",
        opcode: aop::FABRICS,
        fctype: fctype::PROPERTY_SET,
        on: on::ADMIN | on::DISCOVERY,
        misplaced: INVALID_OPCODE,
        exec: Queue::property_set,
        ..Command::NONE
    },
    Command {
        name: "Authentication Send",
        opcode: aop::FABRICS,
        fctype: fctype::AUTH_SEND,
        // Discovery too: with `target.discovery_dhchap` a keyed host
        // authenticates its discovery controller (nvmet parses these on
        // every admin queue; without a session they fail, `auth::session`).
        on: on::ADMIN | on::IO | on::DISCOVERY,
        misplaced: INVALID_OPCODE,
        dir: Dir::ToCtrl,
        len: Len::Any,
        exec: crate::data::nvme::auth::auth_send,
        ..Command::NONE
    },
    Command {
        name: "Authentication Receive",
        opcode: aop::FABRICS,
        fctype: fctype::AUTH_RECV,
        // Discovery too: with `target.discovery_dhchap` a keyed host
        // authenticates its discovery controller (nvmet parses these on
        // every admin queue; without a session they fail, `auth::session`).
        on: on::ADMIN | on::IO | on::DISCOVERY,
        misplaced: INVALID_OPCODE,
        dir: Dir::ToHost,
        len: Len::Any,
        exec: crate::data::nvme::auth::auth_receive,
        ..Command::NONE
    },
];

/// Admin commands. Discovery controllers serve the subset Linux nvmet's
/// discovery.c serves: Identify (controller), Get Log Page (discovery log),
/// Set/Get Features (KATO, async event config), AER and Keep Alive.
pub static ADMIN: &[Command] = ADMIN_ROWS;
const ADMIN_ROWS: &[Command] = &[
    admin_cmd(
        "Get Log Page",
        aop::GET_LOG_PAGE,
        true,
        Dir::ToHost,
        Len::LogPage,
        Queue::get_log_page,
    ),
    admin_cmd(
        "Identify",
        aop::IDENTIFY,
        true,
        Dir::ToHost,
        Len::Any,
        Queue::identify,
    ),
    admin_cmd(
        "Abort",
        aop::ABORT,
        false,
        Dir::None,
        Len::None,
        Queue::abort,
    ),
    admin_cmd(
        "Set Features",
        aop::SET_FEATURES,
        true,
        Dir::ToCtrl,
        Len::Any,
        Queue::set_features,
    ),
    admin_cmd(
        "Get Features",
        aop::GET_FEATURES,
        true,
        Dir::ToHost,
        Len::Any,
        Queue::get_features,
    ),
    admin_cmd(
        "Asynchronous Event Request",
        aop::ASYNC_EVENT_REQUEST,
        true,
        Dir::None,
        Len::None,
        Queue::async_event_request,
    ),
    admin_cmd(
        "Keep Alive",
        aop::KEEP_ALIVE,
        true,
        Dir::None,
        Len::None,
        Queue::keep_alive,
    ),
];

const fn admin_cmd(
    name: &'static str,
    opcode: u8,
    discovery: bool,
    dir: Dir,
    len: Len,
    exec: Handler,
) -> Command {
    Command {
        name,
        opcode,
        on: if discovery {
            on::ADMIN | on::DISCOVERY
        } else {
            on::ADMIN
        },
        needs_ready: true,
        dir,
        len,
        exec,
        ..Command::NONE
    }
}

/// NVM command set I/O commands.
pub static IO: &[Command] = IO_ROWS;
const IO_ROWS: &[Command] = &[
    io_cmd(
        "Flush",
        iop::FLUSH,
        Dir::None,
        Len::None,
        false,
        None,
        io::flush,
    ),
    io_cmd(
        "Write",
        iop::WRITE,
        Dir::ToCtrl,
        Len::Blocks,
        true,
        Some(io::check_write),
        io::write,
    ),
    io_cmd(
        "Read",
        iop::READ,
        Dir::ToHost,
        Len::Blocks,
        false,
        Some(io::check_read),
        io::read,
    ),
    io_cmd(
        "Write Zeroes",
        iop::WRITE_ZEROES,
        Dir::None,
        Len::None,
        true,
        Some(io::check_write_zeroes),
        io::write_zeroes,
    ),
    io_cmd(
        "Dataset Management",
        iop::DATASET_MANAGEMENT,
        Dir::ToCtrl,
        Len::Ranges,
        true,
        None,
        io::dataset_management,
    ),
    resv_cmd(
        "Reservation Register",
        iop::RESV_REGISTER,
        Dir::ToCtrl,
        Len::Exact(len_u32(trellis_nvme::resv::KEYS_LEN)),
        io::resv_register,
    ),
    resv_cmd(
        "Reservation Report",
        iop::RESV_REPORT,
        Dir::ToHost,
        Len::Any,
        io::resv_report,
    ),
    resv_cmd(
        "Reservation Acquire",
        iop::RESV_ACQUIRE,
        Dir::ToCtrl,
        Len::Exact(len_u32(trellis_nvme::resv::KEYS_LEN)),
        io::resv_acquire,
    ),
    resv_cmd(
        "Reservation Release",
        iop::RESV_RELEASE,
        Dir::ToCtrl,
        Len::Exact(len_u32(trellis_nvme::resv::CRKEY_LEN)),
        io::resv_release,
    ),
];

/// A reservation command: on I/O queues, for one namespace, never itself
/// denied by a reservation.
const fn resv_cmd(name: &'static str, opcode: u8, dir: Dir, len: Len, exec: Handler) -> Command {
    Command {
        name,
        opcode,
        on: on::IO,
        needs_ready: true,
        dir,
        len,
        needs_ns: true,
        exec,
        ..Command::NONE
    }
}

const fn io_cmd(
    name: &'static str,
    opcode: u8,
    dir: Dir,
    len: Len,
    media_write: bool,
    check: Option<Check>,
    exec: Handler,
) -> Command {
    Command {
        name,
        opcode,
        on: on::IO,
        needs_ready: true,
        dir,
        len,
        needs_ns: true,
        media_write,
        icd_in_place: opcode == iop::WRITE,
        effects: if media_write { effect::LBCC } else { 0 },
        // Read is the read group; Write, Write Zeroes, DSM and Flush the
        // write group (NVM Command Set spec, reservation command groups).
        access: if opcode == iop::READ {
            Access::Read
        } else {
            Access::Write
        },
        check,
        exec,
        ..Command::NONE
    }
}

/// Row index by opcode (`NO_ROW`: none), built at compile time from a
/// table, so finding a row costs one load instead of a scan per command.
#[allow(
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    reason = "run only in the statics below, at compile time: i < rows.len(), \
              an opcode (u8) indexes 256 entries, and the assert keeps i below \
              NO_ROW; any failure is a build error"
)]
const fn index(rows: &[Command]) -> [u8; 256] {
    assert!(rows.len() < NO_ROW as usize, "too many rows for a u8 index");
    let mut ix = [NO_ROW; 256];
    let mut i = 0;
    while i < rows.len() {
        ix[rows[i].opcode as usize] = i as u8;
        i += 1;
    }
    ix
}
const NO_ROW: u8 = u8::MAX;
static ADMIN_INDEX: [u8; 256] = index(ADMIN_ROWS);
static IO_INDEX: [u8; 256] = index(IO_ROWS);

/// Where this queue is, as an [`on`] bit.
fn place(q: &Queue) -> u8 {
    match q.q.as_ref() {
        None => on::UNCONNECTED,
        Some(c) if c.kind == QueueKind::Io => on::IO,
        Some(c) if c.ctrl.is_discovery() => on::DISCOVERY,
        Some(_) => on::ADMIN,
    }
}

/// The row for `sqe` on this queue, or the status to fail it with.
pub fn find(q: &Queue, sqe: &Sqe) -> Result<&'static Command, Status> {
    let here = place(q);
    let op = sqe.opcode();
    #[allow(
        clippy::indexing_slicing,
        reason = "op is a u8 and the index tables have 256 entries"
    )]
    let row = if op == aop::FABRICS {
        FABRICS.iter().find(|c| c.fctype == sqe.fctype())
    } else if here == on::IO {
        IO.get(IO_INDEX[op as usize] as usize)
    } else {
        ADMIN.get(ADMIN_INDEX[op as usize] as usize)
    };
    match row {
        Some(c) if c.on & here != 0 && crate::data::nvme::auth::refuses(q, c) => {
            Err(trellis_nvme::status::specific::AUTH_REQUIRED.dnr())
        }
        Some(c) if c.on & here != 0 => Ok(c),
        Some(c) if here != on::UNCONNECTED => Err(c.misplaced),
        // Only Connect may come first on a queue.
        _ if here == on::UNCONNECTED => Err(SEQUENCE),
        _ => Err(INVALID_OPCODE),
    }
}

/// Data direction of an opcode nobody implements (from its low bits), used
/// only to pick the right error for a malformed transfer.
pub fn opcode_dir(sqe: &Sqe) -> Dir {
    let bits = if sqe.opcode() == aop::FABRICS {
        sqe.fctype() & 0x3
    } else {
        sqe.opcode() & 0x3
    };
    match bits {
        1 => Dir::ToCtrl,
        2 => Dir::ToHost,
        _ => Dir::None,
    }
}

/// Everything that can be checked before data moves: controller state,
/// namespace, read-only access, transfer length, command-specific checks.
/// `req.cmd` and `req.xfer_len` are already set.
pub fn parse(q: &Queue, req: &mut Request) -> Result<(), Status> {
    let cmd = req.cmd;
    if cmd.needs_ready {
        if let Some(c) = q.q.as_ref() {
            if !c.ctrl.ready() {
                // nvmet answers Invalid Opcode on a disabled discovery controller.
                return Err(if c.ctrl.is_discovery() {
                    INVALID_OPCODE
                } else {
                    SEQUENCE
                });
            }
        }
    }
    match cmd.len {
        Len::Exact(n) if req.xfer_len != n => return Err(generic::DATA_SGL_LENGTH_INVALID.dnr()),
        Len::LogPage => {
            let lp = trellis_nvme::log::GetLogPage::decode(&req.sqe);
            if lp.len_bytes != req.xfer_len as u64 {
                return Err(generic::DATA_SGL_LENGTH_INVALID.dnr());
            }
        }
        _ => {}
    }
    if !cmd.needs_ns {
        return Ok(());
    }
    let ns = q
        .namespace(req.sqe.nsid())
        .ok_or(generic::INVALID_NAMESPACE.dnr())?;
    // A uid is never reused, so it is not bounded by the namespace count:
    // one past u32 (or NO_NS itself) would name another namespace, or none.
    req.ns_uid = u32::try_from(ns.uid())
        .ok()
        .filter(|&u| u != crate::data::nvme::exec::NO_NS)
        .ok_or(generic::INTERNAL_ERROR.dnr())?;
    // ANA (NVMe Base 2.0 §8.1.1): I/O through a listener whose path to the
    // namespace's group is inaccessible, lost or changing fails with a path
    // status and does no I/O; admin commands still run. One relaxed load.
    if cmd.on & on::IO != 0 {
        if let Some(st) = q.reg.ana().io_status(q.portid, ns.ana_idx()) {
            return Err(st);
        }
        // Reservations (§8.19): one load while none is held on the namespace.
        if ns.resv().any_held() && cmd.access != Access::None {
            resv_check(q, ns, cmd.access)?;
        }
    }
    if cmd.media_write && ns.read_only() {
        return Err(generic::NS_WRITE_PROTECTED.dnr());
    }
    if let Some(check) = cmd.check {
        check(ns, req)?;
    }
    match cmd.len {
        Len::Blocks if req.io.len_bytes != req.xfer_len as u64 => {
            Err(generic::DATA_SGL_LENGTH_INVALID.dnr())
        }
        Len::Ranges if (req.xfer_len as usize) < io::dsm_ranges(&req.sqe) * io::DSM_RANGE_BYTES => {
            Err(generic::DATA_SGL_LENGTH_INVALID.dnr())
        }
        _ => Ok(()),
    }
}

/// A reservation is held on `ns`: may this queue's host run a command of
/// the `access` group?
#[cold]
fn resv_check(
    q: &Queue,
    ns: &crate::state::subsystem::Namespace,
    access: Access,
) -> Result<(), Status> {
    let host = q.q.as_ref().map(|c| c.ctrl.resv_host()).unwrap_or_default();
    ns.resv().check_io(&host, access == Access::Write)
}

/// The Commands Supported and Effects log (LID 05h) of an NVM controller,
/// generated from the tables.
pub fn effects_log(page: &mut [u8]) {
    let admin: Vec<(u8, u32)> = ADMIN
        .iter()
        .filter(|c| c.on & on::ADMIN != 0)
        .map(|c| (c.opcode, effect::CSUPP | c.effects))
        .collect();
    let io: Vec<(u8, u32)> = IO
        .iter()
        .map(|c| (c.opcode, effect::CSUPP | c.effects))
        .collect();
    trellis_nvme::log::encode_commands_effects(&admin, &io, page);
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    reason = "tests: a panic is a failed test"
)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_has_one_row_per_table() {
        for t in [ADMIN, IO] {
            for (i, a) in t.iter().enumerate() {
                assert!(
                    t[i + 1..].iter().all(|b| b.opcode != a.opcode),
                    "{} twice",
                    a.name
                );
            }
        }
        for (i, a) in FABRICS.iter().enumerate() {
            assert!(
                FABRICS[i + 1..].iter().all(|b| b.fctype != a.fctype),
                "{} twice",
                a.name
            );
        }
    }

    #[test]
    fn table_directions_match_opcode_bits() {
        // The spec encodes the direction in the opcode; a row that disagrees is a typo.
        for c in ADMIN.iter().chain(IO).chain(FABRICS) {
            // The Fabrics command type sits in byte 4, where NSID starts.
            let sqe = Sqe::new(c.opcode, 0, c.fctype as u32);
            assert_eq!(opcode_dir(&sqe), c.dir, "{}", c.name);
        }
    }

    #[test]
    fn effects_log_lists_exactly_the_table() {
        let mut page = vec![0u8; 4096];
        effects_log(&mut page);
        let word = |i: usize| u32::from_le_bytes(page[i * 4..i * 4 + 4].try_into().unwrap());
        for op in 0..=255u8 {
            let admin = ADMIN
                .iter()
                .find(|c| c.opcode == op && c.on & on::ADMIN != 0);
            assert_eq!(
                word(op as usize) & 1,
                admin.is_some() as u32,
                "admin {op:#x}"
            );
            let io = IO.iter().find(|c| c.opcode == op);
            let want = io.map_or(0, |c| 1 | c.effects);
            assert_eq!(word(256 + op as usize), want, "io {op:#x}");
        }
        // Writers change logical block content; Read does not.
        assert_eq!(word(256 + iop::WRITE as usize) & effect::LBCC, effect::LBCC);
        assert_eq!(word(256 + iop::READ as usize) & effect::LBCC, 0);
    }
}
