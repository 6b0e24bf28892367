//! Temperature sensors in sysfs, for the SMART log's Composite Temperature.
//!
//! A block device (or the device under a file's file system) that is an
//! NVMe drive has the drive's own Composite Temperature under its
//! controller's hwmon (`/sys/dev/block/M:m/device/hwmon*/temp1_input`,
//! Linux `drivers/nvme/host/hwmon.c`, since 5.5; a partition's is its
//! disk's). Otherwise the node's sensors (`/sys/class/hwmon/*/temp*_input`,
//! `/sys/class/thermal/thermal_zone*/temp`) stand for the controller, which
//! is this node's CPU. Values are millidegrees Celsius.

use std::path::{Path, PathBuf};

/// Sensor files looked at, at most (a bound on the directory walk).
pub const MAX_SENSORS: usize = 64;
/// Composite Temperature reported where no sensor exists (a VM, RAM or a
/// virtio disk): [R] 308 K (35 °C), an idle drive in a cooled chassis. The
/// NVMe field has no "not reported" value (0 would read as 0 K, −273 °C),
/// so the target says at start that it reports this nominal value.
pub const NO_SENSOR_TEMPERATURE_K: u16 = 308;
/// Readings outside this range (°C) are taken as a broken sensor.
const PLAUSIBLE_C: std::ops::RangeInclusive<i64> = -40..=200;

/// Kelvin from a sysfs reading in millidegrees Celsius, rounded; None for a
/// reading that cannot be a real temperature.
pub fn kelvin_from_millicelsius(text: &str) -> Option<u16> {
    let mc: i64 = text.trim().parse().ok()?;
    if !PLAUSIBLE_C.contains(&(mc / 1000)) {
        return None;
    }
    u16::try_from((mc + 273_150 + 500).div_euclid(1000)).ok()
}

/// The hottest plausible reading of `paths`, in kelvin.
pub fn hottest_k(paths: &[PathBuf]) -> Option<u16> {
    paths
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|t| kelvin_from_millicelsius(&t))
        .max()
}

/// Whether `name` is an NVMe controller's (`nvme0`, not `nvme0n1`).
fn is_nvme_ctrl(name: &str) -> bool {
    name.strip_prefix("nvme")
        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
}

/// The sysfs directory of the NVMe controller behind device number `dev`
/// (a block device's `st_rdev`, or a file's `st_dev`; a partition's is its
/// disk's). With native multipath a namespace's `device` is its
/// subsystem (`nvme-subsysN`, a dual-ported drive): its first controller.
pub fn nvme_controller_dir(dev: u64) -> Option<PathBuf> {
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let base = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    for d in [base.join("device"), base.join("../device")] {
        let Ok(target) = std::fs::canonicalize(&d) else {
            continue;
        };
        let name = target.file_name()?.to_string_lossy().into_owned();
        if is_nvme_ctrl(&name) {
            return Some(target);
        }
        if name.starts_with("nvme-subsys") {
            return dir_entries(&target, "nvme").into_iter().find(|c| {
                c.file_name()
                    .is_some_and(|n| is_nvme_ctrl(&n.to_string_lossy()))
            });
        }
    }
    None
}

/// The Composite Temperature sensor of the NVMe drive behind device
/// number `dev` (a block device's `st_rdev`, or a file's `st_dev`), if any.
pub fn device_sensors(dev: u64) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(ctrl) = nvme_controller_dir(dev) {
        for hw in dir_entries(&ctrl, "hwmon") {
            let t = hw.join("temp1_input");
            if t.exists() && out.len() < MAX_SENSORS {
                out.push(t);
            }
        }
    }
    out
}

/// The node's temperature sensors (hwmon, thermal zones), at most
/// [`MAX_SENSORS`].
pub fn node_sensors() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for hw in dir_entries(Path::new("/sys/class/hwmon"), "hwmon") {
        for t in dir_entries(&hw, "temp") {
            let input = t.to_string_lossy().ends_with("_input");
            if input && out.len() < MAX_SENSORS {
                out.push(t);
            }
        }
    }
    for z in dir_entries(Path::new("/sys/class/thermal"), "thermal_zone") {
        if out.len() < MAX_SENSORS {
            out.push(z.join("temp"));
        }
    }
    out
}

/// Entries of `dir` whose names start with `prefix`, sorted, at most
/// [`MAX_SENSORS`].
fn dir_entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .take(MAX_SENSORS)
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millidegrees_become_rounded_kelvin_and_nonsense_is_refused() {
        assert_eq!(kelvin_from_millicelsius("35000\n"), Some(308));
        assert_eq!(kelvin_from_millicelsius("0"), Some(273));
        assert_eq!(kelvin_from_millicelsius("-5000"), Some(268));
        assert_eq!(kelvin_from_millicelsius("44850"), Some(318));
        assert_eq!(kelvin_from_millicelsius("250000"), None, "250 °C");
        assert_eq!(kelvin_from_millicelsius("-273150"), None, "0 K");
        assert_eq!(kelvin_from_millicelsius("hot"), None);
    }

    #[test]
    fn controller_names_are_told_from_namespace_names() {
        assert!(is_nvme_ctrl("nvme0") && is_nvme_ctrl("nvme12"));
        assert!(!is_nvme_ctrl("nvme0n1") && !is_nvme_ctrl("nvme") && !is_nvme_ctrl("nvme-subsys0"));
    }

    #[test]
    fn the_hottest_readable_sensor_wins() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
        std::fs::write(&a, "41000\n").unwrap();
        std::fs::write(&b, "52000\n").unwrap();
        std::fs::write(&c, "garbage").unwrap();
        let missing = d.path().join("missing");
        assert_eq!(hottest_k(&[a, b, c, missing]), Some(325));
        assert_eq!(hottest_k(&[]), None);
    }
}
