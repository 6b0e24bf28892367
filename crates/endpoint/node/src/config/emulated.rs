//! `backend = "emulated"`: the emulated SSD's keys of a
//! `[[subsystem.namespace]]` table (profile, precondition, time_scale),
//! read and checked once. The backend itself is `backend::emulated`.

use trellis_ssd::fault::{FaultKind, FaultPlan};
use trellis_ssd::{Precondition, SsdProfile};

/// Profile used when a namespace names none.
pub const DEFAULT_PROFILE: &str = "pm9a3-gen4";
/// Largest accepted `time_scale` (a 60 µs read then takes 60 ms).
pub const MAX_TIME_SCALE: f64 = 1000.0;
/// `fragmented`: after the sequential fill, random 4 KiB overwrites of this
/// share (‰) of the capacity, as `trellis sim reproduce nsdi26` does.
pub const FRAGMENTED_OVERWRITE_PERMILLE: u32 = 1000;
/// Largest `wear_acceleration`: one erase wears a block out.
pub const MAX_WEAR_ACCELERATION: u32 = 1_000_000;

/// Largest `age_acceleration`: a day of drive age in 86 ms.
pub const MAX_AGE_ACCELERATION: f64 = 1_000_000.0;
/// Longest `fault_onset_days` and `fault_ramp_days`: ten years.
pub const MAX_FAULT_DAYS: f64 = 3_650.0;
const NS_PER_DAY: f64 = 86_400e9;

/// The validated emulation parameters of one namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatedParams {
    pub profile: SsdProfile,
    pub precondition: Precondition,
    pub time_scale: f64,
    /// An injected failure, on the drive's age clock.
    pub fault: Option<FaultPlan>,
    /// Drive age per wall time (≥ 1).
    pub age_acceleration: f64,
    /// Data in this file (a shared mapping: two targets on one machine may
    /// serve one drive, as an HA pair does a dual-ported one); else in RAM.
    pub path: Option<String>,
}

impl EmulatedParams {
    /// Reads and checks the emulation fields; they are refused on other
    /// backends, where they would silently do nothing.
    pub fn from_config(n: &crate::config::NamespaceConfig) -> Result<Option<Self>, String> {
        use crate::config::BackendKind;
        if n.backend != BackendKind::Emulated {
            for (key, set) in [
                ("profile", n.profile.is_some()),
                ("precondition", n.precondition.is_some()),
                ("time_scale", n.time_scale.is_some()),
                ("wear_acceleration", n.wear_acceleration.is_some()),
                ("fault", n.fault.is_some()),
                ("fault_onset_days", n.fault_onset_days.is_some()),
                ("fault_ramp_days", n.fault_ramp_days.is_some()),
                ("age_acceleration", n.age_acceleration.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "{key} applies only to backend = \"emulated\": remove it or change the backend"
                    ));
                }
            }
            return Ok(None);
        }
        let name = n.profile.as_deref().unwrap_or(DEFAULT_PROFILE);
        let mut profile = SsdProfile::by_name(name).ok_or_else(|| {
            format!("unknown profile {name:?}: use pm9a3-gen4, nvmevirt-970pro or femu")
        })?;
        if let Some(a) = n.wear_acceleration {
            if !(1..=MAX_WEAR_ACCELERATION).contains(&a) {
                return Err(format!(
                    "wear_acceleration {a} out of range: use 1 to {MAX_WEAR_ACCELERATION}"
                ));
            }
            profile.wear.acceleration = a;
        }
        let precondition = match n.precondition.as_deref().unwrap_or("clean") {
            "clean" => Precondition::Clean,
            "fragmented" => Precondition::Fragmented {
                overwrite_permille: FRAGMENTED_OVERWRITE_PERMILLE,
            },
            other => {
                return Err(format!(
                    "unknown precondition {other:?}: use clean or fragmented"
                ))
            }
        };
        let time_scale = n.time_scale.unwrap_or(1.0);
        if !(1.0..=MAX_TIME_SCALE).contains(&time_scale) {
            return Err(format!(
                "time_scale {time_scale} out of range: use a number from 1 to {MAX_TIME_SCALE}"
            ));
        }
        let age_acceleration = n.age_acceleration.unwrap_or(1.0);
        if !(1.0..=MAX_AGE_ACCELERATION).contains(&age_acceleration) {
            return Err(format!(
                "age_acceleration {age_acceleration} out of range: use a number from 1 to {MAX_AGE_ACCELERATION}"
            ));
        }
        Ok(Some(EmulatedParams {
            profile,
            precondition,
            time_scale,
            fault: fault_plan(n)?,
            age_acceleration,
            path: n.path.clone(),
        }))
    }
}

/// `fault`, `fault_onset_days` and `fault_ramp_days`, checked together.
fn fault_plan(n: &crate::config::NamespaceConfig) -> Result<Option<FaultPlan>, String> {
    let days = |key: &str, v: Option<f64>, zero_ok: bool| -> Result<u64, String> {
        let d = v.ok_or_else(|| format!("fault needs {key} (days of drive age)"))?;
        let least = if zero_ok { "0" } else { "more than 0" };
        if !(0.0..=MAX_FAULT_DAYS).contains(&d) || d == 0.0 && !zero_ok {
            return Err(format!(
                "{key} {d} out of range: use {least} to {MAX_FAULT_DAYS} days"
            ));
        }
        Ok((d * NS_PER_DAY) as u64)
    };
    let kind = match n.fault.as_deref() {
        None => {
            return match (n.fault_onset_days, n.fault_ramp_days) {
                (None, None) => Ok(None),
                _ => Err(
                    "fault_onset_days and fault_ramp_days need fault = \"degrade\" or \"silent\""
                        .into(),
                ),
            };
        }
        Some("degrade") => FaultKind::Degrade,
        Some("silent") => FaultKind::Silent,
        Some(other) => return Err(format!("unknown fault {other:?}: use degrade or silent")),
    };
    let onset_ns = days("fault_onset_days", n.fault_onset_days, true)?;
    let ramp_ns = match kind {
        FaultKind::Degrade => days("fault_ramp_days", n.fault_ramp_days, false)?,
        FaultKind::Silent if n.fault_ramp_days.is_some() => {
            return Err("fault_ramp_days applies only to fault = \"degrade\": remove it".into())
        }
        FaultKind::Silent => 0,
    };
    Ok(Some(FaultPlan {
        kind,
        onset_ns,
        ramp_ns,
    }))
}
