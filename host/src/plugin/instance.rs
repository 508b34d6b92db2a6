//! One instantiation of a plugin: its store, the bindings to its exports and the guard that
//! runs every call under the CPU deadline and a wall-clock timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::Store;

use super::bindings::PluginBindings;
use super::commands::CommandGrants;
use super::engine::{LoadedPlugin, Runtime};
use super::limits::MemoryLimitExceeded;
use super::logs::{LogGate, MAX_ERROR_MESSAGE, cap};
use super::sink::SinkHandle;
use super::spec::PluginSpec;
use super::state::{HostState, is_hostcall_fuel};
use crate::plugin::Failure;
use crate::plugin::types::{ConfigUpdate, Instance as DiscoveredInstance, Provider};

/// Extra wall-clock time allowed past the CPU deadline before the call's future is dropped:
/// epoch interruption normally ends the call first; the timeout catches calls blocked in the
/// host.
const TIMEOUT_GRACE: Duration = Duration::from_millis(250);

/// A running instance of a plugin: its store and the bindings to its exports.
pub struct Instance {
    store: Store<HostState>,
    bindings: PluginBindings,
    timeout: Duration,
    /// Whether a call may wait in the host (WASI's imports are async): only then does it
    /// need a wall-clock timeout besides the CPU deadline. Without WASI every host function
    /// is synchronous, so a call is suspended only at epoch ticks, where the deadline
    /// callback ends it; a timer could not fire any sooner, and registering one for every
    /// call was a measurable part of a collector's cost.
    waits_in_host: bool,
    /// How long one call may wait for granted commands besides its own time
    /// ([`CommandGrants::call_budget`]), added to the wall-clock timeout.
    commands_time: Duration,
    /// For the epoch ticker, which runs only while a call does.
    runtime: Runtime,
}

/// The result of one call: `Err` is a failure that killed the store; the inner `Err` is the
/// plugin's own error, which it survives.
pub type CallResult = Result<Result<(), String>, Failure>;

/// Runs `$body` (a call into the plugin) under the CPU deadline and the wall-clock timeout.
macro_rules! guarded {
    ($inst:expr, $call:literal, |$guest:ident, $store:ident| $body:expr) => {{
        let inst: &mut Instance = $inst;
        let limit = inst.timeout;
        inst.store.data_mut().deadline = Instant::now() + limit;
        inst.store.data().files.begin_call();
        inst.store.data_mut().commands.new_call();
        inst.store.set_epoch_deadline(1);
        let _running = inst.runtime.enter_call();
        let $store = &mut inst.store;
        // The same call in whichever world the component targets (their `plugin`
        // interfaces take the same Rust types).
        let call = async {
            match &inst.bindings {
                PluginBindings::V03(bindings) => {
                    let $guest = bindings.cc_fleet_plugin();
                    $body.await
                }
                PluginBindings::V02(bindings) => {
                    let $guest = bindings.cc_fleet_plugin();
                    $body.await
                }
            }
        };
        let outcome = if inst.waits_in_host {
            tokio::time::timeout(limit + TIMEOUT_GRACE + inst.commands_time, call).await
        } else {
            Ok(call.await)
        };
        classify($call, limit, outcome)
    }};
}

fn classify(
    call: &'static str,
    limit: Duration,
    outcome: Result<wasmtime::Result<Result<(), String>>, tokio::time::error::Elapsed>,
) -> CallResult {
    match outcome {
        // The plugin's own error is kept short: it is logged and handed to observers.
        Ok(Ok(result)) => Ok(result.map_err(|message| cap(&message, MAX_ERROR_MESSAGE))),
        Ok(Err(error)) => Err(failure_of(call, limit, &error)),
        Err(_) => Err(Failure::Deadline { call, limit }),
    }
}

fn failure_of(call: &'static str, limit: Duration, error: &wasmtime::Error) -> Failure {
    if let Some(exceeded) = error.downcast_ref::<MemoryLimitExceeded>() {
        return Failure::MemoryLimit {
            call,
            limit: exceeded.limit,
            requested: exceeded.requested,
        };
    }
    if is_hostcall_fuel(error) {
        return Failure::HostCallFuel { call };
    }
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => Failure::Deadline { call, limit },
        Some(trap) => Failure::Trap {
            call,
            message: trap.to_string(),
        },
        // A host error: its root cause names it (the outer layers are wasmtime's context).
        None => Failure::Trap {
            call,
            message: cap(&error.root_cause().to_string(), MAX_ERROR_MESSAGE),
        },
    }
}

impl Instance {
    /// Creates a store, instantiates the plugin from its `InstancePre` and calls `init`.
    // Each argument is a separate piece of the plugin's state the supervisor keeps.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start(
        runtime: &Runtime,
        loaded: &LoadedPlugin,
        spec: &PluginSpec,
        plugin: Arc<str>,
        generation: u64,
        sink: SinkHandle,
        logs: LogGate,
        commands: Arc<CommandGrants>,
    ) -> Result<Instance, Failure> {
        let commands_time = commands.call_budget();
        let mut store = runtime
            .new_store(spec, plugin, generation, sink, logs, commands)
            .map_err(|e| Failure::Setup(e.to_string()))?;
        let limit = spec.limits.call_timeout;
        store.data_mut().deadline = Instant::now() + limit;
        store.data().files.begin_call();
        let running = runtime.enter_call();
        let outcome = tokio::time::timeout(
            limit + TIMEOUT_GRACE,
            loaded.pre.instantiate_async(&mut store),
        )
        .await;
        drop(running);
        let bindings = match outcome {
            Ok(Ok(bindings)) => bindings,
            Ok(Err(error)) => return Err(failure_of("instantiate", limit, &error)),
            Err(_) => {
                return Err(Failure::Deadline {
                    call: "instantiate",
                    limit,
                });
            }
        };
        let waits_in_host = store.data().wasi.is_some();
        let mut instance = Instance {
            store,
            bindings,
            timeout: limit,
            waits_in_host,
            commands_time,
            runtime: runtime.clone(),
        };
        let config = spec.config.to_string();
        match guarded!(&mut instance, "init", |guest, store| guest
            .call_init(store, &config))
        {
            Ok(Ok(())) => Ok(instance),
            Ok(Err(message)) => Err(Failure::Init(message)),
            Err(failure) => Err(failure),
        }
    }

    /// Calls `on-config`.
    pub async fn on_config(&mut self, update: &ConfigUpdate) -> CallResult {
        guarded!(self, "on-config", |guest, store| guest
            .call_on_config(store, update))
    }

    /// Calls `on-roster`.
    pub async fn on_roster(&mut self, providers: &[Provider]) -> CallResult {
        guarded!(self, "on-roster", |guest, store| guest
            .call_on_roster(store, providers))
    }

    /// Calls `on-instances`.
    pub async fn on_instances(&mut self, instances: &[DiscoveredInstance]) -> CallResult {
        guarded!(self, "on-instances", |guest, store| guest
            .call_on_instances(store, instances))
    }

    /// Calls `collect`.
    pub async fn collect(&mut self, now_ns: i64) -> CallResult {
        guarded!(self, "collect", |guest, store| guest
            .call_collect(store, now_ns))
    }
}

impl LoadedPlugin {
    /// Instantiates the plugin into a fresh store and calls `init` with its configuration:
    /// the first step of every (re)start. Exposed for benchmarks and embedders that drive a
    /// plugin themselves; the supervisor does this on its own.
    pub async fn instantiate(
        &self,
        runtime: &Runtime,
        spec: &PluginSpec,
        sink: SinkHandle,
    ) -> Result<Instance, Failure> {
        let logs = LogGate::new(&spec.limits);
        let commands = CommandGrants::open(&spec.capabilities.run, Default::default());
        Instance::start(
            runtime,
            self,
            spec,
            spec.display_name().into(),
            1,
            sink,
            logs,
            Arc::new(commands),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_ended_by_the_host_call_fuel_names_that_cause() {
        let error = wasmtime::Error::msg(
            "too much data is being copied between the host and the guest: \
             fuel allocated for hostcalls has been exhausted",
        )
        .context("error while executing at wasm backtrace");
        let failure = failure_of("collect", Duration::from_secs(1), &error);
        assert_eq!(failure, Failure::HostCallFuel { call: "collect" });
        assert!(
            failure
                .to_string()
                .contains("copied more data than the host allows")
        );
        // Any other host error is named by its root cause, not by wasmtime's outer layer.
        let other = wasmtime::Error::msg("the real cause").context("outer layer");
        assert_eq!(
            failure_of("on-roster", Duration::from_secs(1), &other),
            Failure::Trap {
                call: "on-roster",
                message: "the real cause".to_owned()
            }
        );
    }
}
