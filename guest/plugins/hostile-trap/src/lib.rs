//! A hostile test plugin: it logs the snapshots it is given (so a test can see them replayed
//! after a restart) and then traps on every `collect`. A roster naming a host `poison`
//! traps `on-roster`.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use ccfleet_guest::{ConfigUpdate, Level, Plugin, Provider, log};

struct Trap;

impl Plugin for Trap {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(Trap)
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        log!(Level::Info, "config revision {}", update.revision);
        Ok(())
    }

    fn on_roster(&mut self, providers: Vec<Provider>) -> Result<(), String> {
        if providers.iter().any(|p| p.hostname == "poison") {
            panic!("a poisoned roster");
        }
        log!(Level::Info, "roster: {} providers", providers.len());
        Ok(())
    }

    fn collect(&mut self, _now_ns: i64) -> Result<(), String> {
        panic!("collect always traps")
    }
}

ccfleet_guest::export_plugin!(Trap);
