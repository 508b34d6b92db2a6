//! A hostile test plugin: it allocates (and touches) memory without bound as soon as it
//! receives a configuration.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use ccfleet_guest::{ConfigUpdate, Level, Plugin, log};

const CHUNK: usize = 1 << 20;

struct MemoryBomb {
    hoard: Vec<Vec<u8>>,
}

impl Plugin for MemoryBomb {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(MemoryBomb { hoard: Vec::new() })
    }

    fn on_config(&mut self, _update: ConfigUpdate) -> Result<(), String> {
        log!(Level::Info, "allocating without bound");
        loop {
            let mut chunk = Vec::with_capacity(CHUNK);
            chunk.resize(CHUNK, 0xa5u8);
            self.hoard.push(core::hint::black_box(chunk));
        }
    }
}

ccfleet_guest::export_plugin!(MemoryBomb);
