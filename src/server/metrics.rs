//! `/metrics` in the Prometheus text format: requests by route and reason, tokens by route,
//! request latency by route, the requests in the house, upstream errors by kind and each
//! upstream's breaker.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub(super) struct Metrics {
    registry: Registry,
    pub(super) requests: IntCounterVec,
    pub(super) tokens: IntCounterVec,
    pub(super) latency: HistogramVec,
    pub(super) in_house: IntGauge,
    pub(super) upstream_errors: IntCounterVec,
    pub(super) breaker_open: IntGaugeVec,
}

impl Metrics {
    /// The metrics, registered (names and labels are fixed here: an error is a bug).
    pub(super) fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "kerze_requests_total",
                "Generation requests answered, by route (local, upstream:NAME) and reason",
            ),
            &["route", "reason"],
        )?;
        let tokens = IntCounterVec::new(
            Opts::new(
                "kerze_tokens_total",
                "Tokens of the answered requests, by route and kind (prompt, completion)",
            ),
            &["route", "kind"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "kerze_request_duration_seconds",
                "From a request's arrival to its last byte, by route",
            )
            .buckets(vec![
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
            ]),
            &["route"],
        )?;
        let in_house = IntGauge::new(
            "kerze_queue_depth",
            "Requests admitted to the local slots: running or queued",
        )?;
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "kerze_upstream_errors_total",
                "Upstream failures by upstream and kind (status, timeout, unreachable, bad_response, stream, auth, rate_limited, limit, breaker)",
            ),
            &["upstream", "kind"],
        )?;
        let breaker_open = IntGaugeVec::new(
            Opts::new(
                "kerze_upstream_breaker_open",
                "1 while an upstream's circuit breaker is open",
            ),
            &["upstream"],
        )?;
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(tokens.clone()),
            Box::new(latency.clone()),
            Box::new(in_house.clone()),
            Box::new(upstream_errors.clone()),
            Box::new(breaker_open.clone()),
        ] {
            registry.register(c)?;
        }
        Ok(Metrics {
            registry,
            requests,
            tokens,
            latency,
            in_house,
            upstream_errors,
            breaker_open,
        })
    }

    /// An answered request: its route, reason, tokens and time since arrival.
    pub(super) fn answered(
        &self,
        tag: &super::route::Tag,
        prompt: u64,
        completion: u64,
        arrived: std::time::Instant,
    ) {
        self.requests
            .with_label_values(&[tag.route.as_str(), tag.reason.as_str()])
            .inc();
        let t = &self.tokens;
        t.with_label_values(&[tag.route.as_str(), "prompt"])
            .inc_by(prompt);
        t.with_label_values(&[tag.route.as_str(), "completion"])
            .inc_by(completion);
        self.latency
            .with_label_values(&[tag.route.as_str()])
            .observe(arrived.elapsed().as_secs_f64());
    }

    /// An answered request, with an engine's usage.
    pub(super) fn answered_with(
        &self,
        tag: &super::route::Tag,
        usage: &crate::generate::Usage,
        arrived: std::time::Instant,
    ) {
        let (p, c) = (usage.prompt_tokens as u64, usage.completion_tokens as u64);
        self.answered(tag, p, c, arrived);
    }

    pub(super) fn upstream_error(&self, upstream: &str, label: &str) {
        self.upstream_errors
            .with_label_values(&[upstream, label])
            .inc();
    }

    /// The text format, with the gauges read now.
    pub(super) fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
