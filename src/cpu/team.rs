//! A persistent team of helper threads for the wasm threads build: [`super::pool`] hands it
//! each parallel product. A decode step makes ~130 of them, each 0.1–0.3 ms on one thread,
//! so what one costs to start and to finish decides whether two threads beat one.
//!
//! - The calling thread works too: it takes ranges like every helper, and with no helper
//!   awake it does the whole job itself instead of waiting for one to wake.
//! - A job is one store (its generation) that the helpers watch. A helper spins on it for a
//!   bounded while (~45 µs in Chromium on a 2-vCPU Xeon: most of a decode step's products
//!   follow each other closer than that) and then parks, so an idle team costs no CPU that
//!   the page's own thread could use.
//! - A job is claimed in contiguous ranges, not one task per item: the first ranges are
//!   long (a share of what is left), the last ones short, so the threads end together.
//!
//! The protocol, on one word (`state`: generation, a closed bit, the helpers inside):
//! the caller publishes the job, then its generation; a helper joins by a compare-exchange
//! that fails once the job is closed or replaced; the caller closes the job when no range is
//! left and waits until every helper that joined has left. So the job, on the caller's
//! stack, is never touched after the caller returns.
//!
//! What is left against 2× in Chromium (2 vCPUs, temporary timers): two threads' summed
//! ranges of a layer's products are 5–8% over one thread's time for the same work (the LM
//! head's 3%), plus the serial work between jobs (~19 ms per 16 tokens); the team ends a
//! job within 0.2–1.9 ms per 16 tokens of the caller's last range.

use std::ops::Range;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize};
use std::sync::OnceLock;
use std::thread::{self, Thread};

/// `state`: helpers inside the current job (low bits), its closed bit, its generation.
const INSIDE: u32 = 0xff;
const CLOSED: u32 = 0x100;
const GEN_SHIFT: u32 = 9;
/// Polls of `state` before a waiting thread parks (~45 µs in Chromium on a 2-vCPU Xeon: there
/// 40-55 of a two-thread decode's jobs per 16 tokens found the helper parked; eight times as
/// many polls left 7-27 but decoded no measurably faster, +0.7% ± 0.75% in 16 pairs).
const SPINS: u32 = 1 << 15;

/// A job's smallest range is 1 / (this · threads) of it. Ranges shrink from a quarter of the
/// job (on two threads) to that, so the threads end within a small range of each other and
/// a helper that joins late still gets its share. Before, a job was cut into eight equal
/// ranges per thread (Chromium, two threads, a decode step's jobs: with two, the caller
/// waited ~14% of each job for the helper's last range, as it joins ~13 µs late on average;
/// eight decoded 5–9% faster than two, four no faster).
const SMALLEST_PER_THREAD: usize = 32;

struct Job<'a> {
    f: &'a (dyn Fn(Range<usize>) + Sync),
    n_items: usize,
    /// Threads that may work on it (the caller and every helper).
    threads: usize,
    /// The smallest range.
    grain: usize,
    /// The first item not yet claimed.
    next: AtomicUsize,
    caller: Thread,
}

impl<'a> Job<'a> {
    /// A job of `n_items` for `threads` threads (the caller's among them), none claimed yet.
    fn new(f: &'a (dyn Fn(Range<usize>) + Sync), n_items: usize, threads: usize) -> Self {
        Job {
            f,
            n_items,
            threads,
            grain: (n_items / (SMALLEST_PER_THREAD * threads)).max(1),
            next: AtomicUsize::new(0),
            caller: thread::current(),
        }
    }

    /// Claim and run ranges until none is left.
    fn work(&self) {
        while let Some(r) = self.claim() {
            (self.f)(r);
        }
    }

    /// The next range: a share of what is left (1 / (2 · threads) of it, at least `grain`
    /// items), so that ranges shrink towards the job's end and the threads finish together.
    fn claim(&self) -> Option<Range<usize>> {
        let mut start = self.next.load(Relaxed);
        loop {
            let left = self.n_items.checked_sub(start).filter(|&l| l > 0)?;
            let take = (left / (2 * self.threads)).max(self.grain).min(left);
            match self
                .next
                .compare_exchange_weak(start, start + take, Relaxed, Relaxed)
            {
                Ok(_) => return Some(start..start + take),
                Err(now) => start = now,
            }
        }
    }
}

pub struct Team {
    state: AtomicU32,
    /// The current job: set before its generation is published, read only by a helper that
    /// joined it.
    job: AtomicPtr<Job<'static>>,
    /// A job runs now: a second caller (none today) runs its own inline.
    busy: AtomicBool,
    helpers: Box<[Helper]>,
}

#[derive(Default)]
struct Helper {
    thread: OnceLock<Thread>,
    parked: AtomicBool,
}

impl Team {
    /// A team of `n` helpers, each started by `spawn` (they run for the program's life).
    pub fn start(n: usize, spawn: impl Fn(Box<dyn FnOnce() + Send>)) -> &'static Team {
        assert!(n < INSIDE as usize, "at most {INSIDE} helpers");
        let team: &'static Team = Box::leak(Box::new(Team {
            state: AtomicU32::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            busy: AtomicBool::new(false),
            helpers: (0..n).map(|_| Helper::default()).collect(),
        }));
        for i in 0..n {
            spawn(Box::new(move || team.help(i)));
        }
        team
    }

    /// Runs `f` on ranges that together cover `0..n_items`, on this thread and the helpers;
    /// returns when all are done.
    pub fn run(&self, n_items: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        if self.busy.swap(true, Acquire) {
            f(0..n_items);
            return;
        }
        let job = Job::new(f, n_items, self.helpers.len() + 1);
        // SAFETY (of the helpers' use of this pointer): a helper dereferences it only after
        // joining this job's generation, and this function returns only after the job is
        // closed and every helper that joined has left it.
        self.job
            .store((&job as *const Job<'_>).cast_mut().cast(), Release);
        let generation = (self.state.load(Relaxed) >> GEN_SHIFT).wrapping_add(1);
        self.state.store(generation << GEN_SHIFT, SeqCst);
        for h in self.helpers.iter() {
            // SeqCst with the helper's own pair (`parked`, then `state`): either it sees the
            // new generation or this sees it parked.
            if h.parked.load(SeqCst) {
                if let Some(t) = h.thread.get() {
                    t.unpark();
                }
            }
        }
        job.work();
        if self.state.fetch_or(CLOSED, AcqRel) & INSIDE != 0 {
            let mut spins = 0;
            while self.state.load(Acquire) & INSIDE != 0 {
                spins += 1;
                if spins < SPINS {
                    std::hint::spin_loop();
                } else {
                    // The last helper out unparks this thread.
                    thread::park();
                }
            }
        }
        self.busy.store(false, Release);
    }

    /// Helper `i`'s loop: wait for a job, join it, take ranges, leave.
    fn help(&self, i: usize) {
        let me = &self.helpers[i];
        let _ = me.thread.set(thread::current());
        let mut seen = self.state.load(Acquire) >> GEN_SHIFT;
        loop {
            let mut spins = 0;
            let mut s = loop {
                let s = self.state.load(Acquire);
                if s >> GEN_SHIFT != seen {
                    break s;
                }
                spins += 1;
                if spins < SPINS {
                    std::hint::spin_loop();
                    continue;
                }
                me.parked.store(true, SeqCst);
                if self.state.load(SeqCst) >> GEN_SHIFT == seen {
                    thread::park();
                }
                me.parked.store(false, Relaxed);
                spins = 0;
            };
            seen = s >> GEN_SHIFT;
            let joined = loop {
                if s >> GEN_SHIFT != seen || s & CLOSED != 0 {
                    break false;
                }
                match self.state.compare_exchange_weak(s, s + 1, AcqRel, Acquire) {
                    Ok(_) => break true,
                    Err(now) => s = now,
                }
            };
            if !joined {
                continue;
            }
            // SAFETY: joined, so the caller of `run` is still inside it (see there).
            let job = unsafe { &*self.job.load(Acquire) };
            job.work();
            let caller = job.caller.clone();
            let before = self.state.fetch_sub(1, AcqRel);
            if before & INSIDE == 1 && before & CLOSED != 0 {
                caller.unpark();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_exactly_once_whatever_the_timing() {
        let team = Team::start(3, |f| {
            thread::spawn(f);
        });
        let counts: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        let caller = thread::current().id();
        let on_helpers = AtomicUsize::new(0);
        let mut expected = vec![0usize; counts.len()];
        let rounds = 4000usize;
        for round in 0..rounds {
            // The last round is whole, and its caller holds its first range until a helper
            // has taken one: on a loaded machine the caller can finish every other round
            // before any helper wakes, and the helpers' share must still be shown.
            let last = round + 1 == rounds;
            let n = if last {
                counts.len()
            } else {
                1 + (round * 7919) % counts.len()
            };
            // Some rounds slow, so that helpers park and are woken between them.
            let pause = round % 500 == 0;
            if pause {
                thread::sleep(std::time::Duration::from_millis(2));
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            team.run(n, &|r: Range<usize>| {
                if thread::current().id() != caller {
                    on_helpers.fetch_add(1, Relaxed);
                } else if last {
                    while on_helpers.load(Relaxed) == 0 && std::time::Instant::now() < deadline {
                        thread::yield_now();
                    }
                }
                for i in r {
                    counts[i].fetch_add(1, Relaxed);
                }
            });
            for e in &mut expected[..n] {
                *e += 1;
            }
        }
        let got: Vec<usize> = counts.iter().map(|c| c.load(Relaxed)).collect();
        assert_eq!(got, expected);
        assert!(on_helpers.load(Relaxed) > 0, "the helpers took no range");
    }

    /// A job's claims, taken one after another, cover its items in order, each a share of what
    /// is left: never longer than the one before, never shorter than the grain (but the last),
    /// the first a quarter on two threads.
    #[test]
    fn claims_shrink_towards_the_end_and_cover_every_item() {
        let f = |_: Range<usize>| {};
        for (n_items, threads) in [(1, 2), (7, 2), (40, 2), (256, 2), (4096, 2), (1000, 4)] {
            let job = Job::new(&f, n_items, threads);
            let mut claims = Vec::new();
            while let Some(r) = job.claim() {
                claims.push(r);
            }
            let (mut at, mut before) = (0, usize::MAX);
            for (i, r) in claims.iter().enumerate() {
                assert_eq!(r.start, at, "{n_items} items: claims in order, no gap");
                assert!(
                    r.len() <= before,
                    "{n_items} items: claim {i} grew: {claims:?}"
                );
                assert!(
                    r.len() >= job.grain || r.end == n_items,
                    "{n_items} items: claim {i} under the grain"
                );
                (at, before) = (r.end, r.len());
            }
            assert_eq!(at, n_items, "every item claimed");
            if n_items >= 4 * threads {
                assert_eq!(claims[0].len(), n_items / (2 * threads), "the first claim");
            }
            // Few claims: about as many as the eight equal ranges a thread had before.
            assert!(
                claims.len() <= 24 * threads,
                "{n_items} items: {} claims",
                claims.len()
            );
        }
    }

    #[test]
    fn a_team_without_helpers_runs_on_the_caller() {
        let team = Team::start(0, |_| unreachable!());
        let sum = AtomicUsize::new(0);
        team.run(10, &|r: Range<usize>| {
            sum.fetch_add(r.sum::<usize>(), Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 45);
    }
}
