//! Running the `trellis` binary as a user does, and a live target for the
//! bench to talk to.

#![allow(dead_code)] // each test file uses its own subset

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test: this build's, or `TRELLIS_TEST_BIN` (to check
/// that a test fails on another build, e.g. the one before a fix).
pub fn bin() -> std::path::PathBuf {
    std::env::var_os("TRELLIS_TEST_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_trellis").into())
}

pub fn trellis(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("TRELLIS_LOG", "warn")
        .output()
        .expect("run the trellis binary")
}

/// `trellis ARGS`, killed and reported as a failure if it runs longer
/// than `limit` (a hang is a bug too: old `sim cost --max-nodes 900000000`
/// looped for hours).
pub fn trellis_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(bin())
        .args(args)
        .env("TRELLIS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the trellis binary");
    // Read both pipes while waiting, so a chatty child never blocks on them.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("trellis {args:?} ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Runs `trellis bench ARGS --json FILE`, requires success, and returns the
/// first job's JSON report.
#[allow(dead_code)] // not every test binary uses it
pub fn bench_json(args: &[&str]) -> serde_json::Value {
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("r.json");
    let mut a = vec!["bench", "--no_progress", "--json", json.to_str().unwrap()];
    a.extend_from_slice(args);
    let o = trellis(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v["jobs"][0].clone()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The run failed cleanly (no panic) with a message naming each of `needles`.
pub fn assert_refused(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "accepted; stdout:\n{}", stdout(o));
    assert_ne!(o.status.code(), Some(101), "panicked:\n{err}");
    assert!(!err.contains("panicked"), "panicked:\n{err}");
    for n in needles {
        assert!(err.contains(n), "message lacks {n:?}:\n{err}");
    }
}

/// A failure's explanation: the `trellis: ...` line is one line.
pub fn assert_one_line(o: &Output) {
    let err = stderr(o);
    let lines: Vec<_> = err.lines().filter(|l| l.starts_with("trellis: ")).collect();
    assert_eq!(lines.len(), 1, "one error line expected:\n{err}");
}

/// Writes a config file mode 0600, as `trellis target` wants of one that
/// holds keys.
pub fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
}

/// `trellis target` on a free port, stopped (SIGKILL) when dropped.
pub struct LiveTarget {
    pub child: Child,
    pub addr: SocketAddr,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    _dir: tempfile::TempDir,
    _config_dir: Option<tempfile::TempDir>,
}

impl LiveTarget {
    /// Starts `trellis target ARGS --listen 127.0.0.1:0` and waits until it
    /// is ready; the port it got is read from its log.
    pub fn start(args: &[&str]) -> LiveTarget {
        Self::start_listening(args, &["--listen", "127.0.0.1:0"])
    }

    /// As [`LiveTarget::start`] with `config` as the TOML configuration,
    /// listeners included (the first one logged is `addr`).
    pub fn start_config(config: &str) -> LiveTarget {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("target.toml");
        write_private(&path, config);
        let path = path.to_str().unwrap().to_string();
        let mut t = Self::start_listening(&["--config", &path], &[]);
        t._config_dir = Some(dir);
        t
    }

    /// As [`LiveTarget::start`] with the state directory `state_dir`, which
    /// outlives this process (a restart finds its identity and counters).
    #[allow(dead_code)] // not every test binary uses it
    pub fn start_in(state_dir: &std::path::Path, args: &[&str]) -> LiveTarget {
        Self::spawn(args, &["--listen", "127.0.0.1:0"], Some(state_dir))
    }

    fn start_listening(args: &[&str], listen: &[&str]) -> LiveTarget {
        Self::spawn(args, listen, None)
    }

    fn spawn(args: &[&str], listen: &[&str], state_dir: Option<&std::path::Path>) -> LiveTarget {
        let (child, addr, log, dir) = spawn_logged_in("target", args, listen, state_dir);
        LiveTarget {
            child,
            addr,
            log,
            _dir: dir,
            _config_dir: None,
        }
    }

    /// Waits up to 5 s for a log line containing `what`; the log so far.
    pub fn wait_log(&self, what: &str) -> Result<(), String> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log.lock().unwrap().clone();
            if log.contains(what) {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(log);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The log so far.
    #[allow(dead_code)] // not every test binary uses it
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Every address the target logged "listening on", in order.
    #[allow(dead_code)] // not every test binary uses it
    pub fn listeners(&self) -> Vec<SocketAddr> {
        let log = self.log.lock().unwrap().clone();
        log.lines()
            .filter_map(|l| l.split("listening on ").nth(1))
            .filter_map(|r| r.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for LiveTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `trellis SUB ARGS LISTEN --state-dir TMP` with its log read until a line
/// says "ready" (30 s at most): the child, the first address it logged as
/// "listening on", its log so far (kept growing by a thread, so the child
/// never blocks on a full pipe) and its state directory.
#[allow(dead_code)] // not every test binary starts a process
pub fn spawn_logged(
    sub: &str,
    args: &[&str],
    listen: &[&str],
) -> (
    Child,
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<String>>,
    tempfile::TempDir,
) {
    spawn_logged_in(sub, args, listen, None)
}

/// [`spawn_logged`] in `state_dir` (None: a new temporary one, returned).
#[allow(dead_code)] // not every test binary starts a process
pub fn spawn_logged_in(
    sub: &str,
    args: &[&str],
    listen: &[&str],
    state_dir: Option<&std::path::Path>,
) -> (
    Child,
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<String>>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .arg(sub)
        .args(args)
        .args(listen)
        .arg("--state-dir")
        .arg(state_dir.unwrap_or(dir.path()))
        .env("TRELLIS_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let end = Instant::now() + Duration::from_secs(30);
    let mut addr = None;
    let mut log = String::new();
    while Instant::now() < end {
        let Some(Ok(line)) = lines.next() else { break };
        log.push_str(&line);
        log.push('\n');
        if let Some(rest) = line.split("listening on ").nth(1) {
            addr = addr.or(rest.split_whitespace().next().and_then(|a| a.parse().ok()));
        }
        if line.contains("ready") {
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("trellis {sub} did not start:\n{log}"));
    let log = std::sync::Arc::new(std::sync::Mutex::new(log));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    (child, addr, log, dir)
}
