//! Issue 10: random flag values never panic the binary, and a failure always
//! comes with a message.

mod common;
use common::*;
use proptest::prelude::*;

/// No panic; a failure explains itself on stderr.
fn assert_clean(o: &std::process::Output, args: &[String]) {
    let err = stderr(o);
    assert_ne!(o.status.code(), Some(101), "{args:?} panicked:\n{err}");
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    assert!(o.status.code().is_some(), "{args:?} killed by a signal");
    if !o.status.success() {
        assert!(
            err.starts_with("trellis: ") || err.starts_with("error: "),
            "{args:?} failed without a message:\n{err}"
        );
    }
}

fn run(args: Vec<String>) {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = trellis_within(&a, std::time::Duration::from_secs(60));
    if std::env::var_os("PROPS_VERBOSE").is_some() {
        eprintln!(
            "{args:?} -> {:?}: {}",
            o.status.code(),
            stderr(&o).lines().next().unwrap_or("")
        );
    }
    assert_clean(&o, &args);
}

/// Sizes as users type them, and a few they should not.
fn size() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => any::<u64>().prop_map(|n| n.to_string()),
        2 => (0u64..5000).prop_map(|n| n.to_string()),
        6 => (0u64..2048, prop::sample::select(vec!["k", "M", "k", "M", "G", "T", "E", "KiB", "b", "x", ""]))
            .prop_map(|(n, u)| format!("{n}{u}")),
        1 => "[ -~]{0,8}",
    ]
}

/// Mostly values a user would give, sometimes any number or any text.
fn word(values: Vec<&'static str>) -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(values).prop_map(String::from),
        1 => any::<u32>().prop_map(|n| n.to_string()),
        1 => "[ -~]{0,10}",
    ]
}

/// Each flag at most once (clap refuses repeats of most), each present
/// with probability 0.4.
fn flags(each: Vec<BoxedStrategy<Vec<String>>>) -> impl Strategy<Value = Vec<String>> {
    each.into_iter()
        .map(|s| prop::option::weighted(0.4, s))
        .collect::<Vec<_>>()
        .prop_map(|v| v.into_iter().flatten().flatten().collect())
}

fn flag(
    name: &'static str,
    v: impl Strategy<Value = String> + 'static,
) -> BoxedStrategy<Vec<String>> {
    v.prop_map(move |s| vec![name.to_string(), s]).boxed()
}

fn target_flags() -> impl Strategy<Value = Vec<String>> {
    flags(vec![
        flag("--ram", size()),
        flag("--null", size()),
        flag("--emulated", size()),
        flag("--block-size", word(vec!["512", "4096", "1024", "0"])),
        flag("--reactors", word(vec!["1", "2", "0", "300"])),
        flag(
            "--listen",
            word(vec![
                "127.0.0.1:0",
                "localhost:0",
                "[::1]:0",
                "1.2.3.4:99999",
                ":",
            ]),
        ),
        flag("--nqn", word(vec!["nqn.2026-11.io.x:y", "bogus", ""])),
        flag("--qos", word(vec!["off", "gimbal"])),
        flag("--engine", word(vec!["epoll", "uring"])),
        flag(
            "--profile",
            word(vec!["pm9a3-gen4", "femu", "nvmevirt-970pro"]),
        ),
        flag("--precondition", word(vec!["clean", "fragmented"])),
        flag(
            "--time-scale",
            word(vec!["1", "0", "-1", "NaN", "inf", "1e300", "2.5"]),
        ),
        flag("--file", word(vec!["/nonexistent/x", "/dev/null", ""])),
        flag("--file-size", size()),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn target_check_never_panics(flags in target_flags()) {
        let d = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = vec!["target".into(), "--check".into(), "--state-dir".into(),
            d.path().to_str().unwrap().into()];
        args.extend(flags);
        run(args);
    }

    #[test]
    fn sim_cost_never_panics(nodes in any::<u32>(), max in any::<u32>()) {
        let d = tempfile::tempdir().unwrap();
        let nodes = if nodes % 2 == 0 { nodes % 100 } else { nodes };
        let max = if max % 2 == 0 { max % 100 } else { max };
        run(vec!["sim".into(), "cost".into(), "--nodes".into(), nodes.to_string(),
            "--max-nodes".into(), max.to_string(), "--out".into(), d.path().to_str().unwrap().into()]);
    }
}

proptest! {
    // Each case simulates a little: few of them.
    #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sim_run_never_panics(
        preset in word(vec!["testbed-switched", "testbed-switchless", "testbed-switched"]),
        ms in prop_oneof![0u64..3, any::<u64>()],
        seed in any::<u64>(),
    ) {
        let d = tempfile::tempdir().unwrap();
        run(vec!["sim".into(), "run".into(), "--no-progress".into(), "--preset".into(), preset,
            "--duration-ms".into(), ms.to_string(), "--seed".into(), seed.to_string(),
            "--out".into(), d.path().to_str().unwrap().into()]);
    }
}

fn bench_flags() -> impl Strategy<Value = Vec<String>> {
    flags(vec![
        flag(
            "--rw",
            word(vec![
                "read",
                "write",
                "randread",
                "randwrite",
                "randrw",
                "rw",
            ]),
        ),
        flag(
            "--bs",
            prop_oneof![
                3 => prop::sample::select(vec!["512", "4k", "64k", "128k", "1m", "8m"]).prop_map(String::from),
                1 => size(),
            ],
        ),
        flag("--iodepth", word(vec!["1", "8", "128", "1000"])),
        flag("--numjobs", word(vec!["1", "2"])),
        flag("--queues", word(vec!["1", "2"])),
        flag("--size", size()),
        flag("--offset", size()),
        flag("--bssplit", word(vec!["4k/50:8k/50", "4k/100"])),
        flag("--rwmixread", word(vec!["0", "50", "100"])),
        flag("--digest", word(vec!["none", "header,data"])),
        flag("--nsid", word(vec!["1", "1", "2"])),
        flag("--verify", word(vec!["crc32c", "0"])),
        flag(
            "--cmd-timeout-ms",
            word(vec!["10000", "0", "18446744073709551615"]),
        ),
        flag("--kato-ms", word(vec!["10000", "0", "4294967295"])),
        flag(
            "--rate-iops",
            word(vec!["0", "1000", "18446744073709551615"]),
        ),
        flag("--rate", size()),
    ])
}

/// Random bench flags against one live target: every run ends (short runs),
/// without a panic, and a failure says why.
#[test]
fn bench_never_panics_against_a_live_target() {
    use proptest::test_runner::{Config, TestRunner};
    let t = LiveTarget::start(&["--ram", "16M"]);
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&bench_flags(), |flags| {
            let mut args: Vec<String> = ["bench", "--no-progress", "--runtime", "150ms", "--addr"]
                .map(String::from)
                .into();
            args.push(t.addr());
            args.extend(flags);
            run(args);
            Ok(())
        })
        .unwrap();
}
