//! The Priority Manager: thread priorities where the process may set them.
//!
//! - [`Priority::Realtime`]: `SCHED_FIFO` at the given level. Needs
//!   CAP_SYS_NICE (or root) and an RLIMIT_RTPRIO that allows it; where it is
//!   refused, the fallback is the highest nice value the process may take
//!   (`-20` down to `0`), and where even that is refused, the thread stays as
//!   it is. The direct path's worker asks for this.
//! - [`Priority::Nice`]: a nice value for the calling thread (Linux applies
//!   nice per thread); raising priority (negative nice) has the same
//!   permission rules and fallback.
//! - [`Priority::Normal`]: `SCHED_OTHER`, nice 0.
//! - [`Priority::Batch`]: `SCHED_BATCH` at the thread's nice value. Any
//!   thread may take it. A batch thread that wakes up does not preempt the
//!   thread running on its CPU; it waits for that thread to sleep or for
//!   the next tick. The pipeline's threads switch to it under heavy load
//!   (see [`crate::BatchSwitch`]).
//! - [`Priority::Other`]: `SCHED_OTHER` at the thread's nice value (leaving
//!   batch without touching a nice value an operator set).
//!
//! Every call reports what was actually applied, so callers can log it and
//! tests can check it without assuming privileges.

use std::io;

/// What a thread asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// `SCHED_FIFO` at this level (1-99).
    Realtime(u8),
    /// `SCHED_OTHER` at this nice value (-20..=19).
    Nice(i8),
    /// `SCHED_OTHER`, nice 0.
    Normal,
    /// `SCHED_BATCH`, nice unchanged: no wake-up preemption.
    Batch,
    /// `SCHED_OTHER`, nice unchanged.
    Other,
}

/// What the thread got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// `SCHED_FIFO` at this level.
    Realtime(u8),
    /// `SCHED_OTHER` at this nice value.
    Nice(i8),
    /// `SCHED_BATCH` at this nice value.
    Batch(i8),
    /// Nothing could be changed (errno of the last refusal).
    Unchanged(i32),
}

fn tid() -> libc::id_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::id_t }
}

fn set_nice(n: i8) -> io::Result<()> {
    // SAFETY: setpriority on our own thread id.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid(), n as libc::c_int) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_policy(policy: libc::c_int, level: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: level,
    };
    // SAFETY: sets the calling thread's policy with a valid param.
    let r = unsafe { libc::pthread_setschedparam(libc::pthread_self(), policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// Gives the calling thread `p`, or the closest the process is allowed.
pub fn set_current_thread_priority(p: Priority) -> Applied {
    match p {
        Priority::Realtime(level) => {
            let level = level.clamp(1, 99);
            match set_policy(libc::SCHED_FIFO, level as libc::c_int) {
                Ok(()) => Applied::Realtime(level),
                Err(_) => best_nice(-20),
            }
        }
        Priority::Nice(n) => {
            let _ = set_policy(libc::SCHED_OTHER, 0);
            best_nice(n.clamp(-20, 19))
        }
        Priority::Normal => {
            let _ = set_policy(libc::SCHED_OTHER, 0);
            match set_nice(0) {
                Ok(()) => Applied::Nice(0),
                Err(e) => Applied::Unchanged(e.raw_os_error().unwrap_or(0)),
            }
        }
        // the nice value is kept across these policy changes
        Priority::Batch => match set_policy(libc::SCHED_BATCH, 0) {
            Ok(()) => Applied::Batch(current_nice()),
            Err(e) => Applied::Unchanged(e.raw_os_error().unwrap_or(0)),
        },
        Priority::Other => match set_policy(libc::SCHED_OTHER, 0) {
            Ok(()) => Applied::Nice(current_nice()),
            Err(e) => Applied::Unchanged(e.raw_os_error().unwrap_or(0)),
        },
    }
}

/// Tries `want`, then each nice value towards 0, keeping the first allowed.
fn best_nice(want: i8) -> Applied {
    let mut n = want;
    loop {
        match set_nice(n) {
            Ok(()) => return Applied::Nice(n),
            Err(e) if n >= 0 => return Applied::Unchanged(e.raw_os_error().unwrap_or(0)),
            Err(_) => n += 1,
        }
    }
}

/// The calling thread's policy and level/nice as the kernel reports them.
pub fn current_thread_priority() -> Applied {
    let mut policy = 0;
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: reads the calling thread's scheduling parameters.
    let r = unsafe { libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut param) };
    if r == 0 && policy == libc::SCHED_FIFO {
        return Applied::Realtime(param.sched_priority as u8);
    }
    if r == 0 && policy == libc::SCHED_BATCH {
        return Applied::Batch(current_nice());
    }
    Applied::Nice(current_nice())
}

fn current_nice() -> i8 {
    // SAFETY: getpriority on our own thread id; -1 can be a valid value.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid()) };
    n as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_applied_is_what_the_kernel_reports() {
        std::thread::spawn(|| {
            // lowering priority is always allowed
            assert_eq!(
                set_current_thread_priority(Priority::Nice(5)),
                Applied::Nice(5)
            );
            assert_eq!(current_thread_priority(), Applied::Nice(5));
            // realtime: granted with privileges, else the best nice allowed
            let got = set_current_thread_priority(Priority::Realtime(10));
            assert_eq!(current_thread_priority(), got, "report matches the kernel");
            match got {
                Applied::Realtime(l) => assert_eq!(l, 10),
                Applied::Nice(n) => assert!(n <= 5),
                Applied::Batch(_) => panic!("asked for realtime, got batch"),
                Applied::Unchanged(_) => {}
            }
            let back = set_current_thread_priority(Priority::Normal);
            if back == Applied::Nice(0) {
                assert_eq!(current_thread_priority(), Applied::Nice(0));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn batch_is_granted_without_privileges_and_other_keeps_the_nice_value() {
        std::thread::spawn(|| {
            // one step nicer than now (lowering priority needs no privilege)
            let n = match current_thread_priority() {
                Applied::Nice(n) => (n + 1).min(19),
                other => {
                    // run under chrt or similar: nothing to compare with
                    eprintln!("skipped: test thread starts at {other:?}");
                    return;
                }
            };
            assert_eq!(
                set_current_thread_priority(Priority::Nice(n)),
                Applied::Nice(n)
            );
            assert_eq!(
                set_current_thread_priority(Priority::Batch),
                Applied::Batch(n)
            );
            assert_eq!(current_thread_priority(), Applied::Batch(n));
            assert_eq!(policy_in_proc(), libc::SCHED_BATCH);
            assert_eq!(
                set_current_thread_priority(Priority::Other),
                Applied::Nice(n)
            );
            assert_eq!(current_thread_priority(), Applied::Nice(n));
            assert_eq!(policy_in_proc(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    /// The calling thread's policy as /proc reports it (field 41 of stat).
    fn policy_in_proc() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // the command name may hold spaces: fields count from after ')'
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(41 - 3).unwrap().parse().unwrap()
    }
}
