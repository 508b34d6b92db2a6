//! The `likwid_formulas` fuzz target's check, also replayed over its seeds by the tests: any
//! event sets and formulas, as a site could write them, are checked into a [`Plan`] without
//! a panic, and an accepted plan turns any counter values (NaN, infinities, zeros, a `time`
//! of zero) into finite metric values only.
//!
//! The input is text, one item per line:
//!
//! ```text
//! E PMC0 FP_ARITH_INST_RETIRED_SCALAR_DOUBLE
//! M hwthread flops_dp 1.0E-06*(PMC0)/time
//! G node total sum(flops_dp)
//! V 1e9 NaN -0 inf
//! T 0.5
//! Z
//! ```
//!
//! `E` adds a counter and its event, `M` a metric of the event set (scope, name, formula),
//! `G` a global metric, `V` counter values (the first hardware thread's; the second gets them
//! reversed), `T` the measured time, `Z` sets `invalid_to_zero`. Other lines are ignored.

use super::likwid_metrics::{EventSetSpec, MetricSpec, Plan, SetResult, Thread};

/// One input, read.
struct Input {
    set: EventSetSpec,
    globals: Vec<MetricSpec>,
    values: Vec<f64>,
    time: f64,
    invalid_to_zero: bool,
}

/// Checks one input; `Some` names a metric value that is not finite.
pub fn check_fuzz_input(data: &[u8]) -> Option<String> {
    evaluate(&read(data))?
        .into_iter()
        .find(|v| !v.value.is_finite())
        .map(|v| format!("{v:?}"))
}

/// The metric values of the input's plan; `None` when the plan is refused.
fn evaluate(input: &Input) -> Option<Vec<super::likwid_metrics::MetricValue>> {
    let plan = Plan::new(std::slice::from_ref(&input.set), &input.globals).ok()?;
    let threads = [Thread { cpu: 0, socket: 0 }, Thread { cpu: 5, socket: 1 }];
    let rows = vec![
        input.values.clone(),
        input.values.iter().rev().copied().collect(),
    ];
    let result = SetResult {
        values: rows,
        time: input.time,
    };
    Some(plan.evaluate(&threads, &[Some(result)], 1e-9, 1.0, input.invalid_to_zero))
}

fn read(data: &[u8]) -> Input {
    let text = String::from_utf8_lossy(data);
    let mut set = EventSetSpec::default();
    let mut globals = Vec::new();
    let mut values = Vec::new();
    let mut time = 1.0;
    let mut invalid_to_zero = false;
    for line in text.lines() {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "E" => {
                let (counter, event) = rest.split_once(' ').unwrap_or((rest, ""));
                set.events.push((counter.to_owned(), event.to_owned()));
            }
            "M" | "G" => {
                let mut parts = rest.splitn(3, ' ');
                let metric = MetricSpec {
                    scope: parts.next().unwrap_or_default().to_owned(),
                    name: parts.next().unwrap_or_default().to_owned(),
                    calc: parts.next().unwrap_or_default().to_owned(),
                };
                if kind == "M" {
                    set.metrics.push(metric);
                } else {
                    globals.push(metric);
                }
            }
            "V" => values.extend(
                rest.split_whitespace()
                    .filter_map(|v| v.parse::<f64>().ok()),
            ),
            "T" => time = rest.trim().parse().unwrap_or(f64::NAN),
            "Z" => invalid_to_zero = true,
            _ => {}
        }
    }
    Input {
        set,
        globals,
        values,
        time,
        invalid_to_zero,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz target's seeds and past failures hold, and the seeds are accepted plans that
    /// give values (so the check says something about them).
    #[test]
    fn the_fuzz_seeds_and_past_failures_hold() {
        let inputs = crate::fuzz_inputs::inputs("likwid_formulas");
        for (path, data) in &inputs {
            assert_eq!(check_fuzz_input(data), None, "{}", path.display());
        }
        assert!(inputs.len() >= 2, "{} inputs", inputs.len());
        let fuzz = crate::fuzz_inputs::fuzz_dir();
        for seed in ["fritz-flops", "invalid-values"] {
            let data = std::fs::read(fuzz.join("seeds/likwid_formulas").join(seed)).unwrap();
            let values = evaluate(&read(&data)).unwrap_or_else(|| panic!("{seed} is refused"));
            assert!(!values.is_empty(), "{seed} gives no value");
        }
    }

    #[test]
    fn the_input_reads_as_documented() {
        let input =
            read(b"E PMC0 X\nM socket p PMC0/time\nG node t sum(p)\nV 1 2\nT 0.5\nZ\nQ x\n");
        assert_eq!(input.set.events, [("PMC0".to_owned(), "X".to_owned())]);
        assert_eq!(input.set.metrics[0].scope, "socket");
        assert_eq!(input.set.metrics[0].calc, "PMC0/time");
        assert_eq!(input.globals[0].name, "t");
        assert_eq!(
            (input.values.as_slice(), input.time),
            (&[1.0, 2.0][..], 0.5)
        );
        assert!(input.invalid_to_zero);
        let values = evaluate(&input).unwrap();
        // Per socket on its first thread: 1 / 0.5 and 2 / 0.5 (the second thread's reversed).
        let sockets: Vec<f64> = values
            .iter()
            .filter(|v| v.name == "p")
            .map(|v| v.value)
            .collect();
        assert_eq!(sockets, [2.0, 4.0]);
    }
}
