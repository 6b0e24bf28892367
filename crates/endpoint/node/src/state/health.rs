//! Drive-life counters that outlive the process, per namespace: power-on
//! time and unsafe shutdowns (SMART / Health Information log, 02h: Power On
//! Hours, Unsafe Shutdowns), kept in a file beside the node identity
//! (`node-id.health.json`, one per identity file, so two targets sharing a state
//! directory keep their own).
//!
//! A namespace is marked open in the file when this process opens it, and
//! closed only after a clean stop has flushed its backend. A start that
//! finds it still open counts an unsafe shutdown: the last process was
//! killed, crashed or lost power before it flushed (NVMe counts a shutdown
//! without a shutdown notification the same way). Power-on time is saved
//! every [`HEALTH_SAVE_INTERVAL_S`], so a crash loses at most that much.
//!
//! Namespaces are keyed by NGUID, which is stable across restarts (derived
//! from the node identity or configured).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Instant;

/// Suffix of the health file after the identity file's name.
pub const HEALTH_FILE_SUFFIX: &str = ".health.json";
/// How often the power-on time is saved while running.
pub const HEALTH_SAVE_INTERVAL_S: u64 = 60;
/// Records kept (namespaces ever seen by this identity); past it, the
/// closed records of namespaces not open now are dropped, oldest NGUID
/// first. Bounds the file at about 100 bytes × this.
pub const MAX_HEALTH_RECORDS: usize = 4096;
/// The file's format.
const VERSION: u32 = 1;
/// The largest health file read (a bound on what a start parses).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One namespace's persisted counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    power_on_s: u64,
    unsafe_shutdowns: u64,
    /// Set while a process has it open; cleared after a clean stop.
    open: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct HealthFile {
    version: u32,
    namespaces: BTreeMap<String, Record>,
}

/// A namespace's record and, when open in this process, since when.
#[derive(Clone, Copy, Debug)]
struct Live {
    rec: Record,
    since: Option<Instant>,
}

/// The node's health counters (one per registry).
#[derive(Debug)]
pub struct Health {
    /// None: an identity kept nowhere (tests, `--check`): counters start at 0.
    path: Option<PathBuf>,
    map: Mutex<BTreeMap<String, Live>>,
    /// Set by [`Health::serve`]: the target started, so the file may say
    /// its namespaces are open. Before it, nothing is written: a start that
    /// fails changes nothing (a crash still pending is counted by the next
    /// start that serves).
    serving: AtomicBool,
    /// Set by [`Health::close`]: the final save is done; later saves (the
    /// periodic one racing the stop) are no-ops.
    closed: AtomicBool,
}

/// What SMART reports for one namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub power_on_hours: u64,
    pub unsafe_shutdowns: u64,
}

/// The failure predictor's verdict per namespace uid, as the drive watch
/// (`control::drive_health`) last set it: (verdict, horizon in hours).
/// Read by the extended health page and `/metrics`.
#[derive(Debug, Default)]
pub struct Verdicts(Mutex<std::collections::HashMap<usize, (trellis_nvme::health::Verdict, u32)>>);

impl Verdicts {
    pub fn set(&self, uid: usize, v: trellis_nvme::health::Verdict, horizon_hours: u32) {
        crate::sys::lock(&self.0).insert(uid, (v, horizon_hours));
    }
    /// The SMART critical warning bits the verdict adds to the drive's own:
    /// bit 2, "reliability degraded", while it is predicted to fail or has
    /// stopped answering (issue 33).
    pub fn warning_bits(&self, uid: usize) -> u8 {
        use trellis_nvme::health::Verdict as V;
        match self.get(uid) {
            Some((V::PredictedFailure | V::Failed, _)) => 0x04,
            _ => 0,
        }
    }
    /// None: no predictor watches it.
    pub fn get(&self, uid: usize) -> Option<(trellis_nvme::health::Verdict, u32)> {
        crate::sys::lock(&self.0).get(&uid).copied()
    }
    pub fn retain(&self, live: &std::collections::HashSet<usize>) {
        crate::sys::lock(&self.0).retain(|u, _| live.contains(u));
    }
}

fn key(nguid: &[u8; 16]) -> String {
    crate::sys::hex(nguid)
}

impl Health {
    /// Loads `path` (missing: empty) and opens `nguids`, counting an
    /// unsafe shutdown for each one still marked open. A file that cannot
    /// be read or is of another version is left alone and the counters live
    /// in memory only, with a warning: losing them is better than refusing
    /// to serve the data.
    pub fn open(path: Option<PathBuf>, nguids: &[[u8; 16]]) -> Health {
        let (file, path) = match path {
            Some(p) => match load(&p) {
                Ok(f) => (f, Some(p)),
                Err(e) => {
                    tracing::warn!("{e:#}; power-on hours and unsafe shutdowns are kept in memory only until a restart");
                    (HealthFile::default(), None)
                }
            },
            None => (HealthFile::default(), None),
        };
        let map = file
            .namespaces
            .into_iter()
            .map(|(k, rec)| (k, Live { rec, since: None }))
            .collect();
        let h = Health {
            path,
            map: Mutex::new(map),
            serving: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        };
        for n in nguids {
            h.open_one(n);
        }
        h
    }

    /// The target started: the file says its namespaces are open from now
    /// on, so a crash is counted at the next start.
    pub fn serve(&self) {
        self.serving.store(true, SeqCst);
        self.save_warn(false);
    }

    /// A namespace removed live (after its flush): closed in the file, its
    /// power-on time kept for when it comes back.
    pub fn remove(&self, nguid: &[u8; 16]) {
        if let Some(l) = crate::sys::lock(&self.map).get_mut(&key(nguid)) {
            l.rec.power_on_s = power_on_s(l);
            l.rec.open = false;
            l.since = None;
        }
        self.save_warn(false);
    }

    fn save_warn(&self, clean: bool) {
        if let Err(e) = self.save(clean) {
            tracing::warn!("cannot save the health counters: {e:#}");
        }
    }

    /// Opens one namespace (added live, or at start).
    pub fn add(&self, nguid: &[u8; 16]) {
        self.open_one(nguid);
        self.save_warn(false);
    }

    fn open_one(&self, nguid: &[u8; 16]) {
        let mut m = crate::sys::lock(&self.map);
        let k = key(nguid);
        let l = m.entry(k.clone()).or_insert(Live {
            rec: Record::default(),
            since: None,
        });
        if l.since.is_some() {
            return; // open already (removed and added again while running)
        }
        if l.rec.open {
            l.rec.unsafe_shutdowns = l.rec.unsafe_shutdowns.saturating_add(1);
            tracing::warn!(
                nguid = %k,
                unsafe_shutdowns = l.rec.unsafe_shutdowns,
                "the last process did not stop cleanly with this namespace open (killed, crashed or power lost before its flush): counted as an unsafe shutdown"
            );
        }
        l.rec.open = true;
        l.since = Some(Instant::now());
    }

    /// The namespace's counters now (zeros for one never opened).
    pub fn counters(&self, nguid: &[u8; 16]) -> Counters {
        let m = crate::sys::lock(&self.map);
        let Some(l) = m.get(&key(nguid)) else {
            return Counters::default();
        };
        Counters {
            power_on_hours: power_on_s(l) / 3600,
            unsafe_shutdowns: l.rec.unsafe_shutdowns,
        }
    }

    /// The final save of a stop: namespaces are marked closed when
    /// `flushed` (every backend flushed), else left open, so the next start
    /// counts the stop as unsafe.
    pub fn close(&self, flushed: bool) -> anyhow::Result<()> {
        self.write(flushed, true)
    }

    /// Writes the file (0600, fsync, rename). `clean`: mark every namespace
    /// closed.
    pub fn save(&self, clean: bool) -> anyhow::Result<()> {
        self.write(clean, false)
    }

    /// One save; with `last`, the final one (later saves do nothing).
    fn write(&self, clean: bool, last: bool) -> anyhow::Result<()> {
        // Held across the write: two saves (the periodic one, a live add,
        // the stop's) would share the temporary file, and the final one
        // must be the last.
        let mut m = crate::sys::lock(&self.map);
        if !self.serving.load(SeqCst) || self.closed.load(SeqCst) {
            return Ok(());
        }
        if last {
            self.closed.store(true, SeqCst);
        }
        let Some(path) = &self.path else {
            return Ok(());
        };
        bound(&mut m);
        let namespaces = m
            .iter()
            .map(|(k, l)| {
                let rec = Record {
                    power_on_s: power_on_s(l),
                    unsafe_shutdowns: l.rec.unsafe_shutdowns,
                    open: l.since.is_some() && !clean,
                };
                (k.clone(), rec)
            })
            .collect();
        let file = HealthFile {
            version: VERSION,
            namespaces,
        };
        let text = serde_json::to_vec_pretty(&file)?;
        crate::state::resv::persist::write_atomic(path, &text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
    }
}

/// Dropped without [`Health::close`] (a start that failed after opening,
/// a target dropped without a stop): the process ends under control and
/// nothing it acknowledged is in a cache of its own, so the namespaces are
/// closed. Only an end that runs no destructor (kill -9, abort, power loss)
/// leaves them open.
impl Drop for Health {
    fn drop(&mut self) {
        self.save_warn(true);
    }
}

/// Seconds powered on: saved, plus this process's time since it opened it.
fn power_on_s(l: &Live) -> u64 {
    let now_s = l.since.map_or(0, |t| t.elapsed().as_secs());
    l.rec.power_on_s.saturating_add(now_s)
}

/// Drops closed records of namespaces not open now, lowest NGUID first,
/// until at most [`MAX_HEALTH_RECORDS`] are left.
fn bound(m: &mut BTreeMap<String, Live>) {
    while m.len() > MAX_HEALTH_RECORDS {
        let Some(k) = m
            .iter()
            .find(|(_, l)| l.since.is_none())
            .map(|(k, _)| k.clone())
        else {
            return; // every one is open: the namespace limit bounds them
        };
        m.remove(&k);
    }
}

/// Reads the health file; a missing one is empty. A damaged one is set
/// aside (`.bad`) and counting starts again, with a warning: losing the
/// counters is better than refusing to serve the data.
fn load(path: &std::path::Path) -> anyhow::Result<HealthFile> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HealthFile::default()),
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let mut text = Vec::new();
    f.take(MAX_FILE_BYTES).read_to_end(&mut text)?;
    match serde_json::from_slice::<HealthFile>(&text) {
        Ok(h) if h.version == VERSION => Ok(h),
        Ok(h) => anyhow::bail!(
            "{}: health file version {} is not {VERSION}: move it away to start counting again",
            path.display(),
            h.version
        ),
        Err(e) => {
            let bad = path.with_extension("bad");
            tracing::warn!(
                "{}: damaged health file ({e}); moved to {} and counting starts again",
                path.display(),
                bad.display()
            );
            std::fs::rename(path, &bad)?;
            Ok(HealthFile::default())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [1; 16];

    /// As a target that started: opened, then serving.
    fn serving(path: Option<PathBuf>, nguids: &[[u8; 16]]) -> Health {
        let h = Health::open(path, nguids);
        h.serve();
        h
    }
    const B: [u8; 16] = [2; 16];

    #[test]
    fn a_clean_stop_counts_nothing_and_a_kill_counts_one_unsafe_shutdown() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        let h = serving(Some(p.clone()), &[A]);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 0);
        h.close(true).unwrap();
        drop(h);
        let h = serving(Some(p.clone()), &[A]);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 0, "a clean stop before");
        std::mem::forget(h); // no destructor: as a kill -9 leaves it
        let h = serving(Some(p.clone()), &[A, B]);
        assert_eq!(
            h.counters(&A).unsafe_shutdowns,
            1,
            "the process before was killed"
        );
        assert_eq!(h.counters(&B).unsafe_shutdowns, 0, "B was not open then");
        std::mem::forget(h);
        let h = serving(Some(p.clone()), &[A]);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 2);
        assert_eq!(h.counters(&B).unsafe_shutdowns, 0, "counted when B opens");
        h.add(&B);
        assert_eq!(h.counters(&B).unsafe_shutdowns, 1, "B was open when killed");
        h.close(false).unwrap();
        drop(h);
        let h = serving(Some(p.clone()), &[A]);
        assert_eq!(
            h.counters(&A).unsafe_shutdowns,
            3,
            "a stop that could not flush"
        );
        drop(h); // dropped without close: a controlled end
        let h = serving(Some(p), &[A]);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 3);
    }

    #[test]
    fn a_start_that_fails_before_serving_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        std::mem::forget(serving(Some(p.clone()), &[A])); // killed
        let before = std::fs::read(&p).unwrap();
        for _ in 0..3 {
            // Opened, never served (the start failed), the process exits.
            std::mem::forget(Health::open(Some(p.clone()), &[A]));
        }
        assert_eq!(std::fs::read(&p).unwrap(), before, "the file is untouched");
        let h = serving(Some(p), &[A]);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 1, "the one kill, once");
    }

    #[test]
    fn a_namespace_removed_live_is_closed_and_keeps_its_time() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        let h = serving(Some(p.clone()), &[A, B]);
        h.remove(&B);
        std::mem::forget(h); // killed after the removal
        let h = serving(Some(p.clone()), &[A]);
        h.add(&B);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 1);
        assert_eq!(
            h.counters(&B).unsafe_shutdowns,
            0,
            "B was closed when removed"
        );
    }

    #[test]
    fn after_the_final_save_a_periodic_one_does_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        let h = serving(Some(p.clone()), &[A]);
        h.close(true).unwrap();
        h.save(false).unwrap(); // the saver thread, late
        std::mem::forget(h);
        let h = serving(Some(p), &[A]);
        assert_eq!(h.counters(&A).unsafe_shutdowns, 0);
    }

    #[test]
    fn a_file_of_another_version_is_left_alone_and_counters_kept_in_memory() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        std::fs::write(&p, br#"{"version":9,"namespaces":{}}"#).unwrap();
        let h = serving(Some(p.clone()), &[A]);
        h.close(true).unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            br#"{"version":9,"namespaces":{}}"#
        );
    }

    #[test]
    fn power_on_time_is_carried_across_restarts() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        let text = r#"{"version":1,"namespaces":{"01010101010101010101010101010101":{"power_on_s":7300,"unsafe_shutdowns":3,"open":false}}}"#;
        std::fs::write(&p, text).unwrap();
        let h = serving(Some(p.clone()), &[A]);
        assert_eq!(
            h.counters(&A),
            Counters {
                power_on_hours: 2,
                unsafe_shutdowns: 3
            }
        );
        h.save(true).unwrap();
        let saved: HealthFile = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        let r = saved.namespaces[&key(&A)];
        assert!(r.power_on_s >= 7300 && !r.open, "{r:?}");
    }

    #[test]
    fn a_damaged_file_is_set_aside_and_counting_starts_again() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        std::fs::write(&p, b"{not json").unwrap();
        let h = serving(Some(p.clone()), &[A]);
        assert_eq!(h.counters(&A), Counters::default());
        assert_eq!(
            std::fs::read(p.with_extension("bad")).unwrap(),
            b"{not json"
        );
    }

    #[test]
    fn the_file_is_private_and_its_records_bounded() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node-id.health.json");
        let h = serving(Some(p.clone()), &[A]);
        {
            let mut m = crate::sys::lock(&h.map);
            for i in 0..MAX_HEALTH_RECORDS + 10 {
                let rec = Record::default();
                m.insert(format!("{i:032x}"), Live { rec, since: None });
            }
        }
        h.save(false).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let saved: HealthFile = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(saved.namespaces.len(), MAX_HEALTH_RECORDS);
        assert!(saved.namespaces[&key(&A)].open, "the open one is kept");
    }

    #[test]
    fn without_a_state_file_the_counters_start_at_zero() {
        let h = serving(None, &[A]);
        assert_eq!(h.counters(&A), Counters::default());
        h.save(true).unwrap();
    }
}
