// Question: does the target answer correctly at light load, with no sheds, no errors and admitted
// latency within the SLO? Runs 0.2 x CAPACITY_RPS (at least 1 rps) for DURATION (default 5s).

import { check } from 'k6';
import { cfg, duration, hit, markStart, num, report, Schedule, summarize, summaryTrendStats, thresholds, vusFor } from './lib.js';

const factor = num('K', 0.2);
const rate = Math.max(1, Math.round(factor * cfg.capacityRPS));
const dur = duration(5);
const schedule = new Schedule(rate, [{ target: rate, duration: `${dur}s` }]);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats,
  scenarios: {
    smoke: {
      executor: 'constant-arrival-rate',
      rate,
      timeUnit: '1s',
      duration: `${dur}s`,
      preAllocatedVUs: vusFor(rate),
      gracefulStop: `${Math.ceil(cfg.timeoutS) + 1}s`,
    },
  },
  thresholds: Object.assign(thresholds({ maxShedShare: num('MAX_SHED_SHARE', 0) }), {
    checks: [`rate>=${num('MIN_CHECKS', 0.99)}`],
  }),
};

export default function () {
  markStart(schedule);
  const outcome = hit();
  check(outcome, { 'answered 2xx within the SLO': (o) => o === 'good' });
}

export function handleSummary(data) {
  return report(summarize(data, { script: 'smoke', load_factor: rate / cfg.capacityRPS, offered_rps: rate, duration_s: dur }));
}
