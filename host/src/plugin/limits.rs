//! The per-plugin memory budget, enforced by the store's resource limiter.

/// Raised (as a trap) when a plugin grows its memory past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (asked for {requested})")]
pub(crate) struct MemoryLimitExceeded {
    pub limit: usize,
    pub requested: usize,
}

/// Counts every linear memory of the store against one per-plugin budget.
pub(crate) struct MemoryLimiter {
    limit: usize,
    used: usize,
    table_elements: usize,
}

impl MemoryLimiter {
    pub fn new(limit: usize) -> Self {
        MemoryLimiter {
            limit,
            used: 0,
            table_elements: 100_000,
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let requested = self.used.saturating_add(desired.saturating_sub(current));
        if requested > self.limit {
            // Trapping (rather than failing the grow) kills the plugin at the allocation
            // site with a clear reason; a guest allocator would abort anyway.
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                limit: self.limit,
                requested,
            }));
        }
        self.used = requested;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_elements)
    }

    fn instances(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_limit_counts_all_memories() {
        use wasmtime::ResourceLimiter as _;
        let mut limiter = MemoryLimiter::new(3 << 20);
        assert!(limiter.memory_growing(0, 2 << 20, None).unwrap());
        // A second memory of 1 MiB still fits, one more byte does not.
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        let err = limiter
            .memory_growing(1 << 20, (1 << 20) + 1, None)
            .unwrap_err();
        let exceeded = err.downcast_ref::<MemoryLimitExceeded>().unwrap();
        assert_eq!(exceeded.limit, 3 << 20);
        assert_eq!(exceeded.requested, (3 << 20) + 1);
    }
}
