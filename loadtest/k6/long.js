// Question: over a long run at K x capacity (minutes: long enough for Envoy's periodic min-RTT
// probe, every 60 s by default), does the target shed a steady share second by second, or does
// its limit swing, refusing far more than the excess in some seconds and admitting a queue in
// others? The per-second timeline (offered, sent, good, shed) is in the summary; the bench's long
// scenario reads the worst second's shed share from it. K defaults to 2 (ideal shed share 0.5),
// DURATION to 180s.

import { cfg, duration, hit, markStart, num, report, Schedule, summarize, summaryTrendStats, thresholds, Timeline, vusFor } from './lib.js';

const K = num('K', 2);
if (!(K > 0)) throw new Error('K must be above 0');
const rate = Math.max(1, Math.round(K * cfg.capacityRPS));
const dur = duration(180);
const schedule = new Schedule(rate, [{ target: rate, duration: `${dur}s` }]);
const timeline = new Timeline(dur);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats,
  scenarios: {
    load: {
      executor: 'constant-arrival-rate',
      rate,
      timeUnit: '1s',
      duration: `${dur}s`,
      preAllocatedVUs: vusFor(rate),
      gracefulStop: `${Math.ceil(cfg.timeoutS) + 1}s`,
    },
  },
  thresholds: thresholds({ maxShedShare: num('MAX_SHED_SHARE', Math.max(0, 1 - 1 / K) + 0.1) }),
};

export default function () {
  const sec = markStart(schedule);
  timeline.offer(sec);
  hit(timeline, sec);
}

export function handleSummary(data) {
  return report(
    summarize(data, {
      script: 'long',
      load_factor: K,
      offered_rps: rate,
      duration_s: dur,
      timeline: timeline.read(data),
    }),
  );
}
