//! The claim | paper | Trellis rows, computed from the runs, and the human
//! table.

use super::scenarios::knobs;
use super::{find, leading_number, reduction, Row};
use crate::config::{failure_converge_ns, failure_detect_ns};
use crate::cost::{capex, Prices};
use crate::run::Results;

/// The rows as they are built, in the table's order.
struct Rows(Vec<Row>);

impl Rows {
    /// (id, claim, paper as printed, (ours as a number, its unit), note)
    fn add(&mut self, id: &str, claim: &str, paper: &str, ours: (f64, &str), note: &str) {
        let (value, unit) = ours;
        let trellis_text = match unit {
            "%" => format!("{value:+.1}%"),
            "x" => format!("{value:.2}x"),
            "USD" => format!("${value:.0}"),
            "us" => format!("{value:+.2} us"),
            _ => format!("{value}"),
        };
        self.0.push(Row {
            id: id.into(),
            claim: claim.into(),
            paper: leading_number(paper),
            trellis: Some(value),
            unit: unit.into(),
            paper_text: paper.into(),
            trellis_text,
            note: note.into(),
        });
    }
}

/// A reduction as the table prints it: negative = switchless lower.
fn pc(x: f64) -> (f64, &'static str) {
    (-x * 100.0, "%")
}

pub(super) fn table(runs: &[Results]) -> Vec<Row> {
    let mut rows = Rows(Vec::new());
    testbed_rows(&mut rows, runs);
    ycsb_rows(&mut rows, runs);
    rack27_rows(&mut rows, runs);
    failure_rows(&mut rows, runs);
    drill_down_rows(&mut rows, runs);
    capex_rows(&mut rows);
    rows.0
}

/// The 4-node testbed fio rows: randread and seqwrite average latency, clean and fragmented.
fn testbed_rows(rows: &mut Rows, runs: &[Results]) {
    for (job, op, papers) in [
        ("randread-4k", 0, ["-32.3%", "-43.1%"]),
        ("seqwrite-128k", 1, ["-18.0%", "-20.3%"]),
    ] {
        for (state, paper) in ["clean", "frag"].iter().zip(papers) {
            let sw = find(runs, &format!("testbed-switched-{job}-{state}"));
            let sl = find(runs, &format!("testbed-switchless-{job}-{state}"));
            let (a, b) = if op == 0 {
                (&sw.read, &sl.read)
            } else {
                (&sw.write, &sl.write)
            };
            let id = format!("t4.{}.{state}", job.replace('-', ""));
            rows.add(
                &id,
                &format!("4-node 2D torus vs switched: {job} avg latency, {state}"),
                paper,
                pc(reduction(a.lat_avg_us, b.lat_avg_us)),
                &format!("{:.1} vs {:.1} us", a.lat_avg_us, b.lat_avg_us),
            );
        }
    }
}

/// The YCSB rows: throughput ratio, average and p99.9 read latency, each the mean over A-F.
fn ycsb_rows(rows: &mut Rows, runs: &[Results]) {
    let (mut tput, mut avg, mut tail) = (vec![], vec![], vec![]);
    for w in ['A', 'B', 'C', 'D', 'E', 'F'] {
        let sw = find(runs, &format!("testbed-switched-ycsb-{w}"))
            .ycsb
            .clone()
            .unwrap();
        let sl = find(runs, &format!("testbed-switchless-ycsb-{w}"))
            .ycsb
            .clone()
            .unwrap();
        tput.push(sl.kops_s / sw.kops_s);
        avg.push(reduction(sw.read_lat_avg_us, sl.read_lat_avg_us));
        tail.push(reduction(sw.read_lat_p999_us, sl.read_lat_p999_us));
    }
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    rows.add(
        "ycsb.thpt_ratio",
        "YCSB A-F throughput, switchless / switched",
        "~1.00x",
        (mean(&tput), "x"),
        "mean over A-F",
    );
    rows.add(
        "ycsb.read_avg",
        "YCSB avg read latency",
        "-28.3%",
        pc(mean(&avg)),
        "mean over A-F",
    );
    rows.add(
        "ycsb.read_p999",
        "YCSB p99.9 read latency",
        "-25.0%",
        pc(mean(&tail)),
        "mean over A-F",
    );
}

/// The 27-node rows: the trace-like jobs, uniform and mixed sizes, and incast.
fn rack27_rows(rows: &mut Rows, runs: &[Results]) {
    for (m, paper) in [
        ("oltp", "-50.0%"),
        ("systor", "-19.5%"),
        ("websearch", "-15.9%"),
    ] {
        let sw = find(runs, &format!("rack27-tor-{m}"));
        let sl = find(runs, &format!("rack27-torus3d-{m}"));
        rows.add(
            &format!("r27.{m}.read_avg"),
            &format!("27 nodes 600GbE 3D torus, {m}-like: avg read latency"),
            paper,
            pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
            &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
        );
    }
    let pair = |j: &str| {
        (
            find(runs, &format!("rack27-tor-{j}")),
            find(runs, &format!("rack27-torus3d-{j}")),
        )
    };
    let (sw, sl) = pair("uniform-4k");
    rows.add(
        "r27.uniform4k.read_avg",
        "27 nodes, uniform 4 KiB: avg read latency",
        "-39.7%",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
    );
    let (sw, sl) = pair("mixed-50-50");
    rows.add(
        "r27.mixed.read_avg",
        "27 nodes, mixed 4/32/128 KiB: avg read latency",
        "-85.4%",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
    );
    rows.add(
        "r27.mixed.write_avg",
        "27 nodes, mixed 4/32/128 KiB: avg write latency",
        "-91.2%",
        pc(reduction(sw.write.lat_avg_us, sl.write.lat_avg_us)),
        &format!(
            "{:.1} vs {:.1} us",
            sw.write.lat_avg_us, sl.write.lat_avg_us
        ),
    );
    let (sw, sl) = pair("incast-4k");
    rows.add(
        "r27.incast4k.read_avg",
        "Incast to one drive: avg read latency",
        "~0 (drive-bound)",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
    );
}

/// The link-failure rows (throughput drop, recovery in the note) and their RTO and RACK sensitivities.
fn failure_rows(rows: &mut Rows, runs: &[Results]) {
    for (job, kind, drop, rec, short) in [
        ("fail-4k-95-5", "torus3d", "1.6%", "0.5 ms", "4k"),
        ("fail-4k-95-5", "dragonfly", "2.1%", "0.75 ms", "4k"),
        ("mixed-50-50", "torus3d", "6.8%", "2 ms", "mixed"),
        ("mixed-50-50", "dragonfly", "4.5%", "1.8 ms", "mixed"),
    ] {
        let r = find(runs, &format!("rack27-{kind}-{job}-failure"));
        let f = r.failure.clone().unwrap();
        let recov = match (f.dipped, f.recovery_ns) {
            (false, _) => "none needed (no measurable dip)".to_string(),
            (true, Some(n)) => format!("{:.2} ms", n as f64 / 1e6),
            (true, None) => "not within run".into(),
        };
        rows.add(
            &format!("fail.{kind}.{short}.drop"),
            &format!("Link failure, {kind}, {job}: throughput drop (recovery in the note)"),
            &format!("{drop} / {rec}"),
            (f.throughput_drop * 100.0, "%"),
            &format!(
                "recovery {recov}; {} I/Os lost ({} resent once RACK found the loss, the rest after the TCP RTO); detection {} ms, convergence {} ms",
                f.lost_ios,
                f.rack_recoveries,
                failure_detect_ns() / 1_000_000,
                failure_converge_ns() / 1_000_000
            ),
        );
    }
    let f = find(runs, "rack27-torus3d-fail-4k-95-5-failure-rto1ms")
        .failure
        .clone()
        .unwrap();
    rows.add(
        "sens.fail.torus3d.4k.rto1ms",
        "Sensitivity, link failure torus3d 4k: TCP RTO floor 1 ms instead of 200 ms",
        "n/a",
        (f.throughput_drop * 100.0, "%"),
        &format!(
            "{} I/Os lost, {} found by RACK; throughput drop over the run after the failure",
            f.lost_ios, f.rack_recoveries
        ),
    );
    let f = find(runs, "rack27-torus3d-fail-4k-95-5-failure-norack")
        .failure
        .clone()
        .unwrap();
    rows.add(
        "sens.fail.torus3d.4k.norack",
        "Sensitivity, link failure torus3d 4k: no RACK (every loss waits for the RTO)",
        "n/a",
        (f.throughput_drop * 100.0, "%"),
        &format!(
            "{} I/Os lost; throughput drop over the run after the failure",
            f.lost_ios
        ),
    );
}

/// The extra-hop cost, the testbed with every mechanism off, and the one-knob sensitivity rows.
fn drill_down_rows(rows: &mut Rows, runs: &[Results]) {
    let h1 = find(runs, "hop-cost-1").read.lat_avg_us;
    let h2 = find(runs, "hop-cost-2").read.lat_avg_us;
    rows.add(
        "hop.extra_adapter.read_lat",
        "Extra adapter hop, 4 KiB read (QD1)",
        "+2.9 us",
        (h2 - h1, "us"),
        "input 2.9 us + wire time",
    );
    let sw = find(runs, "testbed-switched-randread-4k-baseline-frag");
    let sl = find(runs, "testbed-switchless-randread-4k-baseline-frag");
    rows.add(
        "t4.randread4k.frag.mechanisms_off",
        "Drill-down: 4-node randread frag, all mechanisms off",
        "n/a",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!(
            "{:.1} vs {:.1} us (ECMP, FIFO)",
            sw.read.lat_avg_us, sl.read.lat_avg_us
        ),
    );
    for (id, what, _) in knobs() {
        let sw = find(runs, &format!("testbed-switched-randread-4k-sens-{id}"));
        let sl = find(runs, &format!("testbed-switchless-randread-4k-sens-{id}"));
        rows.add(
            &format!("sens.{id}"),
            &format!("Sensitivity, 4-node randread clean: {what}"),
            "n/a",
            pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
            &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
        );
    }
}

/// The capex rows at 20 storage nodes.
fn capex_rows(rows: &mut Rows) {
    let c = capex(20, &Prices::default());
    rows.add(
        "capex20.switched",
        "Capex, 20 storage nodes: switched",
        "~$105,000",
        (c.switched_usd, "USD"),
        &format!("{}; default prices", c.switch_plan),
    );
    rows.add(
        "capex20.switchless",
        "Capex, 20 storage nodes: switchless",
        "~$52,000",
        (c.switchless_usd, "USD"),
        "4-port adapters",
    );
    rows.add(
        "capex20.saving",
        "Capex saving",
        "50.5%",
        (c.saving * 100.0, "%"),
        "see docs/cost-model.md",
    );
}

pub fn format_table(rows: &[Row]) -> String {
    let w0 = rows.iter().map(|r| r.claim.len()).max().unwrap_or(5).max(5);
    let w1 = rows
        .iter()
        .map(|r| r.paper_text.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let w2 = rows
        .iter()
        .map(|r| r.trellis_text.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let mut s = format!(
        "{:w0$} | {:w1$} | {:w2$} | note\n",
        "claim", "paper", "Trellis"
    );
    s += &format!(
        "{}-|-{}-|-{}-|-----\n",
        "-".repeat(w0),
        "-".repeat(w1),
        "-".repeat(w2)
    );
    for r in rows {
        s += &format!(
            "{:w0$} | {:w1$} | {:w2$} | {}\n",
            r.claim, r.paper_text, r.trellis_text, r.note
        );
    }
    s += "paper column: second-hand figures from a third-party summary of the NSDI'26 paper (docs/sources.md), not verified against the paper.\n";
    s
}
