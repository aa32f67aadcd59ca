// Question: when load jumps from 0.5x to SPIKE_K (default 5) times capacity and back, does the
// target keep serving through the spike, and how long after the spike ends does goodput get back
// to 0.9 x min(offered, capacity)? (recovery_s in the summary; null: not within the run.)
//
// Phases (seconds): BASE_S at 0.5x (5), ramp RAMP_S (1), HOLD_S at SPIKE_K x (10), ramp RAMP_S,
// AFTER_S at 0.5x (15). Recovery is read from a per-second timeline (see lib.js Timeline and
// recovery): the first second after the spike from which goodput stays above 0.9 x
// min(offered in that second, capacity) for RECOVERY_HOLD_S (3) seconds in a row.

import { cfg, hit, markStart, num, recovery, report, Schedule, summarize, summaryTrendStats, thresholds, Timeline, vusFor } from './lib.js';

const base = Math.max(1, Math.round(0.5 * cfg.capacityRPS));
const spikeK = num('SPIKE_K', 5);
const peak = Math.max(1, Math.round(spikeK * cfg.capacityRPS));
const baseS = num('BASE_S', 5);
const rampS = num('RAMP_S', 1);
const holdS = num('HOLD_S', 10);
const afterS = num('AFTER_S', 15);
const stages = [
  { target: base, duration: `${baseS}s` },
  { target: peak, duration: `${rampS}s` },
  { target: peak, duration: `${holdS}s` },
  { target: base, duration: `${rampS}s` },
  { target: base, duration: `${afterS}s` },
];
const schedule = new Schedule(base, stages);
const spikeStart = baseS;
const spikeEnd = baseS + rampS + holdS + rampS;
const total = schedule.total;
const timeline = new Timeline(total);
const meanRate = schedule.meanRate();

export const options = {
  discardResponseBodies: true,
  summaryTrendStats,
  scenarios: {
    spike: {
      executor: 'ramping-arrival-rate',
      startRate: base,
      timeUnit: '1s',
      stages,
      preAllocatedVUs: vusFor(peak),
      gracefulStop: `${Math.ceil(cfg.timeoutS) + 1}s`,
    },
  },
  // Over the whole run the excess is (meanRate - capacity) / meanRate.
  thresholds: thresholds({ maxShedShare: num('MAX_SHED_SHARE', Math.max(0, 1 - cfg.capacityRPS / meanRate) + 0.1) }),
};

export default function () {
  const sec = markStart(schedule);
  timeline.offer(sec);
  hit(timeline, sec);
}

export function handleSummary(data) {
  const tl = timeline.read(data);
  const cap = () => cfg.capacityRPS;
  const during = tl.filter((b) => b.t >= spikeStart + rampS && b.t < spikeEnd - rampS);
  const good = (bs) => bs.reduce((a, b) => a + b.good, 0);
  const offered = (bs) => bs.reduce((a, b) => a + b.offered, 0);
  const ratio = (bs) => {
    const ideal = bs.reduce((a, b) => a + Math.min(b.offered, cfg.capacityRPS), 0);
    return ideal > 0 ? Math.round((good(bs) / ideal) * 1e4) / 1e4 : null;
  };
  const before = tl.filter((b) => b.t < spikeStart);
  const after = tl.filter((b) => b.t >= spikeEnd && b.t < total);
  return report(
    summarize(data, {
      script: 'spike',
      load_factor: spikeK,
      offered_rps: meanRate,
      duration_s: total,
      spike: { start_s: spikeStart, end_s: spikeEnd, base_rps: base, peak_rps: peak },
      phases: {
        before: { offered: offered(before), good: good(before), goodput_ratio: ratio(before) },
        spike: { offered: offered(during), good: good(during), goodput_ratio: ratio(during) },
        after: { offered: offered(after), good: good(after), goodput_ratio: ratio(after) },
      },
      recovery_s: recovery(tl, spikeEnd, total, cap, 0.9, num('RECOVERY_HOLD_S', 3)),
      timeline: tl,
    }),
  );
}
