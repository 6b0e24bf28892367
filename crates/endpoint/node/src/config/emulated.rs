//! `backend = "emulated"`: the emulated SSD's keys of a
//! `[[subsystem.namespace]]` table (profile, precondition, time_scale),
//! read and checked once. The backend itself is `backend::emulated`.

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

/// The validated emulation parameters of one namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatedParams {
    pub profile: SsdProfile,
    pub precondition: Precondition,
    pub time_scale: f64,
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
        Ok(Some(EmulatedParams {
            profile,
            precondition,
            time_scale,
        }))
    }
}
