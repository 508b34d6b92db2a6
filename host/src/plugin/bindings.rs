//! Host bindings generated from the `cc:fleet` WIT package (`wit/` at the repository root).

wasmtime::component::bindgen!({
    world: "fleet-plugin",
    path: "../wit",
    imports: { default: trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});
