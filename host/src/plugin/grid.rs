//! Timers on a grid the whole process shares, for the supervisors' collect and watch
//! intervals.
//!
//! A timer ticks at multiples of its period from one origin, the first tick at the next grid
//! point (within one period). Plugins with the same (or commensurate) intervals then fall
//! due together, and the agent wakes once for all of them instead of once per plugin. A
//! tick missed by a long call is skipped, so the ticks stay on the grid.
//!
//! On Linux each timer is a `timerfd` armed at its grid points, watched by the runtime's I/O
//! driver: the agent wakes exactly when a round falls due. A `tokio::time` interval would
//! serve as well, but tokio's timer wheel wakes its thread at the start of the wheel slot a
//! far deadline lies in and again at each finer level: three to five wake-ups before every
//! one-second round, each a return from `epoll_wait` and a turn of the runtime, for nothing.
//! Where a timer descriptor cannot be had (another system, no descriptor left), the timer
//! is a tokio interval on the same grid.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};

/// The shortest period a grid timer ticks at.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

/// A timer ticking on the process's grid: see the module documentation.
#[derive(Debug)]
pub struct GridTimer {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    #[cfg(target_os = "linux")]
    Fd(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
    Tokio(Interval),
}

/// The monotonic clock (`CLOCK_MONOTONIC`, which `std::time::Instant` reads too) in
/// nanoseconds.
fn monotonic_ns() -> u128 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u128::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000
        + u128::try_from(now.tv_nsec).unwrap_or(0)
}

/// The grid's origin on the monotonic clock: the first use in the process.
fn origin_ns() -> u128 {
    static ORIGIN: OnceLock<u128> = OnceLock::new();
    *ORIGIN.get_or_init(monotonic_ns)
}

/// The next grid point of `period` after `now` (both on the monotonic clock, in ns).
fn next_point(now: u128, period: Duration) -> u128 {
    let origin = origin_ns();
    let step = period.as_nanos().max(1);
    let elapsed = now.saturating_sub(origin);
    now + (step - elapsed % step)
}

/// The period a timer of `period` ticks at (at least [`MIN_PERIOD`]) and its first grid
/// point from now.
fn first_point(period: Duration) -> (Duration, u128) {
    let period = period.max(MIN_PERIOD);
    // The origin is taken before the clock is read for this timer.
    origin_ns();
    (period, next_point(monotonic_ns(), period))
}

impl GridTimer {
    /// A timer ticking every `period` (at least [`MIN_PERIOD`]) on the process's grid.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with I/O and time enabled, as tokio's own timers and
    /// descriptors do.
    pub fn new(period: Duration) -> GridTimer {
        let (period, first) = first_point(period);
        #[cfg(target_os = "linux")]
        if let Ok(fd) = timer_fd(first, period) {
            return GridTimer {
                inner: Inner::Fd(fd),
            };
        }
        GridTimer {
            inner: Inner::Tokio(tokio_interval(first, period)),
        }
    }

    /// A timer on the same grid driven by tokio's timer wheel (what [`GridTimer::new`] falls
    /// back to).
    pub fn with_tokio(period: Duration) -> GridTimer {
        let (period, first) = first_point(period);
        GridTimer {
            inner: Inner::Tokio(tokio_interval(first, period)),
        }
    }

    /// Waits for the next grid point; when some passed unobserved, returns at once, and then
    /// waits for the next one still ahead.
    pub async fn tick(&mut self) {
        match &mut self.inner {
            #[cfg(target_os = "linux")]
            Inner::Fd(fd) => loop {
                let Ok(mut ready) = fd.readable().await else {
                    // The driver is shutting down: nothing falls due any more.
                    return std::future::pending().await;
                };
                let mut expirations = [0u8; 8];
                // SAFETY: reading at most 8 bytes into an 8-byte buffer from an open timerfd.
                let n = unsafe {
                    libc::read(
                        std::os::fd::AsRawFd::as_raw_fd(ready.get_inner()),
                        expirations.as_mut_ptr().cast(),
                        expirations.len(),
                    )
                };
                // The read took every expiration so far: nothing is left to read, and the
                // next tick waits for the next one (a new expiration after this read is
                // kept by the driver whatever is cleared here). EAGAIN: not due yet.
                ready.clear_ready();
                if n == 8 {
                    return;
                }
            },
            Inner::Tokio(interval) => {
                interval.tick().await;
            }
        }
    }

    /// Whether the timer is a timer descriptor (for the tests).
    #[cfg(test)]
    fn is_fd(&self) -> bool {
        #[cfg(target_os = "linux")]
        if matches!(self.inner, Inner::Fd(_)) {
            return true;
        }
        false
    }
}

fn tokio_interval(first_ns: u128, period: Duration) -> Interval {
    let now = std::time::Instant::now();
    let wait = u64::try_from(first_ns.saturating_sub(monotonic_ns())).unwrap_or(0);
    let first = now.checked_add(Duration::from_nanos(wait)).unwrap_or(now);
    let mut interval = tokio::time::interval_at(tokio::time::Instant::from_std(first), period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    interval
}

/// A non-blocking timerfd on the monotonic clock, due first at `first_ns` and then every
/// `period`, registered with the runtime's I/O driver.
#[cfg(target_os = "linux")]
fn timer_fd(
    first_ns: u128,
    period: Duration,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let timespec = |ns: u128| libc::timespec {
        tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits every width of c_long.
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: timerfd_create takes no pointers; a negative result is an error.
    let raw = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just created and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let spec = libc::itimerspec {
        it_interval: timespec(period.as_nanos()),
        it_value: timespec(first_ns),
    };
    // SAFETY: the descriptor is open and `spec` a valid itimerspec; the old value is not
    // asked for.
    let rc = unsafe {
        libc::timerfd_settime(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::TFD_TIMER_ABSTIME,
            &spec,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the AsyncFd owns the OwnedFd, which keeps the descriptor open and the same
    // until it is dropped with it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Awaits one tick and returns when it came, on the monotonic clock.
    async fn tick_at(timer: &mut GridTimer) -> u128 {
        timer.tick().await;
        monotonic_ns()
    }

    #[test]
    fn grid_points_are_multiples_of_the_period_from_one_origin() {
        let origin = origin_ns();
        let period = Duration::from_millis(200);
        let step = period.as_nanos();
        for offset in [0, 1, step - 1, step, step + 1, 7 * step + 3] {
            let next = next_point(origin + offset, period);
            assert_eq!((next - origin) % step, 0, "offset {offset}");
            assert!(next > origin + offset && next <= origin + offset + step);
        }
    }

    #[tokio::test]
    async fn a_timer_ticks_at_its_grid_points_and_never_before() {
        for make in [GridTimer::new, GridTimer::with_tokio] {
            let period = Duration::from_millis(30);
            let created = monotonic_ns();
            let mut timer = make(period);
            let mut due = next_point(created, period);
            for _ in 0..4 {
                let at = tick_at(&mut timer).await;
                assert!(at >= due, "ticked {} us early", (due - at) / 1000);
                // The next tick is due at the first grid point after this one came.
                due = next_point(at, period);
            }
        }
    }

    #[tokio::test]
    async fn a_timer_is_a_timer_descriptor_on_linux_and_skips_what_it_missed() {
        let period = Duration::from_millis(20);
        let timer = GridTimer::new(period);
        assert_eq!(timer.is_fd(), cfg!(target_os = "linux"));
        for mut timer in [timer, GridTimer::with_tokio(period)] {
            timer.tick().await;
            // A call that takes five periods and a half: the missed ticks come as one, at
            // once, and the next waits for the grid point after the call ended.
            std::thread::sleep(Duration::from_millis(110));
            let ended = monotonic_ns();
            timer.tick().await;
            let next = tick_at(&mut timer).await;
            assert!(
                next >= next_point(ended, period),
                "a missed tick came after the one that stood for all of them"
            );
        }
    }
}
