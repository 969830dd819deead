//! The process's allocator settings, applied once before any thread starts
//! ([`limit_arenas`]).
//!
//! glibc's malloc gives a thread that finds the arenas busy an arena of its own, up to eight
//! per core. Under load every tokio worker, blocking-pool thread (SQLite lock waits,
//! checkpoints) and compile thread ends up with one, and memory freed in an arena stays
//! resident in it. Measured with `cargo bench -p pooler-tests --bench table` on 2 cores:
//! after the load rows the pool process held 120 MiB with 64 open streams (16 arenas, most
//! of their memory free) and 60 MiB idle after start; with at most four arenas, 65 MiB and
//! 22 MiB, at the same requests/s.

/// Most glibc malloc arenas per core (glibc's default is eight per core on 64-bit).
pub const ARENAS_PER_CORE: usize = 2;

/// The glibc tunables that, when a person set them, are left to decide instead.
const OWN_SETTINGS: [&str; 2] = ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"];

/// Cap glibc's malloc arenas at [`ARENAS_PER_CORE`] per core, at least four. Call it first
/// thing in `main`, before any thread starts. Does nothing when `MALLOC_ARENA_MAX` or
/// `GLIBC_TUNABLES` is set (the person's setting stands), or on a target without glibc.
pub fn limit_arenas() {
    if OWN_SETTINGS.iter().any(|v| std::env::var_os(v).is_some()) {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    set_arena_max(arena_cap(cores));
}

/// The cap for `cores` cores.
fn arena_cap(cores: usize) -> usize {
    cores.saturating_mul(ARENAS_PER_CORE).max(4)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(cap: usize) -> bool {
    let Ok(cap) = libc::c_int::try_from(cap) else {
        return false;
    };
    // SAFETY: mallopt only changes malloc's parameters, under glibc's own lock, and
    // M_ARENA_MAX takes any positive value. (Called before other threads start, the cap
    // holds for every arena they would make.)
    unsafe { libc::mallopt(libc::M_ARENA_MAX, cap) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_cap: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_two_per_core_and_never_below_four() {
        assert_eq!(arena_cap(1), 4);
        assert_eq!(arena_cap(2), 4);
        assert_eq!(arena_cap(3), 6);
        assert_eq!(arena_cap(16), 32);
        assert_eq!(arena_cap(usize::MAX), usize::MAX);
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_takes_the_cap() {
        assert!(set_arena_max(4));
        // Not representable as a C int: refused, nothing set.
        assert!(!set_arena_max(usize::MAX));
    }
}
