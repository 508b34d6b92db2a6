//! Granted commands: the host side of `cc:fleet/commands`.
//!
//! A plugin may run exactly the commands its `capabilities.run` names, each by the name of
//! its entry, and nothing else:
//!
//! ```json
//! {"ipmi-sensors": {"path": "/usr/sbin/ipmi-sensors", "args": ["--comma-separated-output"],
//!                   "user": "ccfleet", "timeout": "5s", "max-output-bytes": 1048576}}
//! ```
//!
//! The plugin passes only the name: it cannot add arguments, environment or input. The host
//! runs the grant
//!
//! - without a shell, as the absolute `path` with the fixed `args`;
//! - with a cleared environment holding only `PATH=/usr/bin:/bin` and `LC_ALL=C`, standard
//!   input from `/dev/null`, `/` as working directory, as `user` when one is given (its
//!   primary and supplementary groups from the user database; switching needs an agent
//!   running as root), and with `max-processes` as the processes' `RLIMIT_NPROC` when given;
//! - as the leader of a process group of its own: at the `timeout` (default 5 s), when its
//!   output passes `max-output-bytes` (default 1 MiB, standard output and error together),
//!   and when the command exits, the whole group is killed with `SIGKILL`, so nothing it
//!   started outlives the run (a process that leaves the group, with `setsid`, is outside
//!   the host's reach);
//! - only if the file is still the one checked when the plugin started: the executable is
//!   opened then (following links), checked to be a regular file executable by the user
//!   and not writable by every user, and its descriptor kept. Each run opens the path again
//!   and refuses to run unless it leads to the same file (device and inode, which the kept
//!   descriptor stops from being reused); the run then executes the kept descriptor itself
//!   (`/proc/self/fd/N`), so the file checked is the file run. A replaced executable (a
//!   package upgrade, a link pointed elsewhere) is refused until the plugin is loaded
//!   again (the agent restarts, or a new version of its component arrives). The process'
//!   short name (`comm`) is therefore the descriptor's number; its `argv[0]` is the path.
//!
//! A grant that cannot be used at start-up (a missing file, an unknown user) does not stop
//! the plugin: each run of it returns the start-up error, and `--check-config` reports it.
//! Every run is counted per plugin ([`CommandStats`]), by how it ended.
//!
//! The runner waits on the process' pipes, its exit (`SIGCHLD`) and its deadline
//! asynchronously: a running command occupies no runtime worker. Its process group is
//! killed before the leader is reaped, so the group id cannot belong to anyone else yet;
//! dropping the run's future (a cancelled call) kills the group too.
//!
//! The grant (`grant`), the user it runs as (`identity`), its executable checked and held
//! open (`prepared`), one plugin's set of grants (`grants`), the run itself (`execute`),
//! how a run ends (`outcome`) and the counters of runs (`stats`), each in its file.

use std::time::Duration;

mod execute;
mod grant;
mod grants;
mod identity;
mod outcome;
mod prepared;
mod stats;
#[cfg(test)]
mod tests;

pub use grant::{RunGrant, validate};
pub use grants::CommandGrants;
pub(crate) use grants::StoreCommands;
pub use outcome::{CommandOutput, RunError, RunResult};
pub use prepared::{GrantCheck, check};
pub use stats::{CommandSnapshot, CommandStats};

/// How long a command may run unless its grant says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How many bytes of output (standard output and error together) a command may write
/// unless its grant says otherwise.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;

/// The `PATH` a command runs with.
pub const PATH: &str = "/usr/bin:/bin";

/// The longest name of a grant, in bytes.
pub const MAX_NAME: usize = 64;
