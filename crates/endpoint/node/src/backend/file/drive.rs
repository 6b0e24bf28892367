//! The health of the NVMe drive behind a block-device namespace, read from
//! the drive itself: its SMART / Health log (02h) through the kernel's NVMe
//! admin passthrough (`NVME_IOCTL_ADMIN_CMD` on `/dev/nvmeN`, as `nvme
//! smart-log` does), so the target's SMART page carries the drive's
//! temperature, critical warnings, spare, wear and media errors instead of
//! inventing them.
//!
//! A reactor never talks to the drive: the health thread refreshes the
//! reading every second (`Backend::refresh_health`), and the SMART page a
//! host asks for is served from it, since a command to a slow drive could
//! hold a reactor for the ioctl's whole timeout.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use trellis_nvme::log::{Smart, SMART_LEN};

/// The drive must answer within this (the ioctl's own timeout).
const PASSTHRU_TIMEOUT_MS: u32 = 1_000;

/// `struct nvme_passthru_cmd` (include/uapi/linux/nvme_ioctl.h), 72 bytes.
#[repr(C)]
#[derive(Default)]
struct PassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

/// `NVME_IOCTL_ADMIN_CMD` = `_IOWR('N', 0x41, struct nvme_admin_cmd)`.
const NVME_IOCTL_ADMIN_CMD: libc::c_ulong = 0xC048_4E41;
const _: () = assert!(std::mem::size_of::<PassthruCmd>() == 72);

/// The drive's controller character device for block device `rdev`, when
/// the device is an NVMe namespace (`sys::thermal::nvme_controller_dir`:
/// a partition's is its disk's, a multipath namespace's its first
/// controller's).
pub fn nvme_controller_of(rdev: u64) -> Option<PathBuf> {
    let dir = crate::sys::thermal::nvme_controller_dir(rdev)?;
    let name = dir.file_name()?;
    Path::new("/sys/class/nvme")
        .join(name)
        .exists()
        .then(|| PathBuf::from("/dev").join(name))
}

/// The command that reads the SMART log of the whole controller.
fn get_smart_cmd(buf: &mut [u8; SMART_LEN]) -> PassthruCmd {
    let numd = (SMART_LEN / 4 - 1) as u32; // dwords − 1 (0's based)
    PassthruCmd {
        opcode: 0x02, // Get Log Page
        nsid: 0xFFFF_FFFF,
        addr: buf.as_mut_ptr() as u64,
        data_len: SMART_LEN as u32,
        cdw10: u32::from(trellis_nvme::log::lid::SMART) | ((numd & 0xFFFF) << 16),
        cdw11: numd >> 16,
        timeout_ms: PASSTHRU_TIMEOUT_MS,
        ..Default::default()
    }
}

/// Reads the drive's SMART log through `ctrl` (`/dev/nvmeN`).
pub fn read_smart(ctrl: &Path) -> std::io::Result<Smart> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(ctrl)?;
    let mut page = [0u8; SMART_LEN];
    let mut cmd = get_smart_cmd(&mut page);
    // SAFETY: `cmd` is a live nvme_passthru_cmd whose addr/data_len name
    // `page`, which outlives the call; the kernel writes at most data_len
    // bytes there and the command's result into `cmd`.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), NVME_IOCTL_ADMIN_CMD as _, &mut cmd) };
    match rc {
        0 => Ok(Smart::decode(&page)),
        r if r < 0 => Err(std::io::Error::last_os_error()),
        st => Err(std::io::Error::other(format!(
            "the drive answered status {st:#x}"
        ))),
    }
}

/// A drive's SMART log as last read by [`DriveSmart::refresh`].
#[derive(Debug)]
pub struct DriveSmart {
    ctrl: PathBuf,
    cache: Mutex<Option<Smart>>,
}

impl DriveSmart {
    pub fn new(ctrl: PathBuf) -> DriveSmart {
        DriveSmart {
            ctrl,
            cache: Mutex::new(None),
        }
    }

    /// The last reading (None before the first, or when the drive did
    /// not answer it).
    pub fn get(&self) -> Option<Smart> {
        *crate::sys::lock(&self.cache)
    }

    /// Reads the drive again (the health thread's, and once at open): a
    /// failure is logged at debug, since a drive that cannot be read is not
    /// an error of the data path, and leaves no reading.
    pub fn refresh(&self) {
        let s = match read_smart(&self.ctrl) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!("{}: cannot read the SMART log: {e}", self.ctrl.display());
                None
            }
        };
        *crate::sys::lock(&self.cache) = s;
    }
}

/// Folds a drive's own SMART page into the target's: its warnings, spare,
/// wear and temperature are the drive's; its media errors are the larger
/// count (the drive's is over its life, ours since start).
pub fn merge(into: &mut Smart, drive: &Smart) {
    into.critical_warning |= drive.critical_warning;
    into.available_spare_pct = into.available_spare_pct.min(drive.available_spare_pct);
    into.percent_used = into.percent_used.max(drive.percent_used);
    into.media_errors = into.media_errors.max(drive.media_errors);
    if drive.temperature_k != 0 {
        into.temperature_k = into.temperature_k.max(drive.temperature_k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SMART page as a worn drive returns it (the layout of NVMe Base 2.0
    /// Figure 207: byte 0 critical warning, 1–2 temperature, 3 spare, 4
    /// threshold, 5 percentage used, 160.. media errors), built byte by byte
    /// as a drive sends it rather than through our encoder.
    fn recorded_page() -> [u8; SMART_LEN] {
        let mut p = [0u8; SMART_LEN];
        p[0] = 0x05; // spare below threshold, reliability degraded
        p[1..3].copy_from_slice(&318u16.to_le_bytes()); // 45 °C
        p[3] = 7; // available spare %
        p[4] = 10; // threshold %
        p[5] = 103; // percentage used: past the rated life
        p[160..176].copy_from_slice(&42u128.to_le_bytes());
        p
    }

    #[test]
    fn a_drives_page_is_decoded_and_merged_over_the_targets() {
        let d = Smart::decode(&recorded_page());
        assert_eq!(
            (
                d.critical_warning,
                d.temperature_k,
                d.available_spare_pct,
                d.percent_used
            ),
            (0x05, 318, 7, 103)
        );
        assert_eq!(d.media_errors, 42);
        let mut ours = Smart {
            available_spare_pct: 100,
            temperature_k: 308,
            media_errors: 3,
            ..Default::default()
        };
        merge(&mut ours, &d);
        assert_eq!(ours.critical_warning, 0x05);
        assert_eq!(ours.available_spare_pct, 7);
        assert_eq!(ours.percent_used, 103);
        assert_eq!(ours.media_errors, 42);
        assert_eq!(ours.temperature_k, 318);
    }

    #[test]
    fn a_drive_without_a_temperature_keeps_ours() {
        let mut ours = Smart {
            temperature_k: 308,
            available_spare_pct: 100,
            ..Default::default()
        };
        merge(&mut ours, &Smart::default());
        assert_eq!(ours.temperature_k, 308);
    }

    #[test]
    fn the_passthrough_command_asks_for_the_whole_page_of_the_controller() {
        let mut page = [0u8; SMART_LEN];
        let c = get_smart_cmd(&mut page);
        assert_eq!(c.opcode, 0x02);
        assert_eq!(c.nsid, 0xFFFF_FFFF);
        assert_eq!(c.cdw10 & 0xFF, 0x02, "LID 02h");
        assert_eq!((c.cdw10 >> 16) + 1, 128, "128 dwords = 512 bytes");
        assert_eq!(c.data_len, 512);
    }

    #[test]
    fn no_nvme_controller_is_found_behind_a_virtio_disk_or_a_bogus_number() {
        // This VM's disks are virtio: no drive passthrough here.
        assert_eq!(nvme_controller_of(libc::makedev(4095, 4095)), None);
    }
}
