//! A hostile test plugin: it spins forever as soon as it receives a configuration.
#![no_std]

extern crate alloc;

use alloc::string::String;
use ccfleet_guest::{ConfigUpdate, Level, Plugin, log};

struct Spin;

impl Plugin for Spin {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(Spin)
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        log!(Level::Info, "spinning on revision {}", update.revision);
        let mut counter: u64 = 0;
        loop {
            // black_box keeps the optimiser from proving the loop side-effect free.
            counter = core::hint::black_box(counter.wrapping_add(1));
        }
    }
}

ccfleet_guest::export_plugin!(Spin);
