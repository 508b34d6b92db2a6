//! Host bindings generated from the `cc:fleet` WIT packages: the current one (`wit/` at the
//! repository root, 0.3.3) and the 0.2 line it still serves (`wit/0.2/`).
//!
//! A component targets one of the two worlds; [`PluginPre`] finds out which from its exports
//! and [`PluginBindings`] calls whichever it is. Both worlds share the Rust types of the 0.3
//! `types` interface: their definitions are the same, and wasmtime checks types by shape,
//! so a 0.2 component's records lift into them as well.

use wasmtime::component::InstancePre;

/// The current world, `cc:fleet@0.3.3` (which 0.3.0, 0.3.1 and 0.3.2 components resolve to).
pub(crate) mod v03 {
    wasmtime::component::bindgen!({
        world: "fleet-plugin",
        path: "../wit",
        imports: { default: trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// The 0.2 world (`cc:fleet@0.2.1`, which 0.2.0 components resolve to), for components built
/// before 0.3.
pub(crate) mod v02 {
    wasmtime::component::bindgen!({
        world: "fleet-plugin",
        path: "../wit/0.2/fleet.wit",
        imports: { default: trappable },
        exports: { default: async },
        with: {
            "cc:fleet/types@0.2.1": super::v03::cc::fleet::types,
            "cc:fleet/host@0.2.1": super::v03::cc::fleet::host,
            "cc:fleet/files@0.2.1": super::v03::cc::fleet::files,
        },
    });
}

pub(crate) use v03::cc;

/// A plugin's component, linked and type-checked against the world it targets; `T` is the
/// store's data (the host's state), left open so that the bindings need not know it.
pub(crate) enum PluginPre<T: 'static> {
    /// Built against `cc:fleet@0.3`.
    V03(v03::FleetPluginPre<T>),
    /// Built against `cc:fleet@0.2.x`.
    V02(v02::FleetPluginPre<T>),
}

impl<T: 'static> Clone for PluginPre<T> {
    fn clone(&self) -> Self {
        match self {
            PluginPre::V03(pre) => PluginPre::V03(pre.clone()),
            PluginPre::V02(pre) => PluginPre::V02(pre.clone()),
        }
    }
}

/// The exports of one instantiation, in the world its component targets.
pub(crate) enum PluginBindings {
    /// Built against `cc:fleet@0.3`.
    V03(v03::FleetPlugin),
    /// Built against `cc:fleet@0.2.x`.
    V02(v02::FleetPlugin),
}

impl<T: Send + 'static> PluginPre<T> {
    /// Finds the world whose `plugin` interface the component exports: 0.3, else 0.2. When
    /// it exports neither, the error is the one of the current world.
    pub fn new(pre: InstancePre<T>) -> wasmtime::Result<PluginPre<T>> {
        match v03::FleetPluginPre::new(pre.clone()) {
            Ok(current) => Ok(PluginPre::V03(current)),
            Err(error) => match v02::FleetPluginPre::new(pre) {
                Ok(old) => Ok(PluginPre::V02(old)),
                Err(_) => Err(error),
            },
        }
    }

    /// Instantiates the component into `store`.
    pub async fn instantiate_async(
        &self,
        store: &mut wasmtime::Store<T>,
    ) -> wasmtime::Result<PluginBindings> {
        Ok(match self {
            PluginPre::V03(pre) => PluginBindings::V03(pre.instantiate_async(store).await?),
            PluginPre::V02(pre) => PluginBindings::V02(pre.instantiate_async(store).await?),
        })
    }
}
