//! `[qos]` and `[[tenant]]`: Gimbal's configuration (docs/gimbal.md).

use serde::Deserialize;
use trellis_qos::sched::{self, SchedConfig, SchedLimits};

/// Per-namespace traffic control.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum QosMode {
    /// No scheduler: the I/O path of a target without QoS.
    #[default]
    Off,
    /// Gimbal (SIGCOMM'21): congestion control on the backend's latency,
    /// write cost, DRR with virtual slots, dual token bucket, I/O credits.
    Gimbal,
}

impl std::str::FromStr for QosMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(QosMode::Off),
            "gimbal" => Ok(QosMode::Gimbal),
            _ => Err(format!("unknown qos {s:?} (off or gimbal)")),
        }
    }
}

/// The `[qos]` table: bounds and parameters of every namespace's scheduler.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QosConfig {
    pub limits: SchedLimits,
    /// Commands the scheduler lets reach the backend at once.
    pub device_qd: u32,
    /// Where Gimbal's drive-specific constants come from.
    pub calibrate: Calibrate,
    pub gimbal: trellis_qos::GimbalConfig,
}

/// `[qos] calibrate`: how a namespace's Gimbal learns its drive.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Calibrate {
    /// On a drive whose capacities the backend knows (an emulated SSD),
    /// derive `io_cost_bytes`, `slots_per_ssd` and `rate_max_bytes_per_s`
    /// from them (`GimbalConfig::calibrated`, docs/gimbal.md
    /// "Calibration"); elsewhere use `[qos.gimbal]` as written.
    #[default]
    Auto,
    /// `[qos.gimbal]` as written everywhere (Gimbal's published constants
    /// unless overridden).
    Off,
}

impl Default for QosConfig {
    fn default() -> Self {
        let s = SchedConfig::default();
        QosConfig {
            limits: s.limits,
            device_qd: s.device_qd,
            calibrate: Calibrate::Auto,
            gimbal: s.gimbal,
        }
    }
}

impl QosConfig {
    pub fn sched(&self) -> SchedConfig {
        SchedConfig {
            policy: sched::Policy::Gimbal,
            limits: self.limits.clone(),
            device_qd: self.device_qd,
            gimbal: self.gimbal.clone(),
        }
    }

    /// The scheduler of a namespace whose drive is `model` (if known).
    pub fn sched_for(&self, model: Option<&trellis_qos::DeviceModel>) -> SchedConfig {
        let mut s = self.sched();
        if let (Calibrate::Auto, Some(m)) = (self.calibrate, model) {
            s.gimbal = s.gimbal.calibrated(m);
        }
        s
    }

    pub fn validate(&self, tenants: &[TenantConfig]) -> anyhow::Result<()> {
        let s = self.sched();
        sched::build(&s, 0).map_err(|e| anyhow::anyhow!("[qos]: {e}"))?;
        // Every configured tenant keeps its own id and one is left for the catch-all.
        anyhow::ensure!(
            tenants.len() < self.limits.max_tenants as usize,
            "{} [[tenant]] tables need qos.limits.max_tenants > {}",
            tenants.len(),
            tenants.len()
        );
        let mut seen = std::collections::HashSet::new();
        for t in tenants {
            crate::config::check_nqn(&t.host)?;
            anyhow::ensure!(seen.insert(&t.host), "duplicate [[tenant]] host {}", t.host);
            anyhow::ensure!(
                (1..=sched::MAX_TENANT_WEIGHT).contains(&t.weight),
                "tenant {}: weight must be in 1..={}",
                t.name,
                sched::MAX_TENANT_WEIGHT
            );
        }
        Ok(())
    }
}

/// A `[[tenant]]` table: a host NQN with a name and a DRR weight.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub host: String,
    pub name: String,
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}
