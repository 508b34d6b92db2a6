//! The restart policy: exponential backoff with a budget that a healthy period restores.
//! Pure: it is given the times and decides, so its tests need no clock.

use std::time::{Duration, Instant};

use super::spec::Limits;

/// What the restart policy decided after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Restart { delay: Duration, restarts: u32 },
    Quarantine { restarts: u32 },
}

/// Exponential backoff with a restart budget that a healthy period restores.
#[derive(Debug, Clone)]
pub(crate) struct RestartPolicy {
    budget: u32,
    base: Duration,
    max: Duration,
    healthy: Duration,
    restarts: u32,
}

impl RestartPolicy {
    pub fn new(limits: &Limits) -> Self {
        RestartPolicy {
            budget: limits.restart_budget,
            base: limits.restart_backoff,
            max: limits.max_restart_backoff.max(limits.restart_backoff),
            healthy: limits.healthy_period,
            restarts: 0,
        }
    }

    /// Decides about an instance that started at `started` and failed at `now`.
    pub fn on_failure(&mut self, started: Instant, now: Instant) -> Decision {
        if now.saturating_duration_since(started) >= self.healthy {
            self.restarts = 0;
        }
        if self.restarts >= self.budget {
            return Decision::Quarantine {
                restarts: self.restarts,
            };
        }
        let factor = 1u32.checked_shl(self.restarts).unwrap_or(u32::MAX);
        let delay = self.base.saturating_mul(factor).min(self.max);
        self.restarts += 1;
        Decision::Restart {
            delay,
            restarts: self.restarts,
        }
    }

    pub fn reset(&mut self) {
        self.restarts = 0;
    }

    pub fn restarts(&self) -> u32 {
        self.restarts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(budget: u32) -> RestartPolicy {
        RestartPolicy::new(&Limits {
            restart_budget: budget,
            restart_backoff: Duration::from_millis(100),
            max_restart_backoff: Duration::from_millis(350),
            healthy_period: Duration::from_secs(60),
            ..Limits::default()
        })
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_then_quarantines() {
        let mut p = policy(4);
        let t0 = Instant::now();
        let delays: Vec<_> = (0..5).map(|_| p.on_failure(t0, t0)).collect();
        let ms = |m| Duration::from_millis(m);
        assert_eq!(
            delays,
            vec![
                Decision::Restart {
                    delay: ms(100),
                    restarts: 1
                },
                Decision::Restart {
                    delay: ms(200),
                    restarts: 2
                },
                Decision::Restart {
                    delay: ms(350),
                    restarts: 3
                },
                Decision::Restart {
                    delay: ms(350),
                    restarts: 4
                },
                Decision::Quarantine { restarts: 4 },
            ]
        );
    }

    #[test]
    fn a_healthy_period_restores_the_budget() {
        let mut p = policy(1);
        let t0 = Instant::now();
        assert!(matches!(
            p.on_failure(t0, t0),
            Decision::Restart { restarts: 1, .. }
        ));
        // Failing again right away spends nothing more: quarantine.
        assert!(matches!(p.on_failure(t0, t0), Decision::Quarantine { .. }));
        // An instance that ran for the healthy period starts over with a full budget.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            p.on_failure(t0, later),
            Decision::Restart {
                delay: Duration::from_millis(100),
                restarts: 1
            }
        );
    }

    #[test]
    fn a_zero_budget_quarantines_at_once() {
        let mut p = policy(0);
        let t0 = Instant::now();
        assert_eq!(p.on_failure(t0, t0), Decision::Quarantine { restarts: 0 });
    }
}
