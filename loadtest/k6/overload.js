// Question: at K times the backend's capacity (open model: requests keep arriving on schedule
// whatever happens to earlier ones), how much goodput (2xx within SLO_MS) does the target keep,
// what latency do admitted requests see, and how fast and how honestly (429/503 + Retry-After)
// is the excess refused? K defaults to 2; DURATION to 10s.

import { cfg, duration, hit, markStart, num, report, Schedule, summarize, summaryTrendStats, thresholds, vusFor } from './lib.js';

const K = num('K', 2);
if (!(K > 0)) throw new Error('K must be above 0');
const rate = Math.max(1, Math.round(K * cfg.capacityRPS));
const dur = duration(10);
const schedule = new Schedule(rate, [{ target: rate, duration: `${dur}s` }]);
// Refusing the excess over capacity is the job; refusing much more than that is not.
const maxShed = num('MAX_SHED_SHARE', Math.max(0, 1 - 1 / K) + 0.1);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats,
  scenarios: {
    overload: {
      executor: 'constant-arrival-rate',
      rate,
      timeUnit: '1s',
      duration: `${dur}s`,
      preAllocatedVUs: vusFor(rate),
      gracefulStop: `${Math.ceil(cfg.timeoutS) + 1}s`,
    },
  },
  thresholds: thresholds({ maxShedShare: maxShed }),
};

export default function () {
  markStart(schedule);
  hit();
}

export function handleSummary(data) {
  return report(summarize(data, { script: 'overload', load_factor: rate / cfg.capacityRPS, offered_rps: rate, duration_s: dur }));
}
