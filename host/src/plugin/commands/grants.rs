//! The commands one plugin may run, and a store's view of them during a call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccfleet::untrusted::Untrusted;

use super::MAX_NAME;
use super::execute::execute;
use super::grant::RunGrant;
use super::outcome::{CommandOutput, RunError, RunResult};
use super::prepared::Prepared;
use super::stats::CommandStats;

/// The commands one plugin may run, checked and opened when the plugin starts; shared by
/// all its instances.
#[derive(Debug)]
pub struct CommandGrants {
    grants: BTreeMap<String, Result<Prepared, String>>,
    stats: std::sync::Arc<CommandStats>,
}

impl CommandGrants {
    /// No commands; the refused runs are counted in `stats`.
    pub fn none(stats: std::sync::Arc<CommandStats>) -> CommandGrants {
        CommandGrants {
            grants: BTreeMap::new(),
            stats,
        }
    }

    /// Checks and opens every grant now. A grant that fails its checks stays known by name
    /// and each run of it returns the reason; [`CommandGrants::unusable`] lists them.
    pub fn open(
        grants: &BTreeMap<String, RunGrant>,
        stats: std::sync::Arc<CommandStats>,
    ) -> CommandGrants {
        CommandGrants {
            grants: grants
                .iter()
                .map(|(name, grant)| (name.clone(), Prepared::open(grant)))
                .collect(),
            stats,
        }
    }

    /// Whether no command is granted.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// The grants that could not be opened, with the reason.
    pub fn unusable(&self) -> impl Iterator<Item = (&str, &str)> {
        self.grants
            .iter()
            .filter_map(|(name, g)| g.as_ref().err().map(|why| (name.as_str(), why.as_str())))
    }

    /// The counters of this plugin's runs.
    pub fn stats(&self) -> &CommandStats {
        &self.stats
    }

    /// The time one call of the plugin may spend in commands: each granted command once,
    /// at its full timeout.
    pub fn call_budget(&self) -> Duration {
        self.grants
            .values()
            .filter_map(|g| g.as_ref().ok())
            .map(|p| p.grant.timeout)
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    /// Runs the command granted as `name` and returns its output; counts the run.
    pub async fn run(&self, name: &str) -> Result<CommandOutput, RunError> {
        self.run_within(name, None).await
    }

    /// [`CommandGrants::run`] ended at `limit` at the latest (what the plugin's call has
    /// left of its command time) when that comes before the grant's own timeout.
    pub async fn run_within(
        &self,
        name: &str,
        limit: Option<Duration>,
    ) -> Result<CommandOutput, RunError> {
        let begun = Instant::now();
        let result = self.run_uncounted(name, limit).await;
        let kind = match &result {
            Ok(out) if out.status == Some(0) => RunResult::Ok,
            Ok(_) => RunResult::ExitNonzero,
            Err(e) => e.result,
        };
        self.stats.record(kind, begun.elapsed());
        result
    }

    async fn run_uncounted(
        &self,
        name: &str,
        limit: Option<Duration>,
    ) -> Result<CommandOutput, RunError> {
        let prepared = match self.grants.get(name) {
            None => {
                return Err(RunError::new(
                    RunResult::Refused,
                    format!(
                        "command {} is not granted to this plugin (capabilities.run)",
                        Untrusted(name).capped(MAX_NAME + 16)
                    ),
                ));
            }
            Some(Err(why)) => {
                return Err(RunError::new(
                    RunResult::Failed,
                    format!("command {name} cannot be run: {why}"),
                ));
            }
            Some(Ok(prepared)) => prepared,
        };
        if limit.is_some_and(|left| left.is_zero()) {
            return Err(RunError::new(
                RunResult::Timeout,
                format!(
                    "command {name} was not started: this call has used all its time for \
                     commands (one run of each granted command at its timeout)"
                ),
            ));
        }
        prepared
            .recheck()
            .map_err(|why| RunError::new(RunResult::Failed, format!("command {name}: {why}")))?;
        execute(name, prepared, limit).await
    }
}

/// A store's view of its plugin's commands: the grants, shared by the plugin's instances,
/// and what the current call has left of its command time.
///
/// Time in a command is not charged to the call's CPU deadline (`limits.call-timeout`): a
/// collector waiting five seconds for `ipmitool` is not running. It is bounded instead by
/// [`CommandGrants::call_budget`] per call, so a call still ends, at the latest after its
/// call timeout plus that budget.
#[derive(Debug)]
pub(crate) struct StoreCommands {
    grants: std::sync::Arc<CommandGrants>,
    left: Duration,
}

impl StoreCommands {
    pub fn new(grants: std::sync::Arc<CommandGrants>) -> StoreCommands {
        let left = grants.call_budget();
        StoreCommands { grants, left }
    }

    /// A call into the plugin begins: its command time is full again.
    pub fn new_call(&mut self) {
        self.left = self.grants.call_budget();
    }

    /// The grants and the command time the call has left.
    pub fn begin(&self) -> (std::sync::Arc<CommandGrants>, Duration) {
        (self.grants.clone(), self.left)
    }

    /// Charges `took` to the call's command time.
    pub fn spent(&mut self, took: Duration) {
        self.left = self.left.saturating_sub(took);
    }
}
