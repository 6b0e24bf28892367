//! Issue 10: every bad input a user can give `trellis target` and
//! `trellis sim` is refused before any work, with a message that names the
//! value and the fix; none panics. Each test failed on the code before.

mod common;
use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// `target --check` with a private state directory (nothing is created).
fn check(args: &[&str]) -> std::process::Output {
    check_in(&tmp(), args)
}

fn check_in(state: &tempfile::TempDir, args: &[&str]) -> std::process::Output {
    let mut a = vec![
        "target",
        "--check",
        "--state-dir",
        state.path().to_str().unwrap(),
    ];
    a.extend_from_slice(args);
    trellis(&a)
}

#[test]
fn ram_that_is_not_whole_blocks_is_refused() {
    let o = check(&["--ram", "1000"]);
    assert_refused(&o, &["size 1000", "512-byte blocks", "use 512 or 1024"]);
    assert_one_line(&o);
}

#[test]
fn ram_0_says_the_size_is_too_small_not_missing() {
    let o = check(&["--ram", "0"]);
    assert_refused(&o, &["size 0", "at least 512"]);
    assert!(!stderr(&o).contains("needs a size"), "{}", stderr(&o));
}

#[test]
fn unsupported_block_size_is_refused_by_check() {
    let o = check(&["--ram", "64M", "--block-size", "1024"]);
    assert_refused(&o, &["\"1024\"", "512 or 4096"]);
    // Without a namespace flag, --block-size would silently do nothing.
    let o = check(&["--block-size", "4096"]);
    assert_refused(&o, &["--block-size", "--ram"]);
}

#[test]
fn check_finds_a_file_namespace_that_cannot_be_created() {
    let o = check(&["--file", "/nonexistent/x", "--file-size", "1M"]);
    assert_refused(
        &o,
        &["/nonexistent/x", "directory /nonexistent does not exist"],
    );
    let o = check(&["--file", "/nonexistent/x"]);
    assert_refused(&o, &["/nonexistent/x", "--file-size"]);
}

/// Starting refuses what --check refuses, with the same message.
#[test]
fn starting_refuses_a_file_namespace_that_cannot_be_created() {
    let d = tmp();
    let o = trellis_within(
        &[
            "target",
            "--file",
            "/nonexistent/x",
            "--file-size",
            "1M",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            d.path().to_str().unwrap(),
        ],
        std::time::Duration::from_secs(30),
    );
    assert_refused(
        &o,
        &["/nonexistent/x", "directory /nonexistent does not exist"],
    );
}

#[test]
fn file_size_without_file_is_refused() {
    let o = check(&["--file-size", "1G"]);
    assert_refused(&o, &["--file-size", "--file"]);
}

#[test]
fn check_prints_the_effective_config_as_toml_that_starts_the_same() {
    let state = tmp();
    let o = check_in(
        &state,
        &[
            "--null",
            "64M",
            "--listen",
            "127.0.0.1:4999",
            "--reactors",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(!text.contains("Config {"), "no Rust debug dump:\n{text}");
    assert!(text.contains("reactors = 2"), "{text}");
    assert!(text.contains("size = \"64MiB\""), "{text}");
    // The output is a config file that checks to the same output.
    let d = tmp();
    let f = d.path().join("effective.toml");
    std::fs::write(&f, &text).unwrap();
    let again = check_in(&state, &["--config", f.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    let body = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(&stdout(&again)), body(&text));
}

#[test]
fn listen_accepts_host_names() {
    let o = check(&["--listen", "localhost:4420"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(":4420\""), "{}", stdout(&o));
    let o = check(&["--metrics", "localhost:9464"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("[metrics]\nlisten = \"127.0.0.1:9464\""),
        "{}",
        stdout(&o)
    );
    let o = check(&["--listen", "no-such-host.invalid:4420"]);
    assert_refused(&o, &["--listen", "no-such-host.invalid:4420", "HOST:PORT"]);
}

fn sim(args: &[&str]) -> std::process::Output {
    let d = tmp();
    let mut a = vec!["sim"];
    a.extend_from_slice(args);
    if args.first() == Some(&"run") || args.first() == Some(&"cost") {
        a.extend_from_slice(&["--out", d.path().to_str().unwrap()]);
    }
    trellis(&a)
}

#[test]
fn sim_run_refuses_zero_duration() {
    let o = sim(&[
        "run",
        "--preset",
        "testbed-switched",
        "--duration-ms",
        "0",
        "--no-progress",
    ]);
    assert_refused(&o, &["--duration-ms 0", "--duration-ms 20"]);
    assert_one_line(&o);
}

#[test]
fn sim_cost_refuses_fewer_than_two_nodes() {
    for n in ["0", "1"] {
        let o = sim(&["cost", "--nodes", n]);
        assert_refused(&o, &[&format!("--nodes {n}"), "2 to"]);
    }
}

#[test]
fn unknown_preset_lists_the_presets() {
    let o = sim(&["run", "--preset", "nosuch", "--no-progress"]);
    assert_refused(&o, &["\"nosuch\"", "testbed-switched", "torus1000"]);
    let o = sim(&["config", "nosuch"]);
    assert_refused(&o, &["\"nosuch\"", "rack27-tor"]);
}

#[test]
fn preset_and_config_together_are_refused() {
    let d = tmp();
    let f = d.path().join("s.toml");
    std::fs::write(&f, "name = \"x\"\n").unwrap();
    let o = sim(&[
        "run",
        "--preset",
        "testbed-switched",
        "--config",
        f.to_str().unwrap(),
    ]);
    assert_refused(&o, &["--preset", "--config"]);
}

#[test]
fn sim_config_errors_name_the_file() {
    let d = tmp();
    let f = d.path().join("broken.toml");
    std::fs::write(&f, "duration_ns = \"soon\"\n").unwrap();
    let o = sim(&["run", "--config", f.to_str().unwrap(), "--no-progress"]);
    assert_refused(&o, &["broken.toml", "duration_ns"]);
    let f = d.path().join("zero.toml");
    std::fs::write(&f, "duration_ns = 0\n").unwrap();
    let o = sim(&["run", "--config", f.to_str().unwrap(), "--no-progress"]);
    assert_refused(&o, &["zero.toml", "duration_ns 0"]);
}

/// Option lines of a `--help` text, each with whether it has a description
/// (on its line, or on the indented lines below it in clap's long format).
fn described_options(help: &str) -> Vec<(String, bool)> {
    let lines: Vec<&str> = help.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if !t.starts_with('-') || t.starts_with("-h, --help") || t.starts_with("-V, --version") {
            continue;
        }
        let mut parts = t.split("  ").map(str::trim).filter(|p| !p.is_empty());
        let flag = parts.next().unwrap_or_default().to_string();
        let inline = parts.any(|p| !p.starts_with('['));
        let below = lines.get(i + 1).is_some_and(|n| {
            let n_indent = n.len() - n.trim_start().len();
            let indent = line.len() - t.len();
            n_indent > indent + 2 && !n.trim().is_empty() && !n.trim_start().starts_with('[')
        });
        out.push((flag, inline || below));
    }
    out
}

#[test]
fn every_option_of_every_command_has_a_description() {
    for cmd in [
        &["target"][..],
        &["bench"],
        &["bench", "suite"],
        &["bench", "baseline-server"],
        &["bench", "baseline-client"],
        &["sim", "run"],
        &["sim", "cost"],
        &["sim", "reproduce"],
        &["sim", "sweep"],
        &["sim", "bench"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let help = stdout(&trellis(&args));
        let opts = described_options(&help);
        assert!(!opts.is_empty(), "no options found:\n{help}");
        for (flag, described) in opts {
            assert!(
                described,
                "`trellis {}`: {flag} has no description:\n{help}",
                cmd.join(" ")
            );
        }
    }
}

#[test]
fn sim_config_refuses_fields_the_jobs_model_ignores() {
    let d = tmp();
    let f = d.path().join("systor.toml");
    std::fs::write(
        &f,
        "[[workload.jobs]]\nname = \"s\"\nread_pct = 50\n[workload.jobs.job]\nkind = \"synthetic\"\nmodel = \"systor\"\n",
    )
    .unwrap();
    let o = sim(&["run", "--config", f.to_str().unwrap(), "--no-progress"]);
    assert_refused(&o, &["systor.toml", "read_pct", "synthetic", "remove it"]);
    // The same job without the field is accepted (fails or runs on its merits).
    std::fs::write(
        &f,
        "duration_ns = 100000\n[[workload.jobs]]\nname = \"s\"\n[workload.jobs.job]\nkind = \"synthetic\"\nmodel = \"systor\"\n",
    )
    .unwrap();
    let o = sim(&["run", "--config", f.to_str().unwrap(), "--no-progress"]);
    assert!(!stderr(&o).contains("does nothing"), "{}", stderr(&o));
}

#[test]
fn sim_config_leaves_out_fields_the_jobs_model_ignores() {
    let o = trellis(&["sim", "config", "rack27-tor"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("model = \"systor\""), "{text}");
    assert!(
        !text.contains("read_pct ="),
        "systor sets its own mix:\n{text}"
    );
    // The printed scenario still runs as a config file.
    let d = tmp();
    let f = d.path().join("rack.toml");
    std::fs::write(
        &f,
        text.replace("duration_ns = 20000000", "duration_ns = 200000"),
    )
    .unwrap();
    let o = sim(&[
        "run",
        "--config",
        f.to_str().unwrap(),
        "--no-progress",
        "--duration-ms",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // fio jobs keep theirs.
    let o = trellis(&["sim", "config", "testbed-switched"]);
    assert!(stdout(&o).contains("read_pct ="), "{}", stdout(&o));
}

/// Every `--flag` a help text mentions is a flag of that command (the
/// suite's help named --target-pid while the flag was --target_pid).
#[test]
fn help_texts_only_name_flags_that_exist() {
    for cmd in [
        &["target"][..],
        &["bench"],
        &["bench", "suite"],
        &["sim", "run"],
        &["sim", "cost"],
        &["sim", "sweep"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let help = stdout(&trellis(&args));
        let declared: Vec<&str> = help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            // The flag part ends where the description starts (two spaces).
            .filter_map(|l| l.split("  ").next())
            .flat_map(|l| l.split([' ', ',', '=']).filter(|w| w.starts_with("--")))
            .collect();
        // Descriptions, without the defaults clap appends (a default may
        // be a command line of another program, e.g. the suite's target).
        let prose: String = help
            .lines()
            .map(|l| l.split(" [default:").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let mentioned = prose
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .filter(|w| w.starts_with("--") && w.len() > 2);
        for m in mentioned {
            assert!(
                declared.contains(&m),
                "`trellis {}` help mentions {m}, which is not one of its flags {declared:?}",
                cmd.join(" ")
            );
        }
    }
}

#[test]
fn bad_replica_lists_are_refused_before_connecting() {
    // Each is refused with the value and the fix, before any connection
    // (the addresses point nowhere).
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--replicas", "127.0.0.1:1"], &["127.0.0.1:1", "2 to 8"]),
        (
            &["--replicas", "127.0.0.1:1,127.0.0.1:1"],
            &["127.0.0.1:1 twice", "different target"],
        ),
        (
            &[
                "--replicas",
                "127.0.0.1:1,127.0.0.1:2",
                "--replica-read",
                "fastest",
            ],
            &["\"fastest\"", "headroom or round-robin"],
        ),
        (&["--replica-read", "headroom"], &["needs --replicas"]),
        (
            &[
                "--replicas",
                "127.0.0.1:1,127.0.0.1:2",
                "--addr",
                "127.0.0.1:3",
            ],
            &["--replicas and --addr", "name every target in --replicas"],
        ),
    ];
    for (args, needles) in cases {
        let mut a = vec!["bench", "--runtime", "100ms"];
        a.extend_from_slice(args);
        let o = trellis(&a);
        assert_refused(&o, needles);
        assert_one_line(&o);
    }
}
