//! `--stub-spin-us` and `--runtime-spin-us`: the flags' values ([`Spin`]), and the budgets
//! they give, measured once at start-up for `auto`.

use std::time::Duration;

use tracing::info;

/// `--stub-spin-us`: a fixed budget, or one measured at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spin {
    Auto,
    Micros(u32),
}

/// Reads `--stub-spin-us` or `--runtime-spin-us`: `auto`, or a number of microseconds.
pub(super) fn parse_spin(s: &str) -> Result<Spin, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Spin::Auto);
    }
    s.parse::<u32>()
        .map(Spin::Micros)
        .map_err(|_| format!("'{s}' is neither `auto` nor a number of microseconds (0 never spins)"))
}

/// The stub's and the runtime's spin budgets in microseconds: `auto` measures, once, what waking
/// a sleeping thread costs here (`tritium_host::spin`: the median of 30 wake-ups, each after 2 ms
/// of idleness, about 70 ms).
pub(super) fn spin_budgets(stub: Spin, runtime: Spin) -> (u32, u32) {
    use tritium_host::spin;
    let cost = (stub == Spin::Auto || runtime == Spin::Auto).then(|| spin::wake_cost(30, Duration::from_millis(2)));
    // A number is the budget; `auto` is the flag's rule applied to the measured cost (measured
    // whenever a flag is `auto`).
    let budget = |flag, rule: fn(Duration) -> Duration| match flag {
        Spin::Micros(us) => Duration::from_micros(u64::from(us)),
        Spin::Auto => rule(cost.unwrap_or_default()),
    };
    let (stub_budget, runtime_budget) = (budget(stub, spin::budget_for), budget(runtime, spin::runtime_budget_for));
    if let (Spin::Auto, Some(cost)) = (stub, cost) {
        info!(
            wake_cost_us = cost.as_micros() as u64,
            spin_us = stub_budget.as_micros() as u64,
            "waking a sleeping thread takes {} us here ({} than {} us), so waiters spin {} before they sleep (--stub-spin-us auto)",
            cost.as_micros(),
            if stub_budget.is_zero() { "less" } else { "no less" },
            spin::SPIN_THRESHOLD.as_micros(),
            spin_words(stub_budget)
        );
    }
    if runtime == Spin::Auto {
        info!(
            runtime_spin_us = runtime_budget.as_micros() as u64,
            "an async runtime thread spins {} for a stub executing a batch before it sleeps (--runtime-spin-us auto)",
            spin_words(runtime_budget)
        );
    }
    (micros(stub_budget), micros(runtime_budget))
}

/// "never", or "up to N us", for the log.
fn spin_words(budget: Duration) -> String {
    if budget.is_zero() {
        "never".to_string()
    } else {
        format!("up to {} us", budget.as_micros())
    }
}

/// `d` in whole microseconds, at most `u32::MAX`.
fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_flag_is_auto_or_microseconds() {
        assert_eq!(parse_spin("auto"), Ok(Spin::Auto));
        assert_eq!(parse_spin("AUTO"), Ok(Spin::Auto));
        assert_eq!(parse_spin("0"), Ok(Spin::Micros(0)));
        assert_eq!(parse_spin("250"), Ok(Spin::Micros(250)));
        let err = parse_spin("fast").expect_err("not a budget");
        assert!(err.contains("'fast'") && err.contains("auto"), "{err}");
        assert_eq!(spin_budgets(Spin::Micros(7), Spin::Micros(3)), (7, 3));
    }
}
