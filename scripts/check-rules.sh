#!/usr/bin/env bash
# check-rules.sh checks the Prometheus alert rules in deploy/prometheus: syntax
# (promtool check rules) and behaviour (promtool test rules, every alert firing
# and not firing). promtool comes from Debian's prometheus package; it is
# installed with apt-get when missing (needs root), or taken from $PROMTOOL.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [[ -z "$PROMTOOL" ]]; then
	echo "check-rules: promtool not found; installing Debian's prometheus package" >&2
	if [[ $(id -u) -ne 0 ]]; then
		echo "check-rules: need root to apt-get install prometheus (or set PROMTOOL)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends prometheus >&2 ||
		{ apt-get update >&2 && apt-get install -y --no-install-recommends prometheus >&2; }
	PROMTOOL="$(command -v promtool)"
fi

"$PROMTOOL" --version 2>&1 | head -n1 >&2
"$PROMTOOL" check rules deploy/prometheus/rules.yaml
"$PROMTOOL" test rules deploy/prometheus/rules_test.yaml
