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
The application image reference: app.image as the user wrote it (no tag: the repository alone,
which the runtime reads as :latest), or the loadshed image (the demo backend).
*/}}
{{- define "loadshed.appImage" -}}
{{- if .Values.app.image.repository }}
{{- .Values.app.image.repository }}{{ with .Values.app.image.tag }}:{{ . }}{{ end }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default (include "loadshed.imageTag" .) .Values.app.image.tag) }}
{{- end }}
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
Whether the sidecar runs as a native sidecar (an init container with restartPolicy Always):
"true" or empty. proxy.native auto means from Kubernetes 1.33, the first version that puts a
native sidecar's named ports into EndpointSlices (kubernetes#128850); the constraint takes
pre-release and vendor versions such as v1.33.1-eks-1234 too.
*/}}
{{- define "loadshed.native" -}}
{{- $n := toString .Values.proxy.native }}
{{- if eq $n "auto" }}
{{- if semverCompare ">=1.33.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- else if eq $n "true" }}true
{{- else if ne $n "false" }}
{{- fail (printf "proxy.native: %q is not one of auto, true, false" $n) }}
{{- end }}
{{- end }}

{{/*
Seconds the sidecar may need to stop after SIGTERM as a regular container: drainDelay +
gracePeriod, rounded up.
*/}}
{{- define "loadshed.drainSeconds" -}}
{{- $drain := include "loadshed.durationSeconds" .Values.proxy.shutdown.drainDelay | float64 }}
{{- $grace := include "loadshed.durationSeconds" .Values.proxy.shutdown.gracePeriod | float64 }}
{{- addf $drain $grace | ceil | int }}
{{- end }}

{{/*
terminationGracePeriodSeconds: what the shutdown needs, or the configured value when it is at
least that. A regular sidecar drains beside the application: drainDelay + gracePeriod (rounded
up) + the margin for the application's own shutdown. A native sidecar gets SIGTERM only after
the application has exited: the application's preStop hook (the drain), then its own shutdown
(the margin), then the sidecar's gracePeriod (rounded up), as cmd/inject computes it.
*/}}
{{- define "loadshed.terminationGracePeriodSeconds" -}}
{{- $margin := .Values.terminationGraceMarginSeconds | int }}
{{- $need := add (include "loadshed.drainSeconds" . | int) $margin }}
{{- $sum := "proxy.shutdown.drainDelay + proxy.shutdown.gracePeriod + terminationGraceMarginSeconds" }}
{{- $why := "pods would be killed before the sidecar drains" }}
{{- if include "loadshed.native" . }}
{{- $grace := include "loadshed.durationSeconds" .Values.proxy.shutdown.gracePeriod | float64 | ceil | int }}
{{- $need = add (include "loadshed.appShutdownDelaySeconds" . | int) $margin $grace }}
{{- $sum = "app.shutdownDelaySeconds (default proxy.shutdown.drainDelay) + terminationGraceMarginSeconds + proxy.shutdown.gracePeriod" }}
{{- $why = "the native sidecar stops only after the application has exited, and pods would be killed before it has finished" }}
{{- end }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- $need }}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (int $need) }}
{{- fail (printf "terminationGracePeriodSeconds: %v is shorter than %s = %d seconds; %s" .Values.terminationGracePeriodSeconds $sum $need $why) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
Seconds the application keeps running after the pod is told to stop (its preStop hook):
app.shutdownDelaySeconds, else as a regular sidecar drainDelay + gracePeriod (it serves what
the draining sidecar still forwards), as a native sidecar drainDelay (the drain itself: the
sidecar stops after the application), rounded up.
*/}}
{{- define "loadshed.appShutdownDelaySeconds" -}}
{{- if not (kindIs "invalid" .Values.app.shutdownDelaySeconds) }}
{{- int .Values.app.shutdownDelaySeconds }}
{{- else if include "loadshed.native" . }}
{{- include "loadshed.durationSeconds" .Values.proxy.shutdown.drainDelay | float64 | ceil | int }}
{{- else }}
{{- include "loadshed.drainSeconds" . }}
{{- end }}
{{- end }}

{{/*
The delay of the native sidecar's drain hook (the application's preStop GET /drain?delay=, on
the admin port), query-escaped: app.shutdownDelaySeconds in seconds when set, else
proxy.shutdown.drainDelay as written (a Go duration, which the sidecar parses). The sidecar takes
at most 10m.
*/}}
{{- define "loadshed.drainHookDelay" -}}
{{- $seconds := include "loadshed.appShutdownDelaySeconds" . | int }}
{{- if gt $seconds 600 }}
{{- fail (printf "app.shutdownDelaySeconds (default proxy.shutdown.drainDelay): %d seconds is more than the 10m the native sidecar's drain hook (GET /drain?delay=) accepts" $seconds) }}
{{- end }}
{{- if kindIs "invalid" .Values.app.shutdownDelaySeconds }}
{{- toString .Values.proxy.shutdown.drainDelay | urlquery }}
{{- else }}
{{- printf "%ds" $seconds }}
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
{{- with $p.cohorts }}
{{- if .secretName }}
{{- /* The shared secret is mounted at /etc/loadshed-cohort (templates/_sidecar.tpl). */}}
{{- $_ := set $admission "cohorts" (mustMergeOverwrite (deepCopy (.settings | default dict)) (dict "secretFile" "/etc/loadshed-cohort/key")) }}
{{- end }}
{{- end }}
{{- /* A native sidecar gets SIGTERM only after the application has drained (its preStop hook) and exited. */}}
{{- $shutdown := deepCopy $p.shutdown }}
{{- if include "loadshed.native" . }}
{{- $_ := set $shutdown "drainDelay" "0s" }}
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
  "shutdown" $shutdown
  "server" (deepCopy $p.server)
  "statusCodes" (deepCopy $p.statusCodes)
  "headers" (deepCopy $p.headers)
  "admission" $admission }}
{{- $trust := dict "sources" $p.trust.sources "forwardAdmissionHeaders" $p.trust.forwardAdmissionHeaders }}
{{- with $p.trust.identity }}
{{- $_ := set $trust "identity" (deepCopy .) }}
{{- end }}
{{- $_ := set $cfg "trust" $trust }}
{{- with $p.loadReports }}
{{- if .orca }}
{{- if eq $a.strategy "none" }}
{{- fail "proxy.loadReports.orca: needs an admission strategy with a capacity to report against; admission.strategy is none (choose one, or turn the reports off)" }}
{{- end }}
{{- if lt (include "loadshed.durationSeconds" .minInterval | float64) 1.0 }}
{{- fail (printf "proxy.loadReports.minInterval: %s is shorter than 1s" (toString .minInterval)) }}
{{- end }}
{{- $_ := set $cfg "loadReports" (dict "orca" true "trustedOnly" .trustedOnly "minInterval" .minInterval) }}
{{- end }}
{{- end }}
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

{{/*
"true" when the application's preStop hook is the native sidecar's drain (GET /drain on the
admin port), which must present the pod's drain token; empty otherwise.
*/}}
{{- define "loadshed.drainHook" -}}
{{- if and (include "loadshed.native" .) (ne (include "loadshed.mode" .) "extproc") (gt (include "loadshed.appShutdownDelaySeconds" . | int) 0) }}true{{ end }}
{{- end }}

{{/*
The drain token GET /drain requires (the sidecar's LOADSHED_DRAIN_TOKEN, presented by the drain
hook): proxy.drainToken when set; else the one the release's Deployment already holds, so an
upgrade does not change it for nothing; else a new random one. Computed once per rendering.
*/}}
{{- define "loadshed.drainToken" -}}
{{- if not (hasKey .Values "loadshedDrainToken") }}
{{- $token := .Values.proxy.drainToken }}
{{- if not $token }}
{{- $d := lookup "apps/v1" "Deployment" .Release.Namespace (include "loadshed.fullname" .) }}
{{- $podSpec := dig "spec" "template" "spec" dict $d }}
{{- range concat (dig "initContainers" list $podSpec) (dig "containers" list $podSpec) }}
{{- if eq (dig "name" "" .) $.Values.proxy.name }}
{{- range (dig "env" list .) }}
{{- if eq (dig "name" "" .) "LOADSHED_DRAIN_TOKEN" }}
{{- $token = dig "value" "" . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $token }}
{{- $token = randAlphaNum 32 }}
{{- end }}
{{- $_ := set .Values "loadshedDrainToken" $token }}
{{- end }}
{{- index .Values "loadshedDrainToken" }}
{{- end }}

{{/*
The port the Service sends traffic to: the sidecar's data port, in mode extproc the Envoy's or
the application's.
*/}}
{{- define "loadshed.dataPort" -}}
{{- if ne (include "loadshed.mode" .) "extproc" }}
{{- .Values.proxy.port }}
{{- else if .Values.envoy.enabled }}
{{- .Values.envoy.port }}
{{- else }}
{{- .Values.app.port }}
{{- end }}
{{- end }}
