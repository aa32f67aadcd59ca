// Question: at K times the backend's capacity in gRPC calls (open model: calls keep arriving on
// schedule whatever happens to earlier ones), how much goodput (OK within SLO_MS) does the target
// keep, what latency do admitted calls see, and are the refused calls told so the gRPC way: a
// trailers-only answer with grpc-status UNAVAILABLE (or RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED,
// PERMISSION_DENIED), x-loadshed-reason and grpc-retry-pushback-ms? K defaults to 2; DURATION
// to 10s. With K below 1 it is the unloaded gRPC baseline.
//
// Every call is the synthetic backend's unary loadshed.backend.v1.Backend/Work, in cleartext
// HTTP/2 (h2c) to TARGET_URL's host and port, with the .proto loaded from PROTO_DIR (default: the
// repository's internal/backend/backendpb, relative to this file). Each VU opens one connection.

import exec from 'k6/execution';
import grpc from 'k6/net/grpc';
import { cfg, duration, env, grpcAddress, markStart, num, recordGrpc, report, Schedule, summarize, summaryTrendStats, thresholds, vusFor } from './lib.js';

const K = num('K', 2);
if (!(K > 0)) throw new Error('K must be above 0');
const rate = Math.max(1, Math.round(K * cfg.capacityRPS));
const dur = duration(10);
const schedule = new Schedule(rate, [{ target: rate, duration: `${dur}s` }]);
// Refusing the excess over capacity is the job; refusing much more than that is not.
const maxShed = num('MAX_SHED_SHARE', Math.max(0, 1 - 1 / K) + 0.1);
const address = grpcAddress(cfg.targetURL);
const method = 'loadshed.backend.v1.Backend/Work';

const client = new grpc.Client();
client.load([env('PROTO_DIR', '../../internal/backend/backendpb')], 'backend.proto');

export const options = {
  summaryTrendStats,
  scenarios: {
    grpc_overload: {
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

let connected = false;

export default function () {
  markStart(schedule);
  if (!connected) {
    // One connection per VU, opened by its first iteration (connect is not allowed in init).
    try {
      client.connect(address, { plaintext: true, timeout: cfg.timeout });
      connected = true;
    } catch (e) {
      recordGrpc({ status: 14, headers: {}, trailers: {} }, 0);
      console.warn(`connect ${address}: ${e} (VU ${exec.vu.idInTest})`);
      return;
    }
  }
  const start = Date.now();
  const res = client.invoke(method, {}, { timeout: cfg.timeout, discardResponseMessage: true });
  recordGrpc(res, Date.now() - start);
}

export function handleSummary(data) {
  return report(summarize(data, { script: 'grpc-overload', protocol: 'grpc', load_factor: rate / cfg.capacityRPS, offered_rps: rate, duration_s: dur }));
}
