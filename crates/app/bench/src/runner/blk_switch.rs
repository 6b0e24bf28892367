//! `--stack blk-switch`: the CPUs it may use, what it refuses, and the run
//! itself (one controller, two I/O queues per core, the jobs' workers as apps
//! on the switch; crate::switch_run).

use super::*;

/// `--cpus` for blk-switch: one reactor per core, so each CPU once, and one
/// this process may run on (pinning elsewhere would silently not happen).
fn switch_cpus(cpus: &[usize], allowed: &[usize]) -> Result<Vec<usize>> {
    for (i, c) in cpus.iter().enumerate() {
        if !allowed.contains(c) {
            bail!(
                "--cpus {c}: this process may not run on CPU {c} (allowed: {allowed:?}); --stack blk-switch runs one reactor per listed CPU"
            );
        }
        if cpus[..i].contains(c) {
            bail!("--cpus lists CPU {c} twice: --stack blk-switch runs one reactor per core");
        }
    }
    Ok(cpus.to_vec())
}

/// What `--stack blk-switch` cannot run yet, as the one-line refusal.
fn switch_refusal(jobs: &[JobSpec]) -> Option<String> {
    let first = key_at(&jobs[0], &jobs[0].addr);
    for j in jobs {
        let what = if !j.replicas.is_empty() {
            "--replicas/--paths"
        } else if j.verify {
            "--verify"
        } else if j.credits {
            "--credits"
        } else if j.rate_iops > 0 || j.rate_bytes > 0 {
            "--rate_iops/--rate"
        } else if key_at(j, &j.addr) != first {
            "jobs on different targets, subsystems, host NQNs or digests"
        } else {
            continue;
        };
        return Some(format!(
            "--stack blk-switch does not support {what} (job {}): run it with --stack plain, or drop that option",
            j.name
        ));
    }
    None
}

/// `--stack blk-switch`: one controller, two I/O queues per core, the jobs'
/// workers as apps on the switch (crate::switch_run).
pub(super) fn run_switch(
    jobs: &[JobSpec],
    opts: &RunOpts,
    sw: &crate::switch_run::SwitchOpts,
) -> Result<RunReport> {
    if jobs.is_empty() {
        bail!("no jobs to run");
    }
    if let Some(why) = switch_refusal(jobs) {
        bail!(why);
    }
    let cpu0 = cpu_time();
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .map(|v| v.into_iter().map(|c| c.id).collect())
        .unwrap_or_else(|| vec![0]);
    let cpus = if opts.cpus.is_empty() {
        allowed
    } else {
        switch_cpus(&opts.cpus, &allowed)?
    };
    let k = key_at(&jobs[0], &jobs[0].addr);
    let c = switch_controller(&k, 2 * cpus.len() as u32, opts)?;
    let mut ctrls = BTreeMap::new();
    ctrls.insert(k.clone(), c);
    let (bsz, nsze, _) = volume_geometry(&jobs[0], std::slice::from_ref(&k), &mut ctrls)?;
    let geometry = (bsz, nsze);
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Vec<_> = jobs.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let ctrl = ctrls.get_mut(&k).expect("inserted above");
    let (threads, shared) = crate::switch_run::run(
        jobs,
        ctrl,
        &cpus,
        sw,
        geometry,
        stop.clone(),
        progress.clone(),
    )?;
    let handles: Vec<_> = threads.into_iter().map(|h| (0usize, h)).collect();
    let timelines = watch(jobs, &handles, &progress, &mut ctrls, &[], opts, &stop)?;
    let mut reactor_errors = Vec::new();
    let mut polls = (0, 0);
    for (_, h) in handles {
        let r = h.join().map_err(|_| anyhow::anyhow!("reactor panicked"))?;
        polls.0 += r.polls;
        polls.1 += r.idle_polls;
        if let Some(e) = r.first_error {
            reactor_errors.push(e);
        }
    }
    for (_, c) in ctrls {
        let _ = c.shutdown();
    }
    let (mut per_job, report) = crate::switch_run::results(&shared, jobs.len());
    // The reactors' own figures (polls; a failed queue) go with the first
    // app: the job report adds them up.
    if let Some(r) = per_job.first_mut().and_then(|v| v.first_mut()) {
        r.polls += polls.0;
        r.idle_polls += polls.1;
        if let Some(e) = reactor_errors.first() {
            r.fatal = true;
            r.errors += 1;
            r.first_error.get_or_insert(e.clone());
        }
    }
    let reports = reports_with_timelines(jobs, per_job, timelines);
    Ok(run_report(reports, opts, &cpu0, "blk-switch", Some(report)))
}

/// The one controller of `--stack blk-switch`, with `nq` I/O queues granted
/// (two per core).
fn switch_controller(k: &CtrlKey, nq: u32, opts: &RunOpts) -> Result<Controller> {
    let cfg = host_config(k, nq, opts);
    let mut c = Controller::connect(&k.0, &k.1, &cfg).map_err(|e| {
        let hint = connect_hint(&e, &k.0, &k.2);
        anyhow::Error::new(e).context(format!("connecting to {} at {} as {}{hint}", k.1, k.0, k.2))
    })?;
    let granted = c.set_num_queues(nq.min(u16::MAX as u32) as u16)?;
    if (granted as u32) < nq {
        bail!(
            "the controller at {} granted {granted} I/O queues, --stack blk-switch needs {nq} (two per core of --cpus): use fewer CPUs, or raise the target's max_io_queues",
            k.0
        );
    }
    Ok(c)
}
