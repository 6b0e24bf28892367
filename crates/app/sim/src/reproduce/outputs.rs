//! What `nsdi26` writes: table.txt, nsdi26.json and the SVG plots.

use super::{find, format_table, Row};
use crate::cost::{capex, Prices};
use crate::run::Results;
use crate::svg::{line_chart, Series};
use anyhow::Result;
use std::path::Path;

pub(super) fn write_outputs(dir: &Path, rows: &[Row], runs: &[Results]) -> Result<()> {
    std::fs::write(dir.join("table.txt"), format_table(rows))?;
    std::fs::write(
        dir.join("nsdi26.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "runs": runs }))?,
    )?;
    // Latency CDFs of the 27-node OLTP-like run.
    let cdf = |r: &Results| r.read.cdf.iter().map(|&(x, p)| (x, p)).collect::<Vec<_>>();
    let sw = find(runs, "rack27-tor-oltp");
    let sl = find(runs, "rack27-torus3d-oltp");
    let svg = line_chart(
        "27 nodes, OLTP-like: read latency CDF",
        "latency (us, log)",
        "fraction",
        &[
            Series {
                name: "switched",
                points: cdf(sw),
            },
            Series {
                name: "3D torus",
                points: cdf(sl),
            },
        ],
        true,
    );
    std::fs::write(dir.join("latency-cdf-oltp.svg"), svg)?;
    let mut series = Vec::new();
    for kind in ["torus3d", "dragonfly"] {
        let r = find(runs, &format!("rack27-{kind}-mixed-50-50-failure"));
        let pts = r
            .timeseries_mb_s
            .iter()
            .enumerate()
            .map(|(i, &y)| (i as f64 * r.timeseries_bin_ns as f64 / 1e6, y))
            .collect();
        series.push(Series {
            name: if kind == "torus3d" {
                "3D torus"
            } else {
                "dragonfly"
            },
            points: pts,
        });
    }
    std::fs::write(
        dir.join("failure-throughput.svg"),
        line_chart(
            "Link failure (mixed 50/50): throughput",
            "time (ms)",
            "MB/s",
            &series,
            false,
        ),
    )?;
    std::fs::write(dir.join("capex.svg"), capex_svg(&Prices::default(), 4, 64))?;
    Ok(())
}

pub fn capex_svg(pr: &Prices, from: u32, to: u32) -> String {
    let pts = |f: fn(&crate::cost::Capex) -> f64| {
        (from..=to)
            .step_by(2)
            .map(|n| (n as f64, f(&capex(n, pr))))
            .collect::<Vec<_>>()
    };
    line_chart(
        "Capex vs storage nodes",
        "storage nodes",
        "USD",
        &[
            Series {
                name: "switched",
                points: pts(|c| c.switched_usd),
            },
            Series {
                name: "switchless",
                points: pts(|c| c.switchless_usd),
            },
        ],
        false,
    )
}
