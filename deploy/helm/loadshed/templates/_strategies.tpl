{{/*
Generated from the strategy registry (internal/config) by deploy/cmd/genchart: do not edit.
*/}}

{{/*
The admission strategies, space-separated, in documentation order.
*/}}
{{- define "loadshed.strategyNames" -}}
none token-bucket leaky-bucket bounded-queue inflight adaptive codel chain
{{- end }}

{{/*
The config block key of each admission strategy (empty for none).
*/}}
{{- define "loadshed.strategyBlock" -}}
{{- get (dict "none" "" "token-bucket" "tokenBucket" "leaky-bucket" "leakyBucket" "bounded-queue" "boundedQueue" "inflight" "inflight" "adaptive" "adaptive" "codel" "codel" "chain" "chain") . }}
{{- end }}
