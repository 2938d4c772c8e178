//! When to resize an instance: a pure policy fed one CPU sample per second.
//!
//! Compute is counted in capacity units (CCU: 1 CCU = 1 CPU + 2 GiB). The policy scales up fast
//! (after a few consecutive busy samples, straight to a size that brings utilization back to the
//! target) and down slowly (one step at a time, each after a full quiet window), so a burst is
//! served quickly and a lull never makes the instance flap. No I/O and no clock: the caller
//! passes the time, which keeps every decision reproducible in tests.
//!
//! Sizes form a ladder: every multiple of `step_ccu` inside `[min_ccu, max_ccu]`, plus `min_ccu`
//! and `max_ccu` themselves when they are not multiples (so both bounds stay reachable).

use std::time::Duration;

/// Tolerance for comparing sizes, which are sums and products of decimal fractions.
const EPS: f64 = 1e-9;

/// Sizes are rounded to this many parts of a CCU. Dividing an integer by it (rather than
/// multiplying by its inverse) gives the double nearest the decimal value, e.g. exactly `0.3`.
const QUANTUM: f64 = 1e9;

/// Tolerance, in steps, when deciding which multiple of the step a size is.
const STEP_EPS: f64 = 1e-6;

pub use holdfast_config::serverless::ScalePolicy;

/// Sizing helpers on the policy (whose type lives in `holdfast-config`, without behaviour).
pub trait ScalePolicyExt {
    /// The size nearest to `ccu` on this policy's ladder (see the module documentation), the
    /// larger one on a tie; NaN gives the minimum. Use it for sizes requested by an operator,
    /// so they match what the [`Autoscaler`] would pick.
    fn snap(&self, ccu: f64) -> f64;
}

impl ScalePolicyExt for ScalePolicy {
    fn snap(&self, ccu: f64) -> f64 {
        Ladder::new(self).snap(ccu)
    }
}

/// The size ladder of a policy; see the module documentation.
#[derive(Debug, Clone, Copy)]
struct Ladder {
    min: f64,
    max: f64,
    step: f64,
}

impl Ladder {
    fn new(policy: &ScalePolicy) -> Self {
        Ladder {
            min: policy.min_ccu,
            max: policy.max_ccu,
            step: policy.step_ccu,
        }
    }

    /// `k * step`, rounded so that e.g. 3 * 0.1 reads back as 0.3.
    fn multiple(&self, k: f64) -> f64 {
        (k * self.step * QUANTUM).round() / QUANTUM
    }

    /// The largest multiple of the step at or below `x`.
    fn floor_multiple(&self, x: f64) -> f64 {
        self.multiple((x / self.step + STEP_EPS).floor())
    }

    /// The smallest multiple of the step at or above `x`.
    fn ceil_multiple(&self, x: f64) -> f64 {
        self.multiple((x / self.step - STEP_EPS).ceil())
    }

    /// The ladder size nearest to `x` (the larger one on a tie, as undersizing hurts more).
    fn snap(&self, x: f64) -> f64 {
        if x.is_nan() || x <= self.min + EPS {
            return self.min;
        }
        if x >= self.max - EPS {
            return self.max;
        }
        let below = self.floor_multiple(x).max(self.min);
        let above = self.ceil_multiple(x).min(self.max);
        if x - below < above - x {
            below
        } else {
            above
        }
    }

    /// The smallest ladder size at or above `x`, or the maximum.
    fn at_least(&self, x: f64) -> f64 {
        if x.is_nan() || x <= self.min + EPS {
            return self.min;
        }
        let size = self.ceil_multiple(x);
        if size >= self.max - EPS {
            self.max
        } else {
            size
        }
    }

    /// The next ladder size above `x`, or the maximum.
    fn above(&self, x: f64) -> f64 {
        if x < self.min - EPS {
            return self.min;
        }
        let size = self.floor_multiple(x) + self.step;
        if size >= self.max - EPS {
            self.max
        } else {
            self.multiple((size / self.step).round())
        }
    }

    /// The next ladder size below `x`, or the minimum.
    fn below(&self, x: f64) -> f64 {
        if x > self.max + EPS {
            return self.max;
        }
        let size = self.ceil_multiple(x) - self.step;
        if size <= self.min + EPS {
            self.min
        } else {
            self.multiple((size / self.step).round())
        }
    }
}

/// Applies a [`ScalePolicy`] to a stream of CPU samples.
///
/// [`sample`](Autoscaler::sample) adopts the size it returns at once (the usual case is that the
/// caller applies it); when applying fails, or the size changes behind its back, the caller
/// reports the real size with [`set_current`](Autoscaler::set_current).
#[derive(Debug, Clone)]
pub struct Autoscaler {
    policy: ScalePolicy,
    ladder: Ladder,
    current: f64,
    /// Consecutive busy samples at the current size.
    busy_streak: u32,
    /// Start of the current uninterrupted quiet stretch at the current size.
    quiet_since: Option<Duration>,
    /// Time of the last accepted sample: the start of the interval the next sample covers.
    last_sample: Option<Duration>,
    /// When `sample` last changed the size; a step down waits `down_after_secs` from it.
    changed_at: Option<Duration>,
}

impl Autoscaler {
    /// Starts at `start_ccu`, snapped to the nearest ladder size within the bounds.
    pub fn new(policy: ScalePolicy, start_ccu: f64) -> Self {
        let ladder = Ladder::new(&policy);
        Autoscaler {
            current: ladder.snap(start_ccu),
            policy,
            ladder,
            busy_streak: 0,
            quiet_since: None,
            last_sample: None,
            changed_at: None,
        }
    }

    /// One sample: `cpu_used` CPUs over the last interval, `now` a monotonic time (Duration
    /// since some origin, so tests control time). Returns Some(new size) when the size should
    /// change now.
    ///
    /// A sample covers the time since the previous accepted one, so quiet time is counted from
    /// the start of the first quiet interval. NaN, infinite and negative samples say nothing
    /// about the load: they are ignored and neither extend nor break a streak.
    pub fn sample(&mut self, cpu_used: f64, now: Duration) -> Option<f64> {
        if !cpu_used.is_finite() || cpu_used < 0.0 {
            tracing::debug!(cpu_used, "autoscaler ignores an unusable CPU sample");
            return None;
        }
        let interval_start = self.last_sample.replace(now).unwrap_or(now);
        let utilization = cpu_used / self.current;

        if utilization >= self.policy.up_utilization {
            self.busy_streak = self.busy_streak.saturating_add(1);
        } else {
            self.busy_streak = 0;
        }
        if utilization >= self.policy.down_utilization {
            self.quiet_since = None;
        } else if self.quiet_since.is_none() {
            self.quiet_since = Some(interval_start);
        }

        if self.busy_streak >= self.policy.up_samples.max(1) && self.current < self.ladder.max - EPS
        {
            let wanted = self
                .ladder
                .at_least(cpu_used / self.policy.target_utilization);
            let next = self.ladder.above(self.current).max(wanted);
            return Some(self.change(next, now));
        }

        let window = Duration::from_secs(self.policy.down_after_secs);
        let quiet_long_enough = self
            .quiet_since
            .is_some_and(|since| now.saturating_sub(since) >= window);
        let settled_since_change = self
            .changed_at
            .is_none_or(|at| now.saturating_sub(at) >= window);
        if quiet_long_enough && settled_since_change && self.current > self.ladder.min + EPS {
            let next = self.ladder.below(self.current);
            return Some(self.change(next, now));
        }
        None
    }

    /// The size the autoscaler believes the instance has, in CCU.
    pub fn current(&self) -> f64 {
        self.current
    }

    /// The caller applied (or failed to apply) a size: set current without resetting more than
    /// needed.
    ///
    /// Reporting the size already held changes nothing, so callers may confirm every applied
    /// size. A different size (snapped to the ladder) restarts the busy and quiet streaks, which
    /// were measured against the old size; a failed scale-up is thus retried after another
    /// `up_samples` busy samples, and a step down still needs a full quiet window at the new
    /// size. Non-finite values are ignored.
    pub fn set_current(&mut self, ccu: f64) {
        if !ccu.is_finite() {
            tracing::warn!(ccu, "autoscaler ignores a non-finite current size");
            return;
        }
        let size = self.ladder.snap(ccu);
        if (size - self.current).abs() <= EPS {
            return;
        }
        self.current = size;
        self.busy_streak = 0;
        self.quiet_since = None;
        // The next sample's interval may have started at the old size: count quiet time from
        // the sample after the change instead.
        self.last_sample = None;
    }

    /// The policy in force.
    pub fn policy(&self) -> &ScalePolicy {
        &self.policy
    }

    fn change(&mut self, next: f64, now: Duration) -> f64 {
        tracing::debug!(from = self.current, to = next, "autoscaler resizes");
        self.current = next;
        self.busy_streak = 0;
        self.quiet_since = None;
        self.changed_at = Some(now);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Feeds `cpu` once per second for `from..to` and returns every (time, new size).
    fn run(a: &mut Autoscaler, from: u64, to: u64, cpu: f64) -> Vec<(u64, f64)> {
        (from..to)
            .filter_map(|t| a.sample(cpu, secs(t)).map(|size| (t, size)))
            .collect()
    }

    fn policy_with_step(min: f64, max: f64, step: f64) -> ScalePolicy {
        ScalePolicy {
            min_ccu: min,
            max_ccu: max,
            step_ccu: step,
            ..ScalePolicy::default()
        }
    }

    #[test]
    fn one_sample_spike_does_not_scale_up() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        // Busy, calm, busy, calm...: never two busy samples in a row.
        for t in 0..20 {
            let cpu = if t % 2 == 0 { 0.95 } else { 0.5 };
            assert_eq!(a.sample(cpu, secs(t)), None, "t={t}");
        }
        assert_eq!(a.current(), 1.0);
    }

    #[test]
    fn sustained_load_scales_up_to_the_target_utilization() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(a.sample(0.9, secs(0)), None);
        // 0.9 CPU at 60% target needs 1.5 CCU.
        assert_eq!(a.sample(0.9, secs(1)), Some(1.5));
        assert_eq!(a.current(), 1.5);
        // The streak restarts at the new size: 0.9 / 1.5 = 0.6 is not busy.
        assert_eq!(run(&mut a, 2, 30, 0.9), vec![]);
    }

    #[test]
    fn scale_up_goes_at_least_one_step() {
        // Exactly at the busy threshold, the target would be met by 1.34 CCU -> 1.5, one step.
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(run(&mut a, 0, 2, 0.8), vec![(1, 1.5)]);
        // With target == up, the target size equals the current one: still one step.
        let policy = ScalePolicy {
            target_utilization: 0.8,
            ..ScalePolicy::default()
        };
        let mut a = Autoscaler::new(policy, 1.0);
        assert_eq!(run(&mut a, 0, 2, 0.8), vec![(1, 1.5)]);
    }

    #[test]
    fn big_jump_goes_straight_to_the_needed_size_and_clamps_at_max() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 0.5);
        // 1.7 CPU / 0.6 = 2.83 -> 3.0 in one move.
        assert_eq!(run(&mut a, 0, 2, 1.7), vec![(1, 3.0)]);
        let mut a = Autoscaler::new(ScalePolicy::default(), 0.5);
        // 10 CPU would need 16.7 CCU: clamped to 4.
        assert_eq!(run(&mut a, 0, 2, 10.0), vec![(1, 4.0)]);
        // At max, more load changes nothing.
        assert_eq!(run(&mut a, 2, 100, 10.0), vec![]);
        assert_eq!(a.current(), 4.0);
    }

    #[test]
    fn ramp_scales_up_step_by_step_as_load_grows() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 0.5);
        let mut changes = Vec::new();
        // Load grows by 0.1 CPU every 5 seconds, up to 3.5 CPU.
        for t in 0..200u64 {
            let cpu = ((t / 5) as f64 * 0.1).min(3.5);
            if let Some(size) = a.sample(cpu, secs(t)) {
                changes.push((t, size));
            }
        }
        let sizes: Vec<f64> = changes.iter().map(|&(_, s)| s).collect();
        assert!(
            sizes.windows(2).all(|w| w[0] < w[1]),
            "only growth: {changes:?}"
        );
        assert_eq!(a.current(), 4.0, "{changes:?}");
        // Every new size meets the target utilization for the load that triggered it.
        for &(t, size) in &changes {
            let cpu = ((t / 5) as f64 * 0.1).min(3.5);
            assert!(
                cpu / size <= 0.6 + 1e-9 || size == 4.0,
                "t={t}: {size} is not enough for {cpu}"
            );
        }
    }

    #[test]
    fn sustained_low_load_steps_down_once_per_window_to_min() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 4.0);
        let changes = run(&mut a, 0, 1000, 0.05);
        let expected: Vec<(u64, f64)> = (1..=7).map(|i| (60 * i, 4.0 - 0.5 * i as f64)).collect();
        assert_eq!(changes, expected);
        assert_eq!(a.current(), 0.5);
    }

    #[test]
    fn quiet_window_counts_from_the_start_of_the_first_quiet_interval() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 2.0);
        assert_eq!(a.sample(1.0, secs(100)), None);
        // Quiet from 100 on (the sample at 101 covers 100..101).
        assert_eq!(run(&mut a, 101, 160, 0.1), vec![]);
        assert_eq!(a.sample(0.1, secs(160)), Some(1.5));
    }

    #[test]
    fn interrupted_quiet_restarts_the_down_timer() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 2.0);
        assert_eq!(run(&mut a, 0, 50, 0.1), vec![]);
        // One sample at 50% utilization: not busy, but not quiet either.
        assert_eq!(a.sample(1.0, secs(50)), None);
        assert_eq!(run(&mut a, 51, 110, 0.1), vec![]);
        assert_eq!(a.sample(0.1, secs(110)), Some(1.5));
    }

    #[test]
    fn no_scale_down_within_the_window_after_a_scale_up() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(run(&mut a, 0, 2, 2.0), vec![(1, 3.5)]);
        // Load vanishes right after the scale-up.
        let changes = run(&mut a, 2, 200, 0.0);
        assert_eq!(changes.first(), Some(&(61, 3.0)), "{changes:?}");
        assert!(changes.iter().all(|&(t, _)| t >= 61));
        assert!(changes.windows(2).all(|w| w[1].0 - w[0].0 >= 60));
    }

    #[test]
    fn quiet_before_a_scale_up_does_not_count_afterwards() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(run(&mut a, 0, 59, 0.1), vec![]);
        assert_eq!(run(&mut a, 59, 61, 0.9), vec![(60, 1.5)]);
        // Quiet again from 60: the next step down is at 120, not earlier.
        assert_eq!(run(&mut a, 61, 121, 0.1), vec![(120, 1.0)]);
    }

    #[test]
    fn fractional_steps() {
        let policy = ScalePolicy {
            min_ccu: 0.25,
            max_ccu: 2.0,
            step_ccu: 0.25,
            ..ScalePolicy::default()
        };
        assert!(policy.validate().is_ok());
        let mut a = Autoscaler::new(policy.clone(), 0.5);
        // 0.5 CPU / 0.6 = 0.83 -> 1.0.
        assert_eq!(run(&mut a, 0, 2, 0.5), vec![(1, 1.0)]);
        // 0.85 / 1.0 is busy; 0.85 / 0.6 = 1.42 -> 1.5.
        assert_eq!(run(&mut a, 2, 4, 0.85), vec![(3, 1.5)]);
        // Then down by 0.25 per minute to the minimum.
        let changes = run(&mut a, 4, 1000, 0.0);
        let sizes: Vec<f64> = changes.iter().map(|&(_, s)| s).collect();
        assert_eq!(sizes, vec![1.25, 1.0, 0.75, 0.5, 0.25]);

        // A decimal step that is not exact in binary still yields clean sizes.
        let mut a = Autoscaler::new(policy_with_step(0.1, 1.0, 0.1), 0.3);
        assert_eq!(a.current(), 0.3);
        assert_eq!(run(&mut a, 0, 2, 0.3), vec![(1, 0.5)]);
        assert_eq!(run(&mut a, 2, 200, 0.0).first(), Some(&(61, 0.4)));
    }

    #[test]
    fn bounds_that_are_not_multiples_of_the_step_are_reachable() {
        let policy = policy_with_step(0.3, 2.2, 0.5);
        assert!(policy.validate().is_ok());
        let mut a = Autoscaler::new(policy.clone(), 0.3);
        assert_eq!(run(&mut a, 0, 2, 0.25), vec![(1, 0.5)]);
        let mut a = Autoscaler::new(policy.clone(), 2.0);
        assert_eq!(run(&mut a, 0, 2, 1.9), vec![(1, 2.2)]);
        let changes = run(&mut a, 2, 1000, 0.0);
        let sizes: Vec<f64> = changes.iter().map(|&(_, s)| s).collect();
        assert_eq!(sizes, vec![2.0, 1.5, 1.0, 0.5, 0.3]);
    }

    #[test]
    fn start_size_is_snapped_and_clamped() {
        let p = ScalePolicy::default;
        assert_eq!(Autoscaler::new(p(), 1.2).current(), 1.0);
        assert_eq!(Autoscaler::new(p(), 1.3).current(), 1.5);
        assert_eq!(Autoscaler::new(p(), 1.25).current(), 1.5, "ties go up");
        assert_eq!(Autoscaler::new(p(), 0.1).current(), 0.5);
        assert_eq!(Autoscaler::new(p(), -3.0).current(), 0.5);
        assert_eq!(Autoscaler::new(p(), 17.0).current(), 4.0);
        assert_eq!(Autoscaler::new(p(), f64::NAN).current(), 0.5);
        assert_eq!(Autoscaler::new(p(), f64::INFINITY).current(), 4.0);
        assert_eq!(Autoscaler::new(p(), 3.9999999999).current(), 4.0);
        let odd = policy_with_step(0.3, 2.2, 0.5);
        assert_eq!(Autoscaler::new(odd.clone(), 0.35).current(), 0.3);
        assert_eq!(Autoscaler::new(odd.clone(), 0.45).current(), 0.5);
        assert_eq!(Autoscaler::new(odd.clone(), 2.15).current(), 2.2);
        assert_eq!(Autoscaler::new(odd.clone(), 2.05).current(), 2.0);
        assert_eq!(odd.snap(0.9), 1.0);
        assert_eq!(p().snap(2.7), 2.5);
    }

    #[test]
    fn unusable_samples_are_ignored() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(a.sample(0.9, secs(0)), None);
        for bad in [f64::NAN, -0.5, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(a.sample(bad, secs(1)), None);
        }
        // The busy streak survived the garbage.
        assert_eq!(a.sample(0.9, secs(2)), Some(1.5));
        assert_eq!(a.current(), 1.5);
    }

    #[test]
    fn set_current_with_the_same_size_keeps_streaks() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(a.sample(0.9, secs(0)), None);
        a.set_current(1.0);
        a.set_current(1.1); // snaps to 1.0
        a.set_current(f64::NAN);
        assert_eq!(a.sample(0.9, secs(1)), Some(1.5));
        // Confirming the applied size does not restart the down timer either.
        a.set_current(1.5);
        assert_eq!(run(&mut a, 2, 62, 0.1), vec![(61, 1.0)]);
    }

    #[test]
    fn set_current_after_a_failed_resize_restarts_streaks() {
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(run(&mut a, 0, 2, 0.9), vec![(1, 1.5)]);
        // The resize failed: back to 1.0. The next busy sample alone does not retry...
        a.set_current(1.0);
        assert_eq!(a.current(), 1.0);
        assert_eq!(a.sample(0.9, secs(2)), None);
        // ...the second one does.
        assert_eq!(a.sample(0.9, secs(3)), Some(1.5));

        // A size set from outside needs a full quiet window before stepping down.
        let mut a = Autoscaler::new(ScalePolicy::default(), 1.0);
        assert_eq!(run(&mut a, 0, 30, 0.1), vec![]);
        a.set_current(3.0);
        assert_eq!(a.policy(), &ScalePolicy::default());
        let changes = run(&mut a, 30, 200, 0.1);
        assert_eq!(changes.first(), Some(&(90, 2.5)), "{changes:?}");
    }

    #[test]
    fn min_equal_to_max_never_changes() {
        let mut a = Autoscaler::new(policy_with_step(2.0, 2.0, 0.5), 1.0);
        assert_eq!(a.current(), 2.0);
        assert_eq!(run(&mut a, 0, 100, 5.0), vec![]);
        assert_eq!(run(&mut a, 100, 300, 0.0), vec![]);
    }

    #[test]
    fn invalid_policy_does_not_panic() {
        for policy in [
            policy_with_step(0.5, 4.0, 0.0),
            policy_with_step(5.0, 1.0, 0.5),
            policy_with_step(f64::NAN, f64::NAN, f64::NAN),
            ScalePolicy {
                target_utilization: 0.0,
                up_samples: 0,
                ..ScalePolicy::default()
            },
        ] {
            let mut a = Autoscaler::new(policy, 1.0);
            for t in 0..200 {
                let _ = a.sample((t % 7) as f64, secs(t));
            }
            a.set_current(2.0);
        }
    }
}
