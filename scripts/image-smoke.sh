#!/usr/bin/env bash
# image-smoke.sh builds the loadshed image (scripts/image.sh) and proves it works:
#   1. proxy, backend and lab print their version;
#   2. the image is under 56 MB, runs as 65532:65532, has the proxy as entrypoint and OCI labels;
#   3. --check-config accepts a good config and rejects a bad one;
#   4. a backend container and a proxy container on a private Docker network serve one
#      request sent from the host through a port published on 127.0.0.1 only.
# Containers run read-only with every capability dropped, as in the Helm chart.
# Everything it creates is removed on exit, pass or fail.
#
#   scripts/image-smoke.sh                     # build loadshed:dev, then test it
#   IMAGE=loadshed:v0.1.0 SKIP_BUILD=1 scripts/image-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-loadshed:dev}"
# About 52 MB today: the proxy 26 MB (gRPC, Envoy's ext_proc API from go-control-plane, the
# Redis client), the backend 14 MB (gRPC), the lab 12 MB (built without its charts and its live
# half). The budget leaves room for a patch release, not for a new dependency unnoticed.
MAX_BYTES=$((56 * 1000 * 1000))
WAIT_SECONDS="${WAIT_SECONDS:-60}"

suffix="$$-$RANDOM"
net="loadshed-smoke-$suffix"
backend="loadshed-smoke-backend-$suffix"
proxy="loadshed-smoke-proxy-$suffix"
tmp="$(mktemp -d)"
ok=0

cleanup() {
	if [[ $ok != 1 ]]; then
		for c in "$backend" "$proxy"; do
			if docker inspect "$c" >/dev/null 2>&1; then
				echo "---- logs of $c ----" >&2
				docker logs "$c" >&2 2>&1 || true
			fi
		done
	fi
	docker rm -f "$backend" "$proxy" >/dev/null 2>&1 || true
	docker network rm "$net" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "image-smoke: FAIL: $*" >&2
	exit 1
}
# check_failed records a failure and lets the remaining checks run.
failures=0
check_failed() {
	echo "image-smoke: FAIL: $*" >&2
	failures=$((failures + 1))
}
step() { echo "image-smoke: $*" >&2; }

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
	IMAGE="$IMAGE" scripts/image.sh >/dev/null
fi
docker image inspect "$IMAGE" >/dev/null 2>&1 || fail "image $IMAGE does not exist"

step "versions"
for b in proxy backend lab; do
	out="$(docker run --rm --entrypoint "/usr/local/bin/$b" "$IMAGE" --version)" ||
		fail "$b --version exited with an error"
	[[ "$out" == "$b "* ]] || fail "$b --version printed '$out', want it to start with '$b '"
	step "  $out"
done

step "image metadata"
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
if ((size >= MAX_BYTES)); then
	c="$(docker create "$IMAGE")"
	breakdown="$(docker export "$c" | tar -tvf - | awk '$3 > 100000 {printf "    %s %d bytes\n", $6, $3}')"
	docker rm "$c" >/dev/null
	check_failed "image is $size bytes, want under $MAX_BYTES; largest files:"$'\n'"$breakdown"
fi
user="$(docker image inspect -f '{{.Config.User}}' "$IMAGE")"
[[ "$user" == "65532:65532" ]] || fail "image user is '$user', want 65532:65532"
entrypoint="$(docker image inspect -f '{{json .Config.Entrypoint}}' "$IMAGE")"
[[ "$entrypoint" == '["/usr/local/bin/proxy"]' ]] || fail "entrypoint is $entrypoint"
for label in title source version revision created; do
	v="$(docker image inspect -f "{{index .Config.Labels \"org.opencontainers.image.$label\"}}" "$IMAGE")"
	[[ -n "$v" ]] || fail "label org.opencontainers.image.$label is missing"
done
if docker run --rm --entrypoint /bin/sh "$IMAGE" -c true >/dev/null 2>&1; then
	fail "the image has a shell; it must not"
fi
step "  $size bytes, user $user, entrypoint $entrypoint"

# Containers run the way the chart runs them: read-only root, no capabilities.
hardening=(--read-only --cap-drop ALL --security-opt no-new-privileges)

cat >"$tmp/config.yaml" <<YAML
listen: ":8000"
upstream: "http://$backend:8080"
adminListen: ":9901"
admission:
  strategy: inflight
  inflight: {limit: 4}
YAML
cat >"$tmp/bad.yaml" <<YAML
listen: ":8000"
upstream: "http://$backend:8080"
admission:
  strategy: no-such-strategy
  inflight: {limit: -1}
YAML
chmod 0644 "$tmp/config.yaml" "$tmp/bad.yaml"

step "--check-config"
docker run --rm "${hardening[@]}" -v "$tmp/config.yaml:/etc/loadshed/config.yaml:ro" "$IMAGE" \
	--check-config /etc/loadshed/config.yaml >&2 || fail "--check-config rejected a valid config"
if docker run --rm "${hardening[@]}" -v "$tmp/bad.yaml:/etc/loadshed/config.yaml:ro" "$IMAGE" \
	--check-config /etc/loadshed/config.yaml >"$tmp/bad.out" 2>&1; then
	fail "--check-config accepted an invalid config"
fi
grep -q strategy "$tmp/bad.out" || fail "--check-config did not name the bad field: $(cat "$tmp/bad.out")"

step "container pair on network $net"
docker network create "$net" >/dev/null
docker run -d --name "$backend" --network "$net" "${hardening[@]}" \
	--entrypoint /usr/local/bin/backend "$IMAGE" \
	--listen :8080 --workers 2 --mean 5ms --stddev 0s --tail-prob 0 >/dev/null
docker run -d --name "$proxy" --network "$net" "${hardening[@]}" \
	-v "$tmp/config.yaml:/etc/loadshed/config.yaml:ro" \
	-p 127.0.0.1::8000 -p 127.0.0.1::9901 \
	"$IMAGE" --config /etc/loadshed/config.yaml >/dev/null

data="$(docker port "$proxy" 8000/tcp | head -n1)"
admin="$(docker port "$proxy" 9901/tcp | head -n1)"
[[ "$data" == 127.0.0.1:* && "$admin" == 127.0.0.1:* ]] || fail "unexpected published ports '$data' '$admin'"

deadline=$((SECONDS + WAIT_SECONDS))
until curl -fsS -o /dev/null --max-time 2 "http://$admin/readyz" 2>/dev/null; do
	for c in "$backend" "$proxy"; do
		[[ "$(docker inspect -f '{{.State.Running}}' "$c")" == true ]] || fail "container $c exited"
	done
	((SECONDS < deadline)) || fail "proxy not ready within ${WAIT_SECONDS}s"
	sleep 0.2
done

# The backend may still be starting when the proxy is ready: retry a bounded number of
# times on 502 only (a connection refused upstream), never on anything else.
code=""
for _ in $(seq 1 50); do
	code="$(curl -sS -o "$tmp/body" -w '%{http_code}' --max-time 5 "http://$data/smoke?x=1")" || code="curl-error"
	[[ "$code" == 502 ]] || break
	((SECONDS < deadline)) || break
	sleep 0.2
done
[[ "$code" == 200 ]] || fail "proxied request returned $code: $(head -c 300 "$tmp/body" 2>/dev/null)"
step "  GET http://$data/smoke -> $code"

curl -fsS --max-time 5 "http://$admin/metrics" >"$tmp/metrics" || fail "GET /metrics failed"
grep -Eq '^loadshed_requests_total\{.*outcome="success".*\} [1-9]' "$tmp/metrics" ||
	fail "loadshed_requests_total has no success sample after a proxied request"
curl -fsS -o /dev/null --max-time 2 "http://$admin/healthz" || fail "GET /healthz failed"

if ((failures > 0)); then
	fail "$failures check(s) failed ($IMAGE)"
fi
ok=1
step "PASS ($IMAGE)"
