//! NVMe completion status: status code type (SCT), status code (SC), DNR.

/// A completion status as carried in CQE bytes 14..16 (without the phase bit).
///
/// Stored as the 15-bit value Linux uses: `SC | SCT << 8 | CRD << 11 | M << 13 | DNR << 14`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u16);

impl Status {
    pub const SUCCESS: Status = Status(0);

    /// A status with the given type and code, without DNR.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status(((sct as u16 & 0x7) << 8) | sc as u16)
    }
    /// The same status with Do Not Retry set: use on every permanent error, or
    /// the Linux host retries up to five times (and reconnects forever on
    /// Connect errors).
    pub const fn dnr(self) -> Status {
        Status(self.0 | 0x4000)
    }
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }
    pub const fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }
    pub const fn is_dnr(self) -> bool {
        self.0 & 0x4000 != 0
    }
    pub const fn is_success(self) -> bool {
        self.0 & 0x7ff == 0
    }
    /// The CQE status field: the 15-bit value shifted over the phase bit (0).
    pub const fn to_wire(self) -> u16 {
        self.0 << 1
    }
    pub const fn from_wire(v: u16) -> Status {
        Status(v >> 1)
    }

    /// Human name of the status (for logs and error messages).
    pub fn name(self) -> &'static str {
        match (self.sct(), self.sc()) {
            (0, 0x00) => "Success",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x0B) => "Invalid Namespace or Format",
            (0, 0x0C) => "Command Sequence Error",
            (0, 0x0D) => "Invalid SGL Segment Descriptor",
            (0, 0x0F) => "Data SGL Length Invalid",
            (0, 0x11) => "SGL Descriptor Type Invalid",
            (0, 0x16) => "SGL Offset Invalid",
            (0, 0x18) => "Host Identifier Inconsistent Format",
            (0, 0x1A) => "Keep Alive Timer Expired",
            (0, 0x20) => "Namespace is Write Protected",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x81) => "Capacity Exceeded",
            (0, 0x82) => "Namespace Not Ready",
            (0, 0x83) => "Reservation Conflict",
            (1, 0x02) => "Invalid Field (Features)",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0D) => "Feature Identifier Not Saveable",
            (1, 0x80) => "Connect Incompatible Format",
            (1, 0x81) => "Connect Controller Busy",
            (1, 0x82) => "Connect Invalid Parameters",
            (1, 0x83) => "Connect Restart Discovery",
            (1, 0x84) => "Connect Invalid Host",
            (1, 0x91) => "Authentication Required",
            (2, 0x80) => "Write Fault",
            (2, 0x81) => "Unrecovered Read Error",
            (2, 0x86) => "Access Denied",
            (3, 0x00) => "Internal Path Error",
            (3, 0x01) => "Asymmetric Access Persistent Loss",
            (3, 0x02) => "Asymmetric Access Inaccessible",
            (3, 0x03) => "Asymmetric Access Transition",
            _ => "Unknown Status",
        }
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sct {:#x} sc {:#04x}{})",
            self.name(),
            self.sct(),
            self.sc(),
            if self.is_dnr() { " dnr" } else { "" }
        )
    }
}
impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Generic command status (SCT 0).
pub mod generic {
    use super::Status;
    pub const INVALID_OPCODE: Status = Status::new(0, 0x01);
    pub const INVALID_FIELD: Status = Status::new(0, 0x02);
    pub const DATA_TRANSFER_ERROR: Status = Status::new(0, 0x04);
    pub const INTERNAL_ERROR: Status = Status::new(0, 0x06);
    pub const ABORTED_SQ_DELETION: Status = Status::new(0, 0x08);
    pub const INVALID_NAMESPACE: Status = Status::new(0, 0x0B);
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(0, 0x0C);
    pub const SGL_DESCRIPTOR_INVALID: Status = Status::new(0, 0x0D);
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::new(0, 0x0F);
    pub const SGL_TYPE_INVALID: Status = Status::new(0, 0x11);
    pub const SGL_OFFSET_INVALID: Status = Status::new(0, 0x16);
    /// A Reservation Report without the extended data structure from a
    /// host with a 128-bit host identifier (NVMe Base 2.0, Reservation Report).
    pub const HOST_ID_INCONSISTENT: Status = Status::new(0, 0x18);
    pub const KEEP_ALIVE_INVALID: Status = Status::new(0, 0x1A);
    pub const NS_WRITE_PROTECTED: Status = Status::new(0, 0x20);
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::new(0, 0x22);
    pub const LBA_OUT_OF_RANGE: Status = Status::new(0, 0x80);
    pub const CAPACITY_EXCEEDED: Status = Status::new(0, 0x81);
    pub const NS_NOT_READY: Status = Status::new(0, 0x82);
    /// NVM command set generic status 83h (§8.19).
    pub const RESERVATION_CONFLICT: Status = Status::new(0, 0x83);
}

/// Command-specific status (SCT 1).
pub mod specific {
    use super::Status;
    pub const INVALID_LOG_PAGE: Status = Status::new(1, 0x09);
    pub const AER_LIMIT_EXCEEDED: Status = Status::new(1, 0x05);
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(1, 0x0D);
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::new(1, 0x80);
    pub const CONNECT_CTRL_BUSY: Status = Status::new(1, 0x81);
    pub const CONNECT_INVALID_PARAMS: Status = Status::new(1, 0x82);
    pub const CONNECT_INVALID_HOST: Status = Status::new(1, 0x84);
    /// A command other than Authentication Send/Receive on a queue that
    /// has not completed in-band authentication (NVMe Base 2.0 §8.13).
    pub const AUTH_REQUIRED: Status = Status::new(1, 0x91);
}

/// Media and data integrity errors (SCT 2).
pub mod media {
    use super::Status;
    pub const WRITE_FAULT: Status = Status::new(2, 0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::new(2, 0x81);
}

/// Path related status (SCT 3; NVMe Base 2.0, Path Related Status): the command
/// failed on this path only, so hosts retry it on another (Linux
/// `nvme_is_path_error`) and re-read the ANA log.
pub mod path {
    use super::Status;
    pub const ANA_PERSISTENT_LOSS: Status = Status::new(3, 0x01);
    pub const ANA_INACCESSIBLE: Status = Status::new(3, 0x02);
    pub const ANA_TRANSITION: Status = Status::new(3, 0x03);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_layout_puts_sc_at_bit1_sct_at_bit9_dnr_at_bit15() {
        let s = generic::LBA_OUT_OF_RANGE.dnr();
        assert_eq!(s.to_wire(), (0x80 << 1) | 0x8000);
        let c = specific::CONNECT_INVALID_HOST.dnr();
        assert_eq!(c.to_wire(), (0x84 << 1) | (1 << 9) | 0x8000);
        assert_eq!(Status::from_wire(c.to_wire()), c);
        assert!(c.is_dnr() && !c.is_success());
        assert_eq!(c.sct(), 1);
        assert_eq!(c.sc(), 0x84);
    }
}
