{{/*
Chart name, truncated to the 63 characters Kubernetes allows in names and labels.
*/}}
{{- define "loadshed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of every resource: the release name, plus the chart name unless the
release name already contains it.
*/}}
{{- define "loadshed.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "loadshed.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource.
*/}}
{{- define "loadshed.labels" -}}
helm.sh/chart: {{ include "loadshed.chart" . }}
{{ include "loadshed.selectorLabels" . }}
app.kubernetes.io/version: {{ include "loadshed.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the pods.
*/}}
{{- define "loadshed.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loadshed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/*
Labels of the helm test pod: the release's, but never the pods' selector labels,
so neither the Service nor the PodDisruptionBudget selects the test pod.
*/}}
{{- define "loadshed.testLabels" -}}
helm.sh/chart: {{ include "loadshed.chart" . }}
app.kubernetes.io/name: {{ include "loadshed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Name of the ServiceAccount the pods use.
*/}}
{{- define "loadshed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loadshed.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Tag of the loadshed image.
*/}}
{{- define "loadshed.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
The loadshed image reference.
*/}}
{{- define "loadshed.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "loadshed.imageTag" .) }}
{{- end }}

{{/*
The application image reference: app.image, or the loadshed image.
*/}}
{{- define "loadshed.appImage" -}}
{{- $repo := default .Values.image.repository .Values.app.image.repository }}
{{- $tag := default (include "loadshed.imageTag" .) .Values.app.image.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/*
Seconds in a Go duration string ("1m30s", "500ms", "0"), as a float. Helm has no
duration parser; values.schema.json already restricts the format.
*/}}
{{- define "loadshed.durationSeconds" -}}
{{- $d := toString . }}
{{- if not (regexMatch "^(0|([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$" $d) }}
{{- fail (printf "%q is not a Go duration such as \"500ms\" or \"1m30s\"" $d) }}
{{- end }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" $d -1 }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 }}
{{- $unit := trimPrefix (regexFind "^[0-9]+(\\.[0-9]+)?" .) . }}
{{- $scale := get (dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit }}
{{- $total = addf $total (mulf $num $scale) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Seconds the sidecar may need to stop after SIGTERM: drainDelay + gracePeriod,
rounded up.
*/}}
{{- define "loadshed.drainSeconds" -}}
{{- $drain := include "loadshed.durationSeconds" .Values.proxy.shutdown.drainDelay | float64 }}
{{- $grace := include "loadshed.durationSeconds" .Values.proxy.shutdown.gracePeriod | float64 }}
{{- addf $drain $grace | ceil | int }}
{{- end }}

{{/*
terminationGracePeriodSeconds: computed from the sidecar's drain and grace
periods plus a margin, or the configured value when it is at least that.
*/}}
{{- define "loadshed.terminationGracePeriodSeconds" -}}
{{- $need := add (include "loadshed.drainSeconds" . | int) (.Values.terminationGraceMarginSeconds | int) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- $need }}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (int $need) }}
{{- fail (printf "terminationGracePeriodSeconds: %v is shorter than proxy.shutdown.drainDelay + proxy.shutdown.gracePeriod + terminationGraceMarginSeconds = %d seconds; pods would be killed before the sidecar drains" .Values.terminationGracePeriodSeconds $need) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
Seconds the application keeps running after the pod is told to stop.
*/}}
{{- define "loadshed.appShutdownDelaySeconds" -}}
{{- if kindIs "invalid" .Values.app.shutdownDelaySeconds }}
{{- include "loadshed.drainSeconds" . }}
{{- else }}
{{- int .Values.app.shutdownDelaySeconds }}
{{- end }}
{{- end }}

{{/*
The sidecar's mode: proxy (a reverse proxy in front of the app) or extproc (the
external processor of an Envoy in the pod).
*/}}
{{- define "loadshed.mode" -}}
{{- if not (has .Values.mode (list "proxy" "extproc")) }}
{{- fail (printf "mode: %q is not one of proxy, extproc" .Values.mode) }}
{{- end }}
{{- .Values.mode }}
{{- end }}

{{/*
The sidecar's config file (the proxy's YAML schema). Only the selected
strategy's block is written.
*/}}
{{- define "loadshed.proxyConfig" -}}
{{- $p := .Values.proxy }}
{{- $a := .Values.admission }}
{{- $strategies := splitList " " (include "loadshed.strategyNames" .) }}
{{- if not (has $a.strategy $strategies) }}
{{- fail (printf "admission.strategy: unknown strategy %q (want one of %s)" $a.strategy (join ", " $strategies)) }}
{{- end }}
{{- $admission := dict "strategy" $a.strategy "dryRun" $a.dryRun }}
{{- $block := include "loadshed.strategyBlock" $a.strategy }}
{{- if $block }}
{{- $_ := set $admission $block (deepCopy (get $a $block)) }}
{{- end }}
{{- if and (eq $a.strategy "codel") (eq (int $a.codel.concurrency) 0) }}
{{- /* codel with concurrency 0 puts the adaptive limit in front of its queue */}}
{{- $_ := set $admission "adaptive" (deepCopy $a.adaptive) }}
{{- end }}
{{- with $a.priorities }}
{{- if or .reserved .reservedFor }}
{{- $_ := set $admission "priorities" (deepCopy .) }}
{{- end }}
{{- end }}
{{- $cfg := dict
  "listen" (printf ":%d" (int $p.port))
  "adminListen" (printf ":%d" (int $p.adminPort))
  "upstream" (default (printf "http://127.0.0.1:%d" (int .Values.app.port)) $p.upstream)
  "upstreamTimeout" $p.upstreamTimeout
  "upstreamProtocol" $p.upstreamProtocol
  "grpc" (deepCopy $p.grpc)
  "preserveHost" $p.preserveHost
  "trustForwardedHeaders" $p.trustForwardedHeaders
  "shutdown" (deepCopy $p.shutdown)
  "server" (deepCopy $p.server)
  "statusCodes" (deepCopy $p.statusCodes)
  "headers" (deepCopy $p.headers)
  "admission" $admission }}
{{- $trust := dict "sources" $p.trust.sources "forwardAdmissionHeaders" $p.trust.forwardAdmissionHeaders }}
{{- with $p.trust.identity }}
{{- $_ := set $trust "identity" (deepCopy .) }}
{{- end }}
{{- $_ := set $cfg "trust" $trust }}
{{- if $p.tls.secretName }}
{{- $_ := set $cfg "tls" (dict "certFile" "/etc/loadshed-tls/tls.crt" "keyFile" "/etc/loadshed-tls/tls.key") }}
{{- end }}
{{- with include "loadshed.clientsConfig" . }}
{{- $_ := set $cfg "clients" (fromYaml .) }}
{{- end }}
{{- if eq (include "loadshed.mode" .) "extproc" }}
{{- /* The external processor of the pod's Envoy only: no data port, no upstream (Envoy forwards). */}}
{{- $_ := set $cfg "listen" "" }}
{{- $_ := unset $cfg "upstream" }}
{{- $_ := set $cfg "extProc" (dict "listen" (printf "127.0.0.1:%d" (int $p.extProc.port)) "messageTimeout" $p.extProc.messageTimeout "maxMessageTimeout" $p.extProc.maxMessageTimeout) }}
{{- end }}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy $p.extraConfig) }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The Go runtime sized from the sidecar's resources: GOMAXPROCS from its CPU limit, rounded up
(the runtime reads a cgroup quota too, but never goes below 2 threads, which a 1-CPU limit then
throttles); LOADSHED_MEMORY_LIMIT from its memory limit, of which the proxy makes 90% its
GOMEMLIMIT (garbage collection works harder near the limit instead of the container being
killed). Without a limit Kubernetes reports the node's allocatable amount.
*/}}
{{- define "loadshed.goRuntimeEnv" -}}
- name: GOMAXPROCS
  valueFrom:
    resourceFieldRef:
      containerName: {{ .Values.proxy.name }}
      resource: limits.cpu
      divisor: "1"
- name: LOADSHED_MEMORY_LIMIT
  valueFrom:
    resourceFieldRef:
      containerName: {{ .Values.proxy.name }}
      resource: limits.memory
{{- end }}

{{/*
Whether the pods share their per-client quotas through a store: "true" or empty.
*/}}
{{- define "loadshed.quotaStore" -}}
{{- $r := .Values.clients.store.redis }}
{{- if and .Values.clients.enabled (or $r.addr $r.addrs) }}true{{ end }}
{{- end }}

{{/*
The quota store's key prefix: the value, or one scoped to the release's namespace and full
name, so that releases sharing one Redis neither share quotas nor count each other's pods
(hashed when longer than the 64 characters the proxy allows).
*/}}
{{- define "loadshed.quotaKeyPrefix" -}}
{{- $r := .Values.clients.store.redis }}
{{- if $r.keyPrefix }}
{{- $r.keyPrefix }}
{{- else }}
{{- $scope := printf "%s/%s" .Release.Namespace (include "loadshed.fullname" .) }}
{{- $prefix := printf "loadshed:%s:" $scope }}
{{- if gt (len $prefix) 64 }}
{{- printf "loadshed:%s:" (sha256sum $scope | trunc 32) }}
{{- else }}
{{- $prefix }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The proxy's clients block (YAML), empty when clients.enabled is false. The store's password
and TLS files come from the Secrets the Deployment mounts.
*/}}
{{- define "loadshed.clientsConfig" -}}
{{- $c := .Values.clients }}
{{- if $c.enabled }}
{{- $clients := dict "rate" $c.rate "burst" $c.burst "maxKeys" $c.maxKeys "allow" $c.allow "deny" $c.deny }}
{{- if include "loadshed.quotaStore" . }}
{{- $r := $c.store.redis }}
{{- if and $r.addr $r.addrs }}
{{- fail "clients.store.redis: give addr (a single node) or addrs (a Cluster, or Sentinels with masterName), not both" }}
{{- end }}
{{- $redis := dict "timeout" $r.timeout "keyPrefix" (include "loadshed.quotaKeyPrefix" .) "poolSize" $r.poolSize "db" $r.db }}
{{- if $r.addr }}
{{- $_ := set $redis "addr" $r.addr }}
{{- else }}
{{- $_ := set $redis "addrs" $r.addrs }}
{{- end }}
{{- with $r.masterName }}
{{- $_ := set $redis "masterName" . }}
{{- end }}
{{- with $r.username }}
{{- $_ := set $redis "username" . }}
{{- end }}
{{- if $r.password.secretName }}
{{- $_ := set $redis "passwordFile" "/etc/loadshed-redis/password" }}
{{- end }}
{{- if $r.tls.enabled }}
{{- $tls := dict }}
{{- with $r.tls.serverName }}
{{- $_ := set $tls "serverName" . }}
{{- end }}
{{- if $r.tls.secretName }}
{{- with $r.tls.caKey }}
{{- $_ := set $tls "caFile" (printf "/etc/loadshed-redis-tls/%s" .) }}
{{- end }}
{{- if or $r.tls.certKey $r.tls.keyKey }}
{{- $_ := set $tls "certFile" (printf "/etc/loadshed-redis-tls/%s" $r.tls.certKey) }}
{{- $_ := set $tls "keyFile" (printf "/etc/loadshed-redis-tls/%s" $r.tls.keyKey) }}
{{- end }}
{{- end }}
{{- $_ := set $redis "tls" $tls }}
{{- end }}
{{- $_ := set $clients "store" (dict "redis" $redis) }}
{{- end }}
{{- toYaml $clients }}
{{- end }}
{{- end }}
