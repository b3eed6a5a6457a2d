//! What keeps an upstream's use within bounds: requests per minute and per UTC day, a token
//! budget per UTC day, its own `Retry-After`, and a circuit breaker (after N failures in a
//! row no request goes there for a cool-down; then one tries, and its outcome closes or
//! reopens it). Past a limit the client gets a 429 that says which one and when to retry.

use crate::server::shared::Shared;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Why an upstream takes no request now, and for how long.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub message: String,
    pub retry_after: Duration,
    /// The breaker is open (not a limit of ours or the upstream's 429).
    pub breaker: bool,
}

pub(super) struct Limits {
    per_minute: Option<u32>,
    per_day: Option<u32>,
    tokens_per_day: Option<u64>,
    threshold: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the requests of the last minute went.
    minute: VecDeque<Instant>,
    /// The UTC day (days since the epoch) the counts below are of.
    day: u64,
    day_requests: u32,
    day_tokens: u64,
    /// Failures in a row.
    failures: u32,
    /// The breaker is open until then.
    open_until: Option<Instant>,
    /// The breaker's cool-down is over and one request is trying.
    probing: bool,
    /// The upstream's own `Retry-After`.
    hold_until: Option<Instant>,
}

/// A counter's key in the shared store.
fn shared_key(upstream: &str, what: &str, window: u64) -> String {
    format!("kerze:quota:{upstream}:{what}:{window}")
}

fn utc_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The UTC day (days since the epoch) of `secs`, and the time left of it.
fn day_and_rest(secs: u64) -> (u64, Duration) {
    (secs / 86_400, Duration::from_secs(86_400 - secs % 86_400))
}

impl State {
    /// The day's counts start again on a new UTC day.
    fn on_day(&mut self, day: u64) {
        if self.day != day {
            self.day = day;
            self.day_requests = 0;
            self.day_tokens = 0;
        }
    }
}

impl Limits {
    pub(super) fn new(
        per_minute: Option<u32>,
        per_day: Option<u32>,
        tokens_per_day: Option<u64>,
        threshold: u32,
        cooldown: Duration,
    ) -> Self {
        Limits {
            per_minute,
            per_day,
            tokens_per_day,
            threshold,
            cooldown,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the breaker is open now (for `/metrics` and the policy: an open upstream is
    /// passed over while another can take the request).
    pub(super) fn open(&self) -> bool {
        let s = self.state();
        s.open_until.is_some_and(|t| Instant::now() < t) || s.probing
    }

    /// Take a request, or say why not: [`Self::admit`], then [`Self::quota`].
    #[cfg(test)]
    pub(super) fn take(&self, name: &str) -> Result<(), Refusal> {
        self.admit(name)?;
        self.quota(name).inspect_err(|_| self.settled())
    }

    /// Whether the upstream's health lets a request go (its breaker, its `Retry-After`). An
    /// admitted request must end in [`Self::succeeded`] or [`Self::failed`] (or
    /// [`Self::settled`] when it says nothing of the upstream's health, a quota's refusal
    /// included).
    pub(super) fn admit(&self, name: &str) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut s = self.state();
        if let Some(t) = s.open_until {
            if now < t {
                return Err(Refusal {
                    message: format!(
                        "upstream {name} is failing ({} failures in a row): its circuit breaker is open for {:.0} s more",
                        s.failures,
                        (t - now).as_secs_f64()
                    ),
                    retry_after: t - now,
                    breaker: true,
                });
            }
            // The cool-down is over: one request tries.
            s.open_until = None;
            s.probing = true;
        } else if s.probing {
            return Err(Refusal {
                message: format!(
                    "upstream {name} is failing: its circuit breaker lets one request try, and one is"
                ),
                retry_after: Duration::from_secs(1),
                breaker: true,
            });
        }
        if let Some(t) = s.hold_until.filter(|&t| now < t) {
            return Err(Refusal {
                message: format!(
                    "upstream {name} asked for a pause (Retry-After): {:.0} s more",
                    (t - now).as_secs_f64()
                ),
                retry_after: t - now,
                breaker: false,
            });
        }
        Ok(())
    }

    /// Count a request against this process's own rates and budget, or say which is used up.
    pub(super) fn quota(&self, name: &str) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut s = self.state();
        let (day, rest) = day_and_rest(utc_secs());
        s.on_day(day);
        let refuse = |message: String, retry_after: Duration, _: &mut State| {
            Err(Refusal {
                message,
                retry_after,
                breaker: false,
            })
        };
        if let Some(n) = self.per_day {
            if s.day_requests >= n {
                return refuse(
                    format!("upstream {name}: its {n} requests a day are used up"),
                    rest,
                    &mut s,
                );
            }
        }
        if let Some(n) = self.tokens_per_day {
            if s.day_tokens >= n {
                return refuse(
                    format!(
                        "upstream {name}: its budget of {n} tokens a day is spent ({} used)",
                        s.day_tokens
                    ),
                    rest,
                    &mut s,
                );
            }
        }
        while s
            .minute
            .front()
            .is_some_and(|&t| now.duration_since(t) >= Duration::from_secs(60))
        {
            s.minute.pop_front();
        }
        if let Some(n) = self.per_minute {
            if s.minute.len() >= n as usize {
                let wait = Duration::from_secs(60) - now.duration_since(s.minute[0]);
                return refuse(
                    format!("upstream {name}: its {n} requests a minute are used up"),
                    wait,
                    &mut s,
                );
            }
        }
        s.minute.push_back(now);
        s.day_requests += 1;
        Ok(())
    }

    /// Count a request against the rates and budget kept in the shared store (every gateway's
    /// requests count): None when the store is down (then [`Self::quota`] counts). A minute
    /// there is a fixed window (this process's own is a sliding one).
    pub(super) async fn shared_quota(
        &self,
        name: &str,
        sh: &Shared,
    ) -> Option<Result<(), Refusal>> {
        let secs = utc_secs();
        let (day, rest) = day_and_rest(secs);
        let refuse = |message: String, retry_after: Duration| {
            Some(Err(Refusal {
                message,
                retry_after,
                breaker: false,
            }))
        };
        if let Some(n) = self.tokens_per_day {
            let used = sh.count(&shared_key(name, "tokens", day)).await?;
            if used >= n {
                return refuse(
                    format!("upstream {name}: its budget of {n} tokens a day is spent ({used} used, by every gateway)"),
                    rest,
                );
            }
        }
        if let Some(n) = self.per_day {
            let k = shared_key(name, "day", day);
            if sh.add(&k, 1, Duration::from_secs(2 * 86_400)).await? > u64::from(n) {
                return refuse(
                    format!(
                        "upstream {name}: its {n} requests a day are used up (by every gateway)"
                    ),
                    rest,
                );
            }
        }
        if let Some(n) = self.per_minute {
            let k = shared_key(name, "minute", secs / 60);
            if sh.add(&k, 1, Duration::from_secs(120)).await? > u64::from(n) {
                return refuse(
                    format!(
                        "upstream {name}: its {n} requests a minute are used up (by every gateway)"
                    ),
                    Duration::from_secs(60 - secs % 60),
                );
            }
        }
        Some(Ok(()))
    }

    /// Tokens an answer used, in the shared store's day budget (in the background).
    pub(super) fn shared_spend(&self, name: &str, sh: &std::sync::Arc<Shared>, tokens: u64) {
        if self.tokens_per_day.is_none() || tokens == 0 {
            return;
        }
        let day = day_and_rest(utc_secs()).0;
        let (k, sh) = (shared_key(name, "tokens", day), std::sync::Arc::clone(sh));
        tokio::spawn(async move { sh.add(&k, tokens, Duration::from_secs(2 * 86_400)).await });
    }

    /// Tokens an answer used (the upstream's usage), against the day's budget.
    pub(super) fn spend(&self, tokens: u64) {
        let mut s = self.state();
        s.on_day(day_and_rest(utc_secs()).0);
        s.day_tokens = s.day_tokens.saturating_add(tokens);
    }

    pub(super) fn succeeded(&self) {
        let mut s = self.state();
        s.failures = 0;
        s.probing = false;
        s.open_until = None;
    }

    /// A 5xx, a timeout, no connection, a body or stream that does not parse: the breaker
    /// counts it.
    pub(super) fn failed(&self) {
        let mut s = self.state();
        s.failures = s.failures.saturating_add(1);
        if s.probing || (self.threshold > 0 && s.failures >= self.threshold) {
            s.probing = false;
            s.open_until = Some(Instant::now() + self.cooldown);
        }
    }

    /// An answer that says nothing of the upstream's health (the client's 4xx, a cancelled
    /// request): a probing breaker lets the next one try.
    pub(super) fn settled(&self) {
        let mut s = self.state();
        if s.probing {
            s.probing = false;
            s.open_until = Some(Instant::now());
        }
    }

    /// The upstream's 429 with `Retry-After`: nothing goes there until then.
    pub(super) fn hold(&self, d: Duration) {
        let mut s = self.state();
        s.hold_until = Some(Instant::now() + d.min(Duration::from_secs(3600)));
        if s.probing {
            s.probing = false;
            s.open_until = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_and_closes() {
        let l = Limits::new(None, None, None, 2, Duration::from_millis(50));
        l.take("u").unwrap();
        l.failed();
        l.take("u").unwrap();
        l.failed();
        let r = l.take("u").unwrap_err();
        assert!(r.breaker, "{}", r.message);
        std::thread::sleep(Duration::from_millis(60));
        l.take("u").unwrap(); // the probe
        assert!(l.take("u").unwrap_err().breaker, "one probe at a time");
        l.failed();
        assert!(
            l.take("u").unwrap_err().breaker,
            "a failed probe reopens it"
        );
        std::thread::sleep(Duration::from_millis(60));
        l.take("u").unwrap();
        l.succeeded();
        l.take("u").unwrap();
        l.take("u").unwrap();
    }

    #[test]
    fn rates_and_budget() {
        let l = Limits::new(Some(2), Some(3), Some(100), 0, Duration::from_secs(1));
        l.take("u").unwrap();
        l.take("u").unwrap();
        let r = l.take("u").unwrap_err();
        assert!(r.message.contains("a minute") && !r.breaker);
        assert!(r.retry_after <= Duration::from_secs(60));
        let l = Limits::new(None, None, Some(100), 0, Duration::from_secs(1));
        l.take("u").unwrap();
        l.spend(150);
        assert!(l.take("u").unwrap_err().message.contains("budget"));
    }
}
