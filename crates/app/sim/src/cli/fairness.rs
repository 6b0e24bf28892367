//! `trellis sim fairness`: the flags checked into a setup and weights, the
//! Gimbal appendix's cases run (QoS off vs Gimbal), the table printed and
//! fairness.json written.

use super::*;

pub(super) fn cmd_fairness(
    cases: &[String],
    weights: &[String],
    (runtime_ms, ramp_ms): (u64, u64),
    precondition: &str,
    calibrate: &str,
    (program_suspend_us, erase_suspend_us): (Option<u64>, Option<u64>),
    out: &Path,
) -> Result<()> {
    use crate::fairness;
    let setup = fairness_setup(
        (runtime_ms, ramp_ms),
        precondition,
        calibrate,
        (program_suspend_us, erase_suspend_us),
    )?;
    let names: Vec<String> = if cases.is_empty() {
        fairness::CASES.iter().map(|s| s.to_string()).collect()
    } else {
        cases.to_vec()
    };
    let weights = fairness_weights(weights, &names)?;
    let mut all = Vec::new();
    for c in &names {
        let modes = fairness::run_case(c, &weights, &setup)?;
        for m in &modes {
            for t in &m.tenants {
                println!(
                    "{:<13} {:<6} {:<8} w{} {:>9.1} MB/s (alone {:>9.1}) keep {:.2} share {:.2} (fair {:.2}) p99.9 {:>9.0} us",
                    m.case, m.mode, t.name, t.weight, t.mb_per_s, t.standalone_mb_per_s,
                    t.keep, t.share, t.fair_share, t.lat_us_p999
                );
            }
            println!(
                "{:<13} {:<6} f-Util min {:.2} mean {:.2}, utilisation {:.3}",
                m.case, m.mode, m.f_util_min, m.f_util_mean, m.utilisation
            );
        }
        all.extend(modes);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("fairness.json");
    std::fs::write(&path, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `sim fairness`'s drive and scheduler setup from its flags, each checked.
fn fairness_setup(
    (runtime_ms, ramp_ms): (u64, u64),
    precondition: &str,
    calibrate: &str,
    (program_suspend_us, erase_suspend_us): (Option<u64>, Option<u64>),
) -> Result<crate::fairness::Setup> {
    use crate::fairness::{self, Setup};
    let max_ms = fairness::MAX_RUNTIME_NS / 1_000_000;
    if !(10..=max_ms).contains(&runtime_ms) {
        bail!("--runtime-ms {runtime_ms} is out of range: use 10 to {max_ms}");
    }
    if ramp_ms > max_ms {
        bail!("--ramp-ms {ramp_ms} is out of range: use 0 to {max_ms}");
    }
    let mut setup = Setup::daemon_like(trellis_qos::sched::Policy::Gimbal);
    setup.runtime_ns = runtime_ms * 1_000_000;
    setup.ramp_ns = ramp_ms * 1_000_000;
    for (flag, us, field) in [
        (
            "--program-suspend-us",
            program_suspend_us,
            &mut setup.profile.program_suspend_ns,
        ),
        (
            "--erase-suspend-us",
            erase_suspend_us,
            &mut setup.profile.erase_suspend_ns,
        ),
    ] {
        if let Some(us) = us {
            if us > 100_000 {
                bail!("{flag} {us} is out of range: use 0 (off) to 100000");
            }
            *field = us * 1000;
        }
    }
    setup.precondition = match precondition {
        "clean" => Precondition::Clean,
        "fragmented" => Precondition::Fragmented {
            overwrite_permille: 1000,
        },
        o => bail!("--precondition {o:?}: use clean or fragmented"),
    };
    match calibrate {
        "auto" => {}
        "off" => setup.gimbal = trellis_qos::GimbalConfig::default(),
        o => bail!("--calibrate {o:?}: use auto or off"),
    }
    Ok(setup)
}

/// `--weight NAME=W` pairs, each naming a tenant of the cases run.
fn fairness_weights(weights: &[String], names: &[String]) -> Result<Vec<(String, u32)>> {
    use crate::fairness;
    let weights = weights
        .iter()
        .map(|w| {
            let (n, v) = w
                .split_once('=')
                .with_context(|| format!("--weight {w:?}: use NAME=W, e.g. reader=2"))?;
            let v: u32 = v
                .parse()
                .with_context(|| format!("--weight {w:?}: W must be a whole number"))?;
            Ok((n.to_string(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    for (who, _) in &weights {
        let known = names
            .iter()
            .map(|c| fairness::case(c))
            .collect::<Result<Vec<_>>>()?
            .iter()
            .flatten()
            .any(|t| &t.name == who);
        if !known {
            bail!("--weight {who}=...: no tenant {who:?} in the cases run (intensity: deep, shallow; size: small, large; pattern_*: reader, writer)");
        }
    }
    Ok(weights)
}
