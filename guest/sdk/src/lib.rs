//! SDK for ccfleet plugins.
//!
//! A plugin is a type implementing [`Plugin`], exported with [`export_plugin!`]. The agent
//! creates it with [`Plugin::init`] and then hands it whole snapshots: the service
//! configuration ([`Plugin::on_config`]), the roster of peers ([`Plugin::on_roster`]) and the
//! discovered instances ([`Plugin::on_instances`]); collectors emit points from
//! [`Plugin::collect`] with [`emit`] (or build a batch in [`Lines`] without building
//! [`Point`]s), reading host files with [`read_file`] and [`list_dir`] and running the
//! commands the agent grants them with [`commands::run`]; GPU collectors read NVIDIA GPUs
//! through the agent's NVML with [`nvml::devices`] and [`nvml::read`] (AMD GPUs through its
//! ROCm SMI with [`rocm_smi::devices`] and [`rocm_smi::read`]), and performance counter
//! collectors measure through the agent's LIKWID with [`likwid::measure`].
//!
//! Points cross into the agent as one buffer of line protocol per batch, written by the
//! host crate's own encoder ([`lineproto`], the same source files); the agent checks every
//! line before anything is sent, and refuses the whole batch (with the line's number and
//! the reason) if one is bad.
//!
//! The crate is `#![no_std]` (it needs `alloc`). A `no_std` plugin enables the `rt` feature,
//! which supplies a global allocator and a panic handler; a plugin that links `std` enables
//! the `std` feature instead, which installs a panic hook. Either way a panic writes its
//! message and location to the agent's log (level error) before the instance traps, so the
//! log says `panicked at src/lib.rs:12:9: …` rather than only "unreachable executed".
//!
//! ```ignore
//! use ccfleet_guest::{Plugin, ConfigUpdate, Level};
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn init(_config: &str) -> Result<Self, String> {
//!         Ok(Hello)
//!     }
//!     fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
//!         ccfleet_guest::log!(Level::Info, "revision {}", update.revision);
//!         Ok(())
//!     }
//! }
//!
//! ccfleet_guest::export_plugin!(Hello);
//! ```
#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

#[cfg(all(feature = "rt", feature = "std"))]
compile_error!(
    "ccfleet-guest: enable `rt` (no_std plugins) or `std` (plugins linking std), not both"
);

#[cfg(any(test, all(feature = "rt", target_arch = "wasm32")))]
mod alloc_classes;
pub mod commands;
pub mod likwid;
pub mod lineproto;
mod lines;
pub mod nvml;
mod panic;
pub mod rocm_smi;

pub use lines::Lines;

use alloc::string::String;
use alloc::vec::Vec;

/// The bindings wit-bindgen generates from the `cc:fleet` WIT package.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        // The SDK carries its WIT (`wit/`), so a plugin crate outside this repository builds.
        path: "wit",
        world: "fleet-plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "ccfleet_guest::bindings",
    });
}

pub use bindings::cc::fleet::files::FsStats;
pub use bindings::cc::fleet::types::{
    ConfigUpdate, FieldValue, Instance, Level, Point, Provider, Source,
};

/// A ccfleet plugin.
///
/// Every method but [`Plugin::init`] has a default that accepts and ignores its input, so a
/// plugin implements only what it cares about. Returning `Err` reports a failure that the
/// agent logs; the plugin keeps running. A panic traps, and the agent then restarts the plugin
/// from scratch and replays the latest snapshots.
pub trait Plugin: Sized {
    /// Creates the plugin from its own section of the agent configuration (JSON text, `{}`
    /// when the agent configuration gives it none).
    fn init(config: &str) -> Result<Self, String>;

    /// A new service configuration snapshot.
    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        let _ = update;
        Ok(())
    }

    /// A new roster of peer services, always the whole roster.
    fn on_roster(&mut self, providers: Vec<Provider>) -> Result<(), String> {
        let _ = providers;
        Ok(())
    }

    /// A new set of discovered instances, always the whole set.
    fn on_instances(&mut self, instances: Vec<Instance>) -> Result<(), String> {
        let _ = instances;
        Ok(())
    }

    /// Called on the plugin's collect interval with the host's current time.
    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let _ = now_ns;
        Ok(())
    }
}

/// Writes a message to the agent's log, attributed to this plugin.
pub fn log(level: Level, message: &str) {
    bindings::cc::fleet::host::log(level, message);
}

/// Hands points to the agent's metric sink, encoded as line protocol into a buffer kept
/// from call to call. A point that cannot be encoded (no field, an empty name, a repeated
/// tag key, a float that is not finite) fails the batch here, and the agent refuses (with
/// `Err`) a batch over this plugin's limits; nothing of a refused batch is sent. Points
/// without a time get the agent's time when it receives them.
pub fn emit(points: &[Point]) -> Result<(), String> {
    lines::with_kept(|lines| {
        for point in points {
            if let Err(reason) = lines.push(point) {
                lines.clear();
                return Err(reason);
            }
        }
        lines.emit()
    })
}

/// Reads a whole host file that the plugin's configuration grants
/// (`capabilities.read-files`), e.g. `/proc/loadavg`. The agent refuses paths it does not
/// grant, paths with `.` or `..`, and the per-process entries of `/proc`.
pub fn read_file(path: &str) -> Result<Vec<u8>, String> {
    bindings::cc::fleet::files::read(path)
}

/// [`read_file`] as UTF-8 text.
pub fn read_to_string(path: &str) -> Result<String, String> {
    let bytes = read_file(path)?;
    String::from_utf8(bytes).map_err(|_| alloc::format!("{path} is not UTF-8 text"))
}

/// The names in a host directory that are granted or lead to granted files, sorted.
pub fn list_dir(path: &str) -> Result<Vec<String>, String> {
    bindings::cc::fleet::files::list_dir(path)
}

/// `statvfs(3)` of the host file system holding a granted path (e.g. a mount point the
/// configuration grants in `capabilities.read-files`). Needs an agent of WIT 0.2.1 or later.
pub fn statvfs(path: &str) -> Result<FsStats, String> {
    bindings::cc::fleet::files::statvfs(path)
}

/// The host's wall-clock time in Unix nanoseconds.
pub fn now_ns() -> i64 {
    bindings::cc::fleet::host::now_ns()
}

/// Formats and logs a message: `log!(Level::Info, "revision {}", rev)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)+) => {
        $crate::log($level, &$crate::__private::format(::core::format_args!($($arg)+)))
    };
}

impl Point {
    /// A point of `measurement` with no tags, no fields and the host's time.
    pub fn new(measurement: impl Into<String>) -> Self {
        Point {
            measurement: measurement.into(),
            tags: Vec::new(),
            fields: Vec::new(),
            time_ns: None,
        }
    }

    /// Adds a tag.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.push((key.into(), value.into()));
        self
    }

    /// Adds a field.
    pub fn field(mut self, key: impl Into<String>, value: FieldValue) -> Self {
        self.fields.push((key.into(), value));
        self
    }

    /// Sets the timestamp in Unix nanoseconds.
    pub fn at(mut self, time_ns: i64) -> Self {
        self.time_ns = Some(time_ns);
        self
    }
}

impl Source {
    /// The source's name as the WIT spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::None => "none",
            Source::Fleet => "fleet",
            Source::Cache => "cache",
        }
    }
}

/// Support for [`export_plugin!`]; not a stable API.
#[doc(hidden)]
pub mod __private {
    use core::cell::UnsafeCell;

    pub use crate::bindings::exports::cc::fleet::plugin::Guest;
    pub use alloc::string::String;
    pub use alloc::vec::Vec;

    /// Makes panics reach the agent's log (with the `std` feature; the `rt` feature's panic
    /// handler does it for no_std plugins). Called by [`crate::export_plugin!`] before
    /// `init`.
    pub fn install_panic_hook() {
        #[cfg(feature = "std")]
        {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                std::panic::set_hook(alloc::boxed::Box::new(|info| crate::panic::report(info)))
            });
        }
    }

    /// Formats arguments into a `String` (for [`crate::log!`]).
    pub fn format(args: core::fmt::Arguments<'_>) -> String {
        alloc::fmt::format(args)
    }

    /// The one instance of the exported plugin.
    pub struct Slot<P>(UnsafeCell<Option<P>>);

    // SAFETY: a component instance runs on one thread and the component model forbids
    // re-entering an instance while it is executing, so at most one reference to the slot's
    // contents exists at a time.
    unsafe impl<P> Sync for Slot<P> {}

    impl<P: crate::Plugin> Slot<P> {
        /// An empty slot.
        #[allow(clippy::new_without_default)]
        pub const fn new() -> Self {
            Slot(UnsafeCell::new(None))
        }

        fn get(&self) -> &mut Option<P> {
            // SAFETY: see the `Sync` impl; exported functions are never re-entered, and this
            // borrow does not outlive the exported call that made it.
            unsafe { &mut *self.0.get() }
        }

        /// Creates the plugin, replacing any previous one.
        pub fn init(&self, config: &str) -> Result<(), String> {
            *self.get() = Some(P::init(config)?);
            Ok(())
        }

        /// Runs `f` on the plugin, failing if `init` has not succeeded.
        pub fn with(&self, f: impl FnOnce(&mut P) -> Result<(), String>) -> Result<(), String> {
            match self.get() {
                Some(plugin) => f(plugin),
                None => Err(String::from("plugin called before a successful init")),
            }
        }
    }
}

/// Exports a [`Plugin`] implementation as the component's `cc:fleet/plugin` interface.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            static PLUGIN: $crate::__private::Slot<$plugin> = $crate::__private::Slot::new();

            struct Export;

            impl $crate::__private::Guest for Export {
                fn init(
                    config: $crate::__private::String,
                ) -> ::core::result::Result<(), $crate::__private::String> {
                    $crate::__private::install_panic_hook();
                    PLUGIN.init(&config)
                }

                fn on_config(
                    update: $crate::ConfigUpdate,
                ) -> ::core::result::Result<(), $crate::__private::String> {
                    PLUGIN.with(|p| $crate::Plugin::on_config(p, update))
                }

                fn on_roster(
                    providers: $crate::__private::Vec<$crate::Provider>,
                ) -> ::core::result::Result<(), $crate::__private::String> {
                    PLUGIN.with(|p| $crate::Plugin::on_roster(p, providers))
                }

                fn on_instances(
                    instances: $crate::__private::Vec<$crate::Instance>,
                ) -> ::core::result::Result<(), $crate::__private::String> {
                    PLUGIN.with(|p| $crate::Plugin::on_instances(p, instances))
                }

                fn collect(now_ns: i64) -> ::core::result::Result<(), $crate::__private::String> {
                    PLUGIN.with(|p| $crate::Plugin::collect(p, now_ns))
                }
            }

    $crate::bindings::__export_plugin_world!(Export with_types_in $crate::bindings);
        };
    };
}

#[cfg(all(feature = "rt", target_arch = "wasm32"))]
mod rt {
    // Small blocks from free lists, the rest from dlmalloc (see `alloc_classes`).
    #[global_allocator]
    static ALLOCATOR: crate::alloc_classes::SizeClasses<dlmalloc::GlobalDlmalloc> =
        crate::alloc_classes::SizeClasses::new(dlmalloc::GlobalDlmalloc);

    // A panic in a plugin traps its instance (the host restarts it from a fresh store), after
    // telling the host why.
    #[panic_handler]
    fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
        crate::panic::report(info);
        core::arch::wasm32::unreachable()
    }
}
