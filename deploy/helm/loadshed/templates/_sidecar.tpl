{{/*
The loadshed sidecar container, as one item of a container list: a regular container, or (when
loadshed.native says so) a native sidecar, an init container with restartPolicy Always.
*/}}
{{- define "loadshed.sidecarContainer" -}}
{{- $extproc := eq (include "loadshed.mode" .) "extproc" }}
{{- $quotaStore := include "loadshed.quotaStore" . }}
{{- $native := include "loadshed.native" . -}}
- name: {{ .Values.proxy.name }}
  image: {{ include "loadshed.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if $native }}
  # A native sidecar: it starts, and passes its startup probe, before the application's
  # containers start, and gets SIGTERM only after they have exited.
  restartPolicy: Always
  {{- end }}
  args:
    - --config
    - /etc/loadshed/config.yaml
    {{- with .Values.proxy.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    {{- if not $extproc }}
    - name: http
      containerPort: {{ .Values.proxy.port }}
      protocol: TCP
    {{- end }}
    - name: admin
      containerPort: {{ .Values.proxy.adminPort }}
      protocol: TCP
  env:
    # Names this pod among the replicas that share the quota store (clients.store).
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- if include "loadshed.drainHook" . }}
    # What the application's drain hook must present to GET /drain (without it: 403).
    - name: LOADSHED_DRAIN_TOKEN
      value: {{ include "loadshed.drainToken" . | quote }}
    {{- end }}
    {{- if .Values.proxy.goRuntimeFromResources }}
    {{- include "loadshed.goRuntimeEnv" . | nindent 4 }}
    {{- end }}
    {{- with .Values.proxy.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if $native }}
  {{- with .Values.proxy.startupProbe }}
  startupProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- with .Values.proxy.livenessProbe }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.proxy.readinessProbe }}
  readinessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml .Values.proxy.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.proxy.securityContext | nindent 4 }}
  volumeMounts:
    # A directory mount (not subPath), so an updated ConfigMap reaches the file.
    - name: config
      mountPath: /etc/loadshed
      readOnly: true
    {{- if .Values.proxy.tls.secretName }}
    # A directory mount, so a rotated Secret reaches the files; the sidecar reads them again.
    - name: tls
      mountPath: /etc/loadshed-tls
      readOnly: true
    {{- end }}
    {{- if .Values.proxy.cohorts.secretName }}
    # The cohort secret the call graph's sidecars share, read at start and at every reload.
    - name: cohort-secret
      mountPath: /etc/loadshed-cohort
      readOnly: true
    {{- end }}
    {{- if $quotaStore }}
    {{- if .Values.clients.store.redis.password.secretName }}
    # The quota store's password, read at every new connection (a rotated Secret is used).
    - name: redis-password
      mountPath: /etc/loadshed-redis
      readOnly: true
    {{- end }}
    {{- if and .Values.clients.store.redis.tls.enabled .Values.clients.store.redis.tls.secretName }}
    - name: redis-tls
      mountPath: /etc/loadshed-redis-tls
      readOnly: true
    {{- end }}
    {{- end }}
{{- end }}
